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
   `gpu_slots` that split over `gpus`; with your own model (`model.path`): a Qwen3 checkpoint directory whose
   shapes the NVFP4 GEMMs take, your math data files (`data.train` / `data.heldout`) present and large enough,
   a response budget, lm-eval task files present with their fields (eval/local_tasks.py); model presets and
   scale sizes that exist, holds that name runs and sizes of the config.
Also what the rules read of the config: the RL runs (`rl_runs`), the SFT config of the RL base model or of one
size of the scale sweep (`pretrain_section`), what the kernels check reads (`kernel_check_config`), the external
rollout logs (`external_pairs`). How a rule hands it to its command is rule_args.py's.

This module is imported by the Snakefile, so it imports nothing heavy (no model, no kernels).
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import yaml

from minite_core.model.config import PRESETS, SHAPE_FIELDS
from minite_core.profiles import PROFILES, experiment_profiles
from minite_core.rl.grpo import parse_correction, run_name
from minite_core.rule_args import stage_gpus
from minite_core.task.arithmetic import LEVEL_INDEX, prompt_space_size

BENCH_CONFIGS = ("tiny", "h200")  # bench.learner.CONFIGS (named here: importing the bench loads the model)
BENCH_EXPERTS = {"tiny": 4, "h200": 128}  # their models' num_experts (a test checks these against the bench)


def schema_errors(config: dict, schema_path: str | Path) -> list[str]:
    """One line per schema violation: `config: <key path>: <reason>`."""
    import jsonschema  # here, not at the top: the H200 scripts read configs (pretrain_section) without it

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


KERNEL_SHAPE_KEYS = ("hidden_size", "moe_intermediate_size", "num_experts", "num_experts_per_tok")


def kernel_check_config(config: dict) -> dict:
    """What `minite kernels` reads of the experiment config (bench/kernel_check.py): the profiles it runs and the
    model's GEMM shapes — so that another lr or RL run of the same profiles does not recheck every kernel and
    rerun every stage behind the check."""
    pretrain = pretrain_section(config)  # the RL base model's shape (pretrain.size resolved)
    return {"throughput": {"profiles": experiment_profiles(config)},
            "pretrain": {k: pretrain[k] for k in KERNEL_SHAPE_KEYS if k in pretrain}}


def pretrain_section(config: dict, size: str | None = None) -> dict:
    """The PretrainConfig fields (`minite pretrain --config-json`) of size `size` of the scale sweep, or (None) of
    the RL base model: `pretrain.size` when set, else the `pretrain:` section itself. A size's entry
    (`scale.sizes.<size>`: its shape, as a preset or fields, and its own settings such as lr) goes over the
    `pretrain:` section, so the RL base model of `pretrain.size` is the sweep's SFT of that size, recipe for
    recipe. A preset is written out into its shape fields, for the config checks to see the shape."""
    section = {k: v for k, v in (config.get("pretrain") or {}).items() if k != "size"}
    size = size or (config.get("pretrain") or {}).get("size")
    if size:
        entry = ((config.get("scale") or {}).get("sizes") or {}).get(size)
        if entry is None:
            raise ValueError(f"config: pretrain.size: {size!r} is not a size of scale.sizes")
        if any(k in entry for k in (*SHAPE_FIELDS, "preset")):  # the entry's shape, not the section's preset
            section.pop("preset", None)
        section |= entry
    preset = PRESETS.get(section.get("preset") or "")
    return section | ({f: getattr(preset, f) for f in SHAPE_FIELDS} if preset else {})


def scale_sizes(config: dict) -> list[str]:
    """The sizes of the scale sweep (`scale.sizes`), in config order; [] when the experiment has none."""
    return list((config.get("scale") or {}).get("sizes") or {})


def scale_run_dir(config: dict, results: str, size: str) -> str:
    """The `minite pretrain` output folder of size `size` of the sweep: the pretrain rule's for the RL base model's
    size (one SFT of it, which the RL runs and the sweep's row share), the scale stage's own for the others."""
    return f"{results}/pretrain" if size == (config.get("pretrain") or {}).get("size") else f"{results}/scale/{size}"


def your_model(config: dict) -> str | None:
    """The Hugging Face checkpoint directory of `model.path` (None: the DAG makes its own base model)."""
    return (config.get("model") or {}).get("path")


def data_files(config: dict) -> dict[str, str]:
    """{"train": FILE, "heldout": FILE} of your math data ({} : the DAG makes the arithmetic task's)."""
    data = config.get("data") or {}
    return {k: data[k] for k in ("train", "heldout") if data.get(k)}


# ---- semantic checks -----------------------------------------------------------------------------------------
def _profile(errors, path, name, *, learner=False):
    p = PROFILES.get(name)
    if p is None:
        errors.append(f"config: {path}: unknown profile {name!r}; registered: {', '.join(sorted(PROFILES))}")
    elif learner and not p.can_learn:
        errors.append(f"config: {path}: profile {name!r} has no backward (grad=None): it cannot be a learner")


