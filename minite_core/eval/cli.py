"""`minite eval`: lm-eval on one checkpoint under one execution profile, fully offline (table: report.tables).

    minite eval --checkpoint DIR --profile NAME --out FILE.json [--data-dir DIR]
                [--tasks heldout_gen,heldout_mc,heldout_ppl] [--lm-eval-json '{"gsm8k": {"test": F, "train": F}}']
                [--num-fewshot N] [--apply-chat-template] [--max-gen-toks 256] [--limit N] [--experiment NAME]
                [--run NAME] [--calib JSONL] [--calib-n 32] [--recalibrate] [--dtype auto|float32|bfloat16]
                [--batch-size 8] [--device cpu] [--spec-json '{}'] [--samples FILE.jsonl] [--tasks-dir DIR]

Two kinds of tasks, side by side in one run: the project's own (`--tasks`; their YAML is built from
`DATA_DIR/heldout.jsonl`, `minite data`'s layout, eval/tasks.py; `--tasks ""` runs none) and lm-eval's own task
definitions on local files (`--lm-eval-json`: task name -> {split: file}, eval/local_tasks.py: gsm8k,
minerva_math500, hendrycks_math500). Both go into a temporary folder (or `--tasks-dir`), run through
`lm_eval.simple_evaluate` with `model="minite"`, and the scores written as our own JSON
(stage "eval", the results contract) — lm-eval's own output files carry timestamps in their names, so a DAG cannot
name them. Metric keys are `{task}/{metric}` (`heldout_gen/exact_match`, `heldout_mc/acc`, ...) with the stderr as
`{task}/{metric}_stderr`; per-level scores go under the extra key `by_level`.

`--limit N` picks N held-out examples round-robin over levels (tasks.select), the same N for every task (lm-eval's
tasks: their first N documents). `--num-fewshot` overrides the tasks' few-shot count, `--apply-chat-template`
renders prompts with the checkpoint's chat template (lm-eval's option), `--max-gen-toks` is the generation budget
of tasks that set none. The tokenizer is the checkpoint's when it has one, else `DATA_DIR/tokenizer`.

Offline: the tasks read local JSON (datasets' packaged `json` builder), the model and tokenizer load from local
directories with `local_files_only`; `run_eval` also sets HF_DATASETS_OFFLINE / HF_HUB_OFFLINE (unless set) before
lm-eval first imports `datasets`, and the Snakemake rule sets both for the whole process.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from minite_core.results import write_result
from minite_core.runs.cli import add_common_args, parse_with_config

HELDOUT, TOKENIZER = "heldout.jsonl", "tokenizer"  # minite_core.task.data's layout
KNOWN_TASKS = ("heldout_gen", "heldout_mc", "heldout_ppl")  # eval.tasks.TASKS (named here: it imports lm-eval)


def _run_name(checkpoint: Path) -> str:
    """`results/<exp>/rl/<run>/final` -> `<run>`; any other directory -> its own name."""
    checkpoint = Path(checkpoint)
    return checkpoint.parent.name if checkpoint.name == "final" else checkpoint.name


def _numbers(task_result: dict) -> dict[str, float]:
    """lm-eval's `{"acc,none": x, "acc_stderr,none": s, "alias": ...}` -> `{"acc": x, "acc_stderr": s}`
    (numbers only: lm-eval writes "N/A" for stderrs it does not compute)."""
    out = {}
    for key, value in task_result.items():
        metric, _, filt = key.partition(",")
        if filt and isinstance(value, (int, float)) and not isinstance(value, bool):
            out[metric if filt == "none" else f"{metric}[{filt}]"] = float(value)
    return out


def _by_level(samples: dict[str, list[dict]], metrics: dict[str, list[str]]) -> dict:
    """{task: {level name: {metric: mean, "n": count}}} from lm-eval's logged samples."""
    out: dict = {}
    for task, rows in samples.items():
        per: dict[str, dict[str, list[float]]] = {}
        for row in rows:
            level = row["doc"].get("level_name")  # our own tasks' docs; lm-eval's tasks have no levels
            if level is None:
                continue
            for m in metrics.get(task, []):
                if isinstance(row.get(m), (int, float)):
                    per.setdefault(level, {}).setdefault(m, []).append(float(row[m]))
        if per:  # perplexity samples carry (loglikelihood, length) pairs, not per-doc scores: no breakdown
            out[task] = {lv: {**{m: sum(v) / len(v) for m, v in ms.items()}, "n": len(next(iter(ms.values())))}
                         for lv, ms in sorted(per.items())}
    return out


