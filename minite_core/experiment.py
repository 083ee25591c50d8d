"""An experiment config (experiments/*.yaml) checked when the DAG is parsed, so `snakemake -n` rejects what would
otherwise fail only when a job runs, after the jobs upstream of it spent their time.

Two passes, each error one line naming the key path (`config: rl.runs[1].learner: ...`):
1. the JSON schema (workflow/schemas/config.schema.yaml), error by error — not snakemake's `validate`, whose
   message prints the whole schema for a misspelled top-level key;
2. semantic checks the schema cannot express: profile names exist (and a learner profile has a backward), the
   model shape is one the model and the NVFP4 GEMMs accept (GQA divides the heads, K dims are multiples of 16,
   top-k <= experts), divisibility (`rl.mini_batches`, `quant_error.rows` with 16x16 blocks), enough task
   prompts for what the stages ask, no two RL runs with one name, eval runs that exist, `gpus_per_job` ranks
   that split the throughput bench's experts (expert parallelism) and the RL stage's mini-batches and experts,
   `gpu_slots` that split over `gpus`.
Also the rules' shared helpers: the RL runs of the config, a stage's config section as JSON, the run options
(`run_options`, with `--gpu-lease` on a machine of several GPUs), and how a learner job is launched
(`launcher`: torchrun with more than one GPU a job, `stage_gpus`) and placed on Slurm (`slurm_gres`).

This module is imported by the Snakefile, so it imports nothing heavy (no model, no kernels).
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import jsonschema
import yaml

from minite_core.profiles import PROFILES
from minite_core.rl.grpo import parse_correction, run_name
from minite_core.task.arithmetic import LEVEL_INDEX, prompt_space_size

BENCH_CONFIGS = ("tiny", "h200")  # bench.learner.CONFIGS (named here: importing the bench loads the model)
BENCH_EXPERTS = {"tiny": 4, "h200": 128}  # their models' num_experts (a test checks these against the bench)


def schema_errors(config: dict, schema_path: str | Path) -> list[str]:
    """One line per schema violation: `config: <key path>: <reason>`."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    out = []
    for err in sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path))):
        path = _path(err.absolute_path)
        message = err.message if len(err.message) < 300 else err.message[:300] + "..."
        out.append(f"config: {path + ': ' if path else ''}{message}")
    return out


def _path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def rl_runs(config: dict) -> dict[str, dict]:
    """{run name: {"learner", "sampler", "correction", "seed"}} from config `rl.runs` (dicts or
    "l:s[:correction]"). An entry's `seed` (default: the experiment's) is its run seed; one other than the
    experiment's adds `__s<seed>` to the name, so seeds of one pair get distinct, readable directories."""
    runs = {}
    base_seed = config.get("seed", 0)
    for entry in config.get("rl", {}).get("runs", []):
        if isinstance(entry, str):
            learner, sampler, *rest = entry.split(":")
            entry = {"learner": learner, "sampler": sampler, "correction": rest[0] if rest else "none"}
        seed = entry.get("seed", base_seed)
        spec = {"learner": entry["learner"], "sampler": entry["sampler"],
                "correction": parse_correction(entry.get("correction")) or "none", "seed": seed}
        runs[run_name(spec["learner"], spec["sampler"], spec["correction"],
                      None if seed == base_seed else seed)] = spec
    return runs


def section_json(config: dict, section: str, drop=()) -> str:
    """A stage's config section as the JSON its command takes with --config-json (DAG-only keys dropped)."""
    return json.dumps({k: v for k, v in config.get(section, {}).items() if k not in drop})


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


def run_options(config: dict, *, kernels: str | None = None, compute: bool = True, seed: int | None = None) -> str:
    """The run options of a stage command (runs.cli.add_common_args), from the top-level keys; `kernels`
    overrides config `kernels`, `seed` config `seed` (an RL run's own seed); compute=False: only --experiment /
    --seed (`minite data` runs no model)."""
    opts = f"--experiment {config['experiment']} --seed {config['seed'] if seed is None else seed}"
    if compute:
        opts += f" --device {config['device']} --kernels {kernels or config['kernels']}"
        opts += f" --sampler-engine {config.get('sampler_engine', 'auto')}"
        gpus = config.get("gpus", 1)
        if gpus > 1 and config["device"] == "cuda":  # one of the machine's GPUs a job (runs/gpu_lease.py)
            opts += f" --gpu-lease {gpus}x{max(1, config.get('gpu_slots', gpus) // gpus)}"
    return opts