def _te_mode(errors, path, name):
    """A real-TE learner `te:<mode>` (bench/learner.py rows, diagnostics pairs): the mode must be a TE mode."""
    from minite_core.peers.te_learner import MODES, learner_mode

    if learner_mode(name) not in MODES:
        errors.append(f"config: {path}: unknown TE mode {learner_mode(name)!r}; one of {', '.join(sorted(MODES))}")


def _te_row(errors, path, name):
    """A real-TE learner bench row `te:<mode>[+grouped]` (bench/learner_te.py): a mode TE can run that way."""
    from minite_core.bench.learner_te import te_row

    try:
        te_row(name)
    except ValueError as e:
        errors.append(f"config: {path}: {e}")


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
    for key in ("throughput", "eval", "scale"):
        for i, name in enumerate((config.get(key) or {}).get("profiles", [])):
            if key == "throughput" and name.startswith("te:"):  # a real-TE row (bench/learner.py)
                _te_row(errors, f"{key}.profiles[{i}]", name)
                continue
            if key == "throughput":  # `<profile>+fused+lowmem`: expert GEMM knobs on (bench/learner.py checks them)
                name = name.split("+")[0]
            _profile(errors, f"{key}.profiles[{i}]", name, learner=key == "throughput")
    if "profile" in config.get("pretrain", {}):
        _profile(errors, "pretrain.profile", config["pretrain"]["profile"], learner=True)


def _check_model(config, errors):
    """The RL base model's shape and every size of the scale sweep (`pretrain_section`)."""
    if your_model(config):
        return _check_your_model(config, errors)
    if data_files(config):
        errors.append("config: data.train: your math data needs your model (model.path): the DAG's own model reads "
                      "the arithmetic task with a character tokenizer, without a chat template")
    sizes = scale_sizes(config)
    size = config["pretrain"].get("size")
    if size is None:
        _check_shape(pretrain_section(config), "pretrain", errors)
    elif size not in sizes:
        errors.append(f"config: pretrain.size: {size!r} is not a size of scale.sizes ({', '.join(sizes) or 'none'})")
    for name in sizes:
        _check_shape(pretrain_section(config, name), f"scale.sizes.{name}", errors)


def _check_shape(p: dict, path: str, errors: list[str]) -> None:
    """One SFT config's model shape (the schema's defaults filled in)."""
    if p.get("preset") and p["preset"] not in PRESETS:
        errors.append(f"config: {path}.preset: {p['preset']!r} is not a model preset; known: {', '.join(PRESETS)}")
        return
    if p["num_attention_heads"] % p["num_key_value_heads"]:
        errors.append(f"config: {path}.num_key_value_heads: {p['num_key_value_heads']} does not divide "
                      f"num_attention_heads={p['num_attention_heads']} (GQA groups query heads evenly)")
    if p["head_dim"] % 2:
        errors.append(f"config: {path}.head_dim: {p['head_dim']} must be even (RoPE rotates pairs)")
    if (p["num_attention_heads"] * p["head_dim"]) % 16:
        errors.append(f"config: {path}.head_dim: num_attention_heads * head_dim = "
                      f"{p['num_attention_heads'] * p['head_dim']} must be a multiple of 16 (o_proj's NVFP4 K)")
    if p["num_experts_per_tok"] > p["num_experts"]:
        errors.append(f"config: {path}.num_experts_per_tok: {p['num_experts_per_tok']} > num_experts="
                      f"{p['num_experts']}")
    lo, hi = p["target_accuracy"]
    if lo > hi:
        errors.append(f"config: {path}.target_accuracy: low {lo} > high {hi}")


