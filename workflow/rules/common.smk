# Shared helpers for the rules: paths and config lookups.


def cfg(*keys):
    """config lookup by path, e.g. cfg("quant_error", "rows")."""
    node = config
    for key in keys:
        node = node[key]
    return node


def kernels_env():
    """`MINITE_KERNELS=<backend> ` for the shell of GPU stages when config `kernels` pins one (auto = dispatch's
    choice: native on sm_100+, triton on other GPUs, reference on CPU)."""
    backend = config.get("kernels", "auto")
    return "" if backend == "auto" else f"MINITE_KERNELS={backend} "


KERNELS_ENV = kernels_env()


def sampler_env():
    """`MINITE_SAMPLER=<engine> ` when config `sampler_engine` pins the rollout engine of the rl / diagnostics /
    eval / pretrain stages (auto = engines.make_sampler's choice: fast CUDA-graph sampler on the GPU, reference
    on CPU)."""
    engine = config.get("sampler_engine", "auto")
    return "" if engine == "auto" else f"MINITE_SAMPLER={engine} "


KERNELS_ENV += sampler_env()  # the stages' engine environment: kernel backend and sampler engine