# ---- semantic checks -----------------------------------------------------------------------------------------
def _profile(errors, path, name, *, learner=False):
    p = PROFILES.get(name)
    if p is None:
        errors.append(f"config: {path}: unknown profile {name!r}; registered: {', '.join(sorted(PROFILES))}")
    elif learner and p.quantized and p.grad is None:
        errors.append(f"config: {path}: profile {name!r} has no backward (grad=None): it cannot be a learner")


def _te_mode(errors, path, name):
    """A real-TE learner `te:<mode>` (bench/learner.py rows, diagnostics pairs): the mode must be a TE mode."""
    from minite_core.peers.te_learner import MODES, learner_mode

    if learner_mode(name) not in MODES:
        errors.append(f"config: {path}: unknown TE mode {learner_mode(name)!r}; one of {', '.join(sorted(MODES))}")


def _vllm_mode(errors, path, name):
    """A real-vLLM sampler `vllm:<mode>` (RL runs): the mode must be a vLLM mode."""
    from minite_core.peers.vllm_rollout import MODES, sampler_mode

    if sampler_mode(name) not in MODES:
        errors.append(f"config: {path}: unknown vLLM mode {sampler_mode(name)!r}; one of {', '.join(sorted(MODES))}")


def _pair(errors, path, spec, *, te_learner=True):
    learner_name, _, sampler_name = spec.rpartition(":")  # sampler names never contain ":"; `te:<mode>` may
    if te_learner and learner_name.startswith("te:"):  # peers.te_learner.LEARNER_PREFIX
        _te_mode(errors, path, learner_name)
    else:
        _profile(errors, path, learner_name)
    _profile(errors, path, sampler_name)


def _check_profiles(config, errors):
    for i, entry in enumerate(config.get("rl", {}).get("runs", [])):
        if isinstance(entry, str):
            parts = entry.split(":")
            entry = {"learner": parts[0], "sampler": parts[1] if len(parts) > 1 else ""}
        learner, sampler = entry.get("learner"), entry.get("sampler")
        if isinstance(learner, str) and learner.startswith("te:"):  # real TE (peers.te_learner)
            _te_mode(errors, f"rl.runs[{i}].learner", learner)
        else:
            _profile(errors, f"rl.runs[{i}].learner", learner, learner=True)
        if isinstance(sampler, str) and sampler.startswith("vllm:"):  # real vLLM (peers.vllm_rollout)
            _vllm_mode(errors, f"rl.runs[{i}].sampler", sampler)
        else:
            _profile(errors, f"rl.runs[{i}].sampler", sampler)
    d = config.get("diagnostics", {})
    for i, pair in enumerate(d.get("pairs", [])):
        _pair(errors, f"diagnostics.pairs[{i}]", pair)
    if "attribution_base" in d:  # the knobs are our profiles': no te:* base
        _pair(errors, "diagnostics.attribution_base", d["attribution_base"], te_learner=False)
    for key in ("throughput", "eval"):
        for i, name in enumerate(config.get(key, {}).get("profiles", [])):
            if key == "throughput" and name.startswith("te:"):  # a real-TE row (bench/learner.py)
                _te_mode(errors, f"{key}.profiles[{i}]", name)
                continue
            _profile(errors, f"{key}.profiles[{i}]", name, learner=key == "throughput")
    if "profile" in config.get("pretrain", {}):
        _profile(errors, "pretrain.profile", config["pretrain"]["profile"], learner=True)


def _check_model(config, errors):
    p = config["pretrain"]
    if p["num_attention_heads"] % p["num_key_value_heads"]:
        errors.append(f"config: pretrain.num_key_value_heads: {p['num_key_value_heads']} does not divide "
                      f"num_attention_heads={p['num_attention_heads']} (GQA groups query heads evenly)")
    if p["head_dim"] % 2:
        errors.append(f"config: pretrain.head_dim: {p['head_dim']} must be even (RoPE rotates pairs)")
    if (p["num_attention_heads"] * p["head_dim"]) % 16:
        errors.append(f"config: pretrain.head_dim: num_attention_heads * head_dim = "
                      f"{p['num_attention_heads'] * p['head_dim']} must be a multiple of 16 (o_proj's NVFP4 K)")
    if p["num_experts_per_tok"] > p["num_experts"]:
        errors.append(f"config: pretrain.num_experts_per_tok: {p['num_experts_per_tok']} > num_experts="
                      f"{p['num_experts']}")
    lo, hi = p["target_accuracy"]
    if lo > hi:
        errors.append(f"config: pretrain.target_accuracy: low {lo} > high {hi}")