def run_eval(*, checkpoint, profile: str, data_dir=None, tasks=None, limit: int | None = None, calib=None,
             dtype: str = "auto", batch_size: int = 8, device: str = "cpu", spec: dict | None = None,
             tasks_dir=None, calib_n: int = 32, recalibrate: bool = False, seed: int = 0,
             engine: str | None = None, lm_eval_tasks: dict | None = None, num_fewshot: int | None = None,
             apply_chat_template: bool = False, max_gen_toks: int = 256) -> dict:
    """Build the tasks, evaluate, and return `{"metrics", "by_level", "n_docs", "calibration", "samples"}`.
    tasks: our own (None = all of them, () = none); lm_eval_tasks: {lm-eval task: {split: file}}; engine: the
    rollout engine of generation tasks (None: automatic for the device)."""
    # fully offline: `datasets` reads these when first imported, which is inside simple_evaluate's task loading
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import lm_eval

    from minite_core.eval.lm import MiniteLM
    from minite_core.eval.local_tasks import write_local_tasks
    from minite_core.eval.tasks import TASKS, TaskSpec, build_tasks, task_manager

    own = tuple(TASKS if tasks is None else tasks)
    lm_eval_tasks = dict(lm_eval_tasks or {})
    if not own and not lm_eval_tasks:
        raise ValueError("no tasks to evaluate: name --tasks and/or --lm-eval-json")
    checkpoint = Path(checkpoint)
    if own and data_dir is None:
        raise ValueError(f"tasks {list(own)} read DATA_DIR/heldout.jsonl: give --data-dir")
    tokenizer = checkpoint if (checkpoint / "tokenizer.json").exists() else Path(data_dir or checkpoint) / TOKENIZER
    task_spec = TaskSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in (spec or {}).items()})
    with tempfile.TemporaryDirectory(prefix="minite-eval-tasks-") as tmp:
        folder = Path(tasks_dir or tmp)
        write_local_tasks(lm_eval_tasks, folder, num_fewshot)  # first: a missing file fails before the model loads
        if own:
            build_tasks(Path(data_dir) / HELDOUT, folder, task_spec, own, limit)
        lm = MiniteLM(pretrained=str(checkpoint), profile=profile, dtype=dtype, batch_size=batch_size,
                      device=device, tokenizer=str(tokenizer), calib=str(calib) if calib else None,
                      calib_n=calib_n, recalibrate=recalibrate, seed=seed, max_gen_toks=max_gen_toks,
                      engine=engine)
        names_all = [*own, *lm_eval_tasks]
        res = lm_eval.simple_evaluate(model=lm, tasks=names_all, task_manager=task_manager(folder),
                                      log_samples=True, bootstrap_iters=1000,  # > 0: closed-form stderrs
                                      num_fewshot=num_fewshot, apply_chat_template=apply_chat_template,
                                      limit=limit if lm_eval_tasks else None)
    tasks = names_all
    metrics, names = {}, {}
    for task in tasks:
        numbers = _numbers(res["results"][task])
        names[task] = [m for m in numbers if not m.endswith("_stderr")]
        metrics.update({f"{task}/{m}": v for m, v in numbers.items()})
    return {"metrics": metrics, "by_level": _by_level(res["samples"], names),
            "n_docs": {t: len({r["doc_id"] for r in res["samples"][t]}) for t in tasks},  # a sample per filter
            "calibration": lm.calibration,
            "samples": res["samples"], "lm_eval_version": lm_eval.__version__}


