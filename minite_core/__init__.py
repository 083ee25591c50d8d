"""miniTE reproduction harness: bit-exact NVFP4 numerics, execution profiles, learner/sampler engines,
mismatch diagnostics and NVFP4 RL, driven by a Snakemake DAG (see DESIGN notes in each subpackage)."""

__version__ = "0.1.0"