def _check_rl_ranks(config, per_batch: int, errors):
    """gpus_per_job > 1 runs `minite rl` on that many ranks (rl/distributed.py): the rows of a mini-batch split
    evenly, an NVFP4-backward learner gets 16 rows a rank (its wgrad's 16-token blocks), the experts split."""
    g = stage_gpus(config, "rl")
    runs = rl_runs(config) if g > 1 else {}
    if not runs:
        return
    if per_batch % g:
        errors.append(f"config: gpus_per_job: {g} ranks do not split rl's {per_batch} rows per mini-batch "
                      "(prompts_per_step * group_size / mini_batches)")
        return
    for name, spec in runs.items():
        p = PROFILES.get(spec["learner"])
        if p is not None and p.quantized and p.grad is not None and (per_batch // g) % 16:
            errors.append(f"config: gpus_per_job: rl run {name} on {g} ranks has {per_batch // g} rows per rank "
                          "and mini-batch; its NVFP4 learner needs a multiple of 16 (raise rl.prompts_per_step "
                          "or group_size)")
            break
    experts = config.get("pretrain", {}).get("num_experts", 0)
    if experts % g:
        errors.append(f"config: gpus_per_job: {g} ranks do not split the {experts} experts of the RL model "
                      "(pretrain.num_experts; expert parallelism)")


def _check_sizes(config, errors):
    rl = config["rl"]
    n = rl["prompts_per_step"] * rl["group_size"]
    if n % rl["mini_batches"]:
        errors.append(f"config: rl.mini_batches: {rl['mini_batches']} does not divide prompts_per_step * "
                      f"group_size = {n}")
    _check_rl_ranks(config, n // rl["mini_batches"], errors)
    rows = config["quant_error"]["rows"]
    if rows % 16:
        errors.append(f"config: quant_error.rows: {rows} is not a multiple of 16 (the survey includes 16x16 blocks)")
    data = config["data"]
    for level in data["levels"]:
        need = data["n_train_per_level"] + data["n_heldout_per_level"]
        if level in LEVEL_INDEX and need > prompt_space_size(level):
            errors.append(f"config: data.n_train_per_level: level {level} has {prompt_space_size(level)} distinct "
                          f"prompts, train + held-out ask for {need}")
    d = config["diagnostics"]
    heldout = data["n_heldout_per_level"] * len(data["levels"])
    if rl["eval_n"] > heldout:
        errors.append(f"config: rl.eval_n: {rl['eval_n']} held-out problems per evaluation > the {heldout} of the "
                      "data stage (data.n_heldout_per_level x levels)")
    n, bench = stage_gpus(config, "throughput"), config.get("throughput", {}).get("config", "tiny")
    if n > 1 and BENCH_EXPERTS.get(bench, n) % n:
        errors.append(f"config: gpus_per_job: {n} ranks do not split the {BENCH_EXPERTS[bench]} experts of "
                      f"throughput.config {bench!r} (expert parallelism); use a divisor of {BENCH_EXPERTS[bench]}")
    if not d["prompts"] and d["num_prompts"] > heldout:
        errors.append(f"config: diagnostics.num_prompts: {d['num_prompts']} > the {heldout} held-out prompts of "
                      "the data stage")


def _check_gpus(config, errors):
    """`gpus: G` spreads the jobs over G GPUs, gpu_slots / G a GPU; a torchrun job's ranks are G of them at most."""
    g = config.get("gpus", 1)
    if g == 1:
        return
    if config["gpu_slots"] % g:
        errors.append(f"config: gpu_slots: {config['gpu_slots']} slots do not split over gpus: {g} "
                      f"(the same number of jobs on every GPU); use a multiple of {g}")
    for stage in ("throughput", "rl"):
        if (n := stage_gpus(config, stage)) > g:
            errors.append(f"config: {stage}.gpus_per_job: {n} GPUs for one job, the machine has gpus: {g}")


def _check_runs(config, errors):
    names = {}
    for i, entry in enumerate(config.get("rl", {}).get("runs", [])):
        try:
            name = next(iter(rl_runs({"seed": config.get("seed", 0), "rl": {"runs": [entry]}})))
        except (ValueError, KeyError, StopIteration) as e:
            errors.append(f"config: rl.runs[{i}]: {e}")
            continue
        if name in names:
            errors.append(f"config: rl.runs[{i}]: run {name} is also rl.runs[{names[name]}] (one name, one run)")
        names.setdefault(name, i)
    for i, name in enumerate(config.get("eval", {}).get("runs", [])):
        if name not in names:
            errors.append(f"config: eval.runs[{i}]: {name!r} is not a run of rl.runs ({', '.join(names) or 'none'})")
    bench = config.get("throughput", {}).get("config")
    if bench is not None and bench not in BENCH_CONFIGS and not Path(bench).is_file():
        errors.append(f"config: throughput.config: {bench!r} is neither {' nor '.join(BENCH_CONFIGS)} nor a JSON file")


def external_pairs(config: dict) -> list[dict]:
    """`diagnostics.external` with each entry's log resolved: {"name", "path", "format", "ceilings", "input"} (input:
    the file the DAG waits for: the path itself, or for `rl_run` that RL run's summary.json, written after its
    rollouts/ dump)."""
    out = []
    for e in config.get("diagnostics", {}).get("external", []):
        run = e.get("rl_run")
        rl_dir = f"results/{config['experiment']}/rl/{run}"
        out.append({"name": e["name"], "format": "nemo-rl" if run else e.get("format", "auto"),
                    "ceilings": e.get("ceilings", {}), "path": f"{rl_dir}/rollouts" if run else e["path"],
                    "input": f"{rl_dir}/summary.json" if run else e["path"]})
    return out


def external_args(config: dict) -> str:
    """The `minite diagnose --rollouts ...` arguments of `diagnostics.external` (one group per entry)."""
    args = []
    for e in external_pairs(config):
        args += ["--rollouts", e["path"], "--name", e["name"], "--format", e["format"]]
        args += [f"--ceiling={e['name']}:{metric}={limit}" for metric, limit in e["ceilings"].items()]
    return " ".join(shlex.quote(a) for a in args)


def _check_external(config, errors):
    """External rollout logs: names unique, an rl_run that exists and dumps its rollouts, a path that exists (or
    that this experiment's DAG writes), ceilings on metrics the report has."""
    from minite_core.engines import framework_metrics as fw, mismatch

    known = {f"mismatch/{k}" for k in mismatch.KEYS + (mismatch.KL_KEY,)} | set(fw.KEYS) | set(fw.METRIC_ALIASES)
    rl, names = config.get("rl", {}), set()
    for i, e in enumerate(config.get("diagnostics", {}).get("external", [])):
        where = f"config: diagnostics.external[{i}]"
        if e["name"] in names:
            errors.append(f"{where}.name: {e['name']!r} names two external logs (one name, one pair)")
        names.add(e["name"])
        if "rl_run" in e:
            runs = rl_runs(config)
            if e["rl_run"] not in runs:
                errors.append(f"{where}.rl_run: {e['rl_run']!r} is not a run of rl.runs ({', '.join(runs) or 'none'})")
            dump = rl.get("rollout_dump_every", 0)
            if not dump or dump > rl.get("steps", 0):
                errors.append(f"{where}.rl_run: the run dumps no rollouts: set rl.rollout_dump_every to 1..rl.steps "
                              f"(now {dump})")
            if e.get("format", "auto") not in ("auto", "nemo-rl"):
                errors.append(f"{where}.format: an RL run's dump is in the nemo-rl layout, not {e['format']}")
        elif not (Path(e["path"]).exists() or e["path"].startswith(f"results/{config['experiment']}/")):
            errors.append(f"{where}.path: {e['path']} does not exist (a rollout log file or directory)")
        for metric in e.get("ceilings", {}):
            if metric not in known:
                errors.append(f"{where}.ceilings: unknown metric {metric!r} (e.g. gen_kl_error, k3, mismatch_k3_kl, "
                              "rollout_corr/kl, mismatch/chi2)")


def semantic_errors(config: dict) -> list[str]:
    """One line per semantic error (module docstring) of a schema-valid config with its defaults filled in
    (snakemake's `validate(config, schema)` fills them); [] when the config is runnable."""
    errors: list[str] = []
    for check in (_check_profiles, _check_model, _check_sizes, _check_gpus, _check_runs, _check_external):
        check(config, errors)
    return errors


def check_schema(config: dict, schema_path: str | Path) -> None:
    """SystemExit with one line per schema error (the Snakefile then fills defaults and runs `check_semantics`)."""
    _exit(schema_errors(config, schema_path))


def check_semantics(config: dict) -> None:
    _exit(semantic_errors(config))


def _exit(errors: list[str]) -> None:
    if errors:
        raise SystemExit("invalid experiment config:\n" + "\n".join(errors))
