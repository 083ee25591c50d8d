"""How a rule hands its config to its command, the same way everywhere (workflow/rules/common.smk): the run options
(`run_options`, with `--gpu-lease` on a machine of several GPUs), a stage's config section as JSON (`section_json`),
the params stamp each rule takes as an input (`stamp`), how a learner job is launched (`launcher`: torchrun with more
than one GPU a job, `stage_gpus`) and placed (`gpu_slots`, `learner_gpu_slots`; on Slurm `slurm_gres`), and the
files besides the DAG's outputs that the report reads (`report_extras`). What the config means and its checks are
experiment.py's.

Params stamps (`stamp`): every rule takes, as an input, `results/<exp>/params/<rule>.json` — the values of
everything in the config that changes its outputs (its params and the input paths the config names), written
when the DAG is parsed and only when they changed. A changed parameter or input path thus makes that file newer
than the rule's outputs, and Snakemake reruns the rule and what it feeds by modification time alone: also where
it has no provenance records (a fresh clone's committed results, a deleted .snakemake/), where its own params /
input triggers cannot see a change. A dry run writes the stamps of the config it is given, too (a later run of
the previous config then reruns those rules once).

The Snakefile imports this module: it imports nothing heavy.
"""
from __future__ import annotations

import json
from pathlib import Path


def stamp(results: str, rule: str, *values) -> str:
    """`results/params/<rule>.json` holding `values` (JSON-able), rewritten only when they differ: the rule's
    params stamp (module docstring). Returns its path, the rule's input."""
    path = Path(results) / "params" / f"{rule}.json"
    values = [json.loads(v) if isinstance(v, str) and v[:1] in "{[" else v for v in values]  # section_json's
    text = json.dumps({"rule": rule, "values": values}, indent=1, sort_keys=True) + "\n"
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return str(path)


def report_extras(results: str) -> list[str]:
    """Files the report reads besides the DAG's outputs, those present: the committed real-vLLM measurement and
    this experiment's real-TE results (te/) — inputs of the report rule, so a new measurement rewrites it."""
    root = Path(results)
    files = [root.parent / "vllm-cpu" / "vllm_peer" / name for name in ("summary.md", "ratios.json")]
    files += sorted((root / "te").rglob("*.json"))
    return [str(f) for f in files if f.is_file()]


def section_json(config: dict, section: str, drop=()) -> str:
    """A stage's config section as the JSON its command takes with --config-json (DAG-only keys dropped; keys
    sorted, so reordering the YAML changes no rule's params)."""
    return json.dumps({k: v for k, v in config.get(section, {}).items() if k not in drop}, sort_keys=True)


def stage_gpus(config: dict, stage: str) -> int:
    """GPUs of one job of `stage` (throughput | rl): the section's own `gpus_per_job`, else the top-level one."""
    own = config.get(stage, {}).get("gpus_per_job")
    return config.get("gpus_per_job", 1) if own is None else own


def launcher(config: dict, stage: str) -> str:
    """How a learner job of `stage` starts `minite`: itself with one GPU per job, torchrun with more (one rank a
    GPU of the job's node; `--standalone`: a rendezvous on the node, as Slurm places the job on one)."""
    n = stage_gpus(config, stage)
    return "minite" if n == 1 else f"torchrun --standalone --nproc-per-node {n} -m minite_core.cli"


def slurm_gres(config: dict, stage: str) -> str:
    """The Slurm GPUs of a learner job of `stage` (workflow/profiles/slurm reads the rule's `gres`): its GPUs, of
    one node, on CUDA; none on CPU."""
    return f"gpu:{stage_gpus(config, stage)}" if config["device"] == "cuda" else ""


def learner_gpu_slots(config: dict, stage: str) -> int:
    """Local GPU slots of a learner job of `stage`: one, as `gpu_slots`, with one GPU per job; with more the whole
    local pool (torchrun holds every GPU of the node it is given). On Slurm its GPUs come from `gres`."""
    return gpu_slots(config) if stage_gpus(config, stage) == 1 else config["gpu_slots"]


def gpu_slots(config: dict) -> int:
    """GPU slots of a small GPU job: one of the machine's `gpu_slots` on CUDA, none on CPU."""
    return 1 if config["device"] == "cuda" else 0


def input_path(config: dict, section: str, key: str, default):
    """A config path that names a rule input (`diagnostics.checkpoint`), or the DAG's own file when null."""
    return config[section][key] or default


def run_options(config: dict, *, compute: bool = True, seed: int | None = None) -> str:
    """The run options of a stage command (runs.cli.add_common_args), from the top-level keys (the execution's:
    runs.execution); `seed` overrides config `seed` (an RL run's own seed); compute=False: only --experiment /
    --seed (`minite data` runs no model)."""
    opts = f"--experiment {config['experiment']} --seed {config['seed'] if seed is None else seed}"
    if compute:
        opts += f" --device {config['device']} --kernels {config['kernels']}"
        opts += f" --sampler-engine {config.get('sampler_engine', 'auto')}"
        gpus = config.get("gpus", 1)
        if gpus > 1 and config["device"] == "cuda":  # one of the machine's GPUs a job (runs/gpu_lease.py)
            opts += f" --gpu-lease {gpus}x{max(1, config.get('gpu_slots', gpus) // gpus)}"
    return opts