# ----------------------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="minite eval", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="transformers-format checkpoint directory")
    p.add_argument("--profile", required=True, help="execution profile name (minite_core.profiles)")
    p.add_argument("--data-dir", default=None, help="`minite data` output: heldout.jsonl (+ tokenizer/), for --tasks")
    p.add_argument("--out", required=True, help="result JSON (stage eval)")
    p.add_argument("--tasks", default=None, help="comma-separated subset of heldout_gen,heldout_mc,heldout_ppl "
                                                 "('' = none; default: all)")
    p.add_argument("--lm-eval-json", default="{}", help="lm-eval's own tasks on local files: "
                   '\'{"gsm8k": {"test": FILE, "train": FILE}, "minerva_math500": {"test": FILE}}\'')
    p.add_argument("--num-fewshot", type=int, default=None, help="few-shot examples (default: each task's own)")
    p.add_argument("--apply-chat-template", action="store_true", help="render prompts with the chat template")
    p.add_argument("--max-gen-toks", type=int, default=256, help="generation budget of tasks that set none")
    p.add_argument("--limit", type=int, default=None, help="held-out examples, round-robin over levels")
    p.add_argument("--calib", default=None, help="JSONL for static activation scales (e.g. train.jsonl)")
    p.add_argument("--calib-n", type=int, default=32, help="calibration examples")
    p.add_argument("--recalibrate", action="store_true", help="calibrate on --calib even if the checkpoint has scales")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="compute dtype override (float32 = the peer-check setting)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--spec-json", default="{}", help="TaskSpec fields as JSON (n_choices, mc_context, ...)")
    p.add_argument("--run", default=None, help="row label (default: the RL run owning the checkpoint)")
    p.add_argument("--samples", default=None, help="also write lm-eval's per-sample records here (JSONL)")
    p.add_argument("--tasks-dir", default=None, help="keep the generated task YAML here (default: temporary)")
    add_common_args(p, config_help="the experiment's `eval:` section as JSON minus runs/profiles (keys = the flags)")
    args = parse_with_config(p, argv)

    for flag, value in (("--limit", args.limit or 1), ("--batch-size", args.batch_size), ("--calib-n", args.calib_n),
                        ("--max-gen-toks", args.max_gen_toks), ("--num-fewshot", 1 + (args.num_fewshot or 0))):
        if value < 1:
            p.error(f"{flag} must be >= {1 if flag != '--num-fewshot' else 0}, got {value}")
    try:
        spec, lm_eval_tasks = json.loads(args.spec_json), json.loads(args.lm_eval_json)
    except json.JSONDecodeError as e:
        p.error(f"--spec-json / --lm-eval-json is not JSON: {e}")
    if not isinstance(lm_eval_tasks, dict) or not all(isinstance(v, dict) for v in lm_eval_tasks.values()):
        p.error('--lm-eval-json must map a task name to its files: {"gsm8k": {"test": FILE, "train": FILE}}')
    tasks = None if args.tasks is None else tuple(t for t in args.tasks.split(",") if t)
    unknown = sorted(set(tasks or ()) - set(KNOWN_TASKS))
    if unknown:
        p.error(f"--tasks: unknown task(s) {unknown}; known: {', '.join(KNOWN_TASKS)}")
    out = run_eval(checkpoint=args.checkpoint, profile=args.profile, data_dir=args.data_dir, tasks=tasks,
                   limit=args.limit, calib=args.calib, dtype=args.dtype, batch_size=args.batch_size,
                   device=args.device, spec=spec, tasks_dir=args.tasks_dir, calib_n=args.calib_n,
                   recalibrate=args.recalibrate, seed=args.seed, engine=args.execution.sampler_engine,
                   lm_eval_tasks=lm_eval_tasks, num_fewshot=args.num_fewshot, apply_chat_template=args.apply_chat_template,
                   max_gen_toks=args.max_gen_toks)
    config = {"checkpoint": str(args.checkpoint), "run": args.run or _run_name(Path(args.checkpoint)),
              "profile": args.profile, "dtype": args.dtype, "tasks": list(out["n_docs"]), "limit": args.limit,
              "calib": args.calib, "calib_n": args.calib_n, "recalibrate": args.recalibrate,
              "batch_size": args.batch_size, "device": args.device, "spec": spec, "data_dir": args.data_dir,
              "lm_eval_tasks": lm_eval_tasks, "num_fewshot": args.num_fewshot,
              "apply_chat_template": args.apply_chat_template, "max_gen_toks": args.max_gen_toks}
    write_result(args.out, stage="eval", experiment=args.experiment, config=config, metrics=out["metrics"],
                 by_level=out["by_level"], n_docs=out["n_docs"], calibration=out["calibration"],
                 lm_eval_version=out["lm_eval_version"])
    if args.samples:
        Path(args.samples).parent.mkdir(parents=True, exist_ok=True)
        with open(args.samples, "w") as f:
            for task, rows in out["samples"].items():
                for row in rows:
                    f.write(json.dumps({"task": task, "doc_index": row["doc"].get("doc_index", row.get("doc_id")),
                                        "filter": row.get("filter"),
                                        "resps": row["filtered_resps"], "target": row["target"],
                                        **{m: row[m] for m in row if m.split("/")[0] in
                                           ("exact_match", "acc", "acc_norm")}}, default=str) + "\n")
    print(json.dumps(out["metrics"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