def _count_rows(path: Path) -> int:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    with path.open(encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def _check_your_model(config, errors):
    """model.path: a Qwen3(-MoE) checkpoint directory with shapes the NVFP4 GEMMs take; its data files and tasks."""
    from minite_core.model.config import ModelConfig

    path = Path(your_model(config))
    try:
        cfg = ModelConfig.from_hf(json.loads((path / "config.json").read_text()))
    except FileNotFoundError:
        return errors.append(f"config: model.path: {path} has no config.json (a Hugging Face checkpoint directory: "
                             "config.json, safetensors, tokenizer files)")
    except (ValueError, json.JSONDecodeError) as e:
        return errors.append(f"config: model.path: {path / 'config.json'}: {e}")
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
        errors.append(f"config: model.path: {path} has no tokenizer files (tokenizer.json, tokenizer_config.json)")
    for name, k in (("hidden_size", cfg.hidden_size), ("num_attention_heads * head_dim",
                    cfg.num_attention_heads * cfg.head_dim), ("moe_intermediate_size", cfg.moe_intermediate_size),
                    ("intermediate_size", cfg.intermediate_size)):
        if k % 16:
            errors.append(f"config: model.path: {name} = {k} of {path} is not a multiple of 16 (an NVFP4 GEMM's K)")
    files = data_files(config)
    if len(files) != 2:
        return errors.append("config: data.train / data.heldout: your model trains on your math data: name both "
                             "files (parquet or JSONL, docs/your-model.md)")
    rows = {}
    for split, file in files.items():
        if not Path(file).is_file():
            errors.append(f"config: data.{split}: {file} does not exist")
        elif Path(file).suffix not in (".parquet", ".jsonl", ".json"):
            errors.append(f"config: data.{split}: {file} is neither .parquet nor .jsonl")
        else:
            rows[split] = _count_rows(Path(file))
    rl, d = config["rl"], config["diagnostics"]
    if "heldout" in rows:
        if rl["eval_n"] > rows["heldout"]:
            errors.append(f"config: rl.eval_n: {rl['eval_n']} held-out problems per evaluation > the {rows['heldout']} "
                          f"of data.heldout; lower it (0 = all)")
        if d["num_prompts"] > rows["heldout"] and not d["prompts"]:
            errors.append(f"config: diagnostics.num_prompts: {d['num_prompts']} > the {rows['heldout']} problems "
                          "of data.heldout")
    if rl.get("runs") and not rl["max_new_tokens"]:
        errors.append("config: rl.max_new_tokens: 0 means the longest reference response of the arithmetic task; "
                      "set your data's response budget")
    ev = config["eval"]
    if ev["tasks"]:
        errors.append(f"config: eval.tasks: {ev['tasks']} score the DAG's own arithmetic task; with model.path set "
                      "eval.tasks: [] and name lm-eval tasks under eval.lm_eval")
    from minite_core.eval.local_tasks import check_files

    for name, task_files in ev.get("lm_eval", {}).items():
        try:
            check_files(name, task_files, ev["num_fewshot"])
        except (ValueError, FileNotFoundError) as e:
            errors.append(f"config: eval.lm_eval.{name}: {e}")


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
    try:
        experts = pretrain_section(config).get("num_experts", 0)
    except ValueError:  # an unknown pretrain.size: _check_model names it
        return
    if your_model(config) and (Path(your_model(config)) / "config.json").is_file():
        experts = json.loads((Path(your_model(config)) / "config.json").read_text()).get("num_experts", 0)
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
    n, bench = stage_gpus(config, "throughput"), config.get("throughput", {}).get("config", "tiny")
    if n > 1 and BENCH_EXPERTS.get(bench, n) % n:
        errors.append(f"config: gpus_per_job: {n} ranks do not split the {BENCH_EXPERTS[bench]} experts of "
                      f"throughput.config {bench!r} (expert parallelism); use a divisor of {BENCH_EXPERTS[bench]}")
    if not your_model(config):  # your data's counts: _check_your_model
        _check_task_sizes(config, errors)


def _check_task_sizes(config, errors):
    """The arithmetic task's prompt space and held-out split against what the stages ask of them."""
    data, rl, d = config["data"], config["rl"], config["diagnostics"]
    for level in data["levels"]:
        need = data["n_train_per_level"] + data["n_heldout_per_level"]
        if level in LEVEL_INDEX and need > prompt_space_size(level):
            errors.append(f"config: data.n_train_per_level: level {level} has {prompt_space_size(level)} distinct "
                          f"prompts, train + held-out ask for {need}")
    heldout = data["n_heldout_per_level"] * len(data["levels"])
    if rl["eval_n"] > heldout:
        errors.append(f"config: rl.eval_n: {rl['eval_n']} held-out problems per evaluation > the {heldout} of the "
                      "data stage (data.n_heldout_per_level x levels)")
    if not d["prompts"] and d["num_prompts"] > heldout:
        errors.append(f"config: diagnostics.num_prompts: {d['num_prompts']} > the {heldout} held-out prompts of "
                      "the data stage")
    if scale_sizes(config) and config["scale"]["eval_n"] > heldout:
        errors.append(f"config: scale.eval_n: {config['scale']['eval_n']} held-out problems > the {heldout} of the "
                      "data stage (data.n_heldout_per_level x levels)")


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


def _check_holds(config, errors):
    """`holds: {name: [item, ...]}`: an item `rl:<run>` names a run of rl.runs, `scale:<size>` a size of
    scale.sizes (a rule name is checked where the hold rules are made, workflow/rules/holds.smk); a run or a size
    is in one hold at most (twice would compute it on two machines)."""
    known = {"rl": set(rl_runs(config)), "scale": set(scale_sizes(config))}
    seen: dict[str, str] = {}
    for hold, items in (config.get("holds") or {}).items():
        for item in items:
            kind, _, name = item.partition(":")
            if kind in known and name not in known[kind]:
                what = "run of rl.runs" if kind == "rl" else "size of scale.sizes"
                errors.append(f"config: holds.{hold}: {item!r} names no {what} "
                              f"({', '.join(sorted(known[kind])) or 'none'})")
            elif kind in known and item in seen:
                errors.append(f"config: holds.{hold}: {item!r} is also in hold {seen[item]} (one machine computes it)")
            seen.setdefault(item, hold)


def semantic_errors(config: dict) -> list[str]:
    """One line per semantic error (module docstring) of a schema-valid config with its defaults filled in
    (snakemake's `validate(config, schema)` fills them); [] when the config is runnable."""
    errors: list[str] = []
    for check in (_check_profiles, _check_model, _check_sizes, _check_gpus, _check_runs, _check_external,
                  _check_holds):
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
