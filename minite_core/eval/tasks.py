"""lm-eval tasks built at run time from the DAG's held-out JSONL — no hub, no lm-eval task registry.

What: `build_tasks(heldout_jsonl, folder)` writes one YAML per task plus the JSONL each reads into `folder`;
`task_manager(folder)` returns `TaskManager(include_path=folder, include_defaults=False)`, which sees only these.
Three views of the RL task's held-out split (task/arithmetic.py):
- `heldout_gen` (generate_until): prompt -> greedy response, stop at `<eos>` (the model's) or a blank line;
  `exact_match` = the last well-formed `answer: N` line equals the reference (`task.extract_answer`, which allows
  leading/trailing spaces on the line and ignores everything else) — the RL reward at format_credit 0.
- `heldout_mc` (multiple_choice, loglikelihood): the candidates of `task.choices` (plausible slips of the same
  width) scored as continuations ` N`; `acc` / `acc_norm`. Context "scratchpad" (default) = prompt + the worked
  response up to `answer:`, so the probe asks whether the answer tokens follow from the work under this profile;
  "prompt" = prompt + `answer:` (answering without the scratchpad: near chance for small models).
- `heldout_ppl` (loglikelihood_rolling): prompt + response; word/byte perplexity and bits per byte.

Why build YAML instead of constructing `Task` objects in Python: it is lm-eval's supported extension point, so the
same folder also works from its CLI (`lm_eval --include_path FOLDER --tasks heldout_gen ...`), and the YAML is a
readable record of what was evaluated. Data are local JSON through `dataset_path: json` with `data_files`, cached
inside the folder (`cache_dir`) so concurrent eval jobs never share a datasets cache.

The `!function` references name importable functions of this module (lm-eval imports `minite_core.eval.tasks`
when no file of that name sits next to the YAML), so no Python file is generated.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from minite_core.seeds import choice_seed
from minite_core.task.arithmetic import LEVELS, choices, extract_answer
from minite_core.task.jsonl import read_jsonl, write_jsonl

TASKS = ("heldout_gen", "heldout_mc", "heldout_ppl")
MC_CONTEXTS = ("scratchpad", "prompt")
ANSWER_TAG = "answer:"


@dataclass(frozen=True)
class TaskSpec:
    """How the held-out split becomes lm-eval tasks. Defaults give each task its full-length horizon."""

    n_choices: int = 4  # 1 answer + 3 slips: chance = 25 %
    choice_seed: int = 0  # candidates / gold position of doc i drawn from choice_seed(choice_seed, i)
    mc_context: str = "scratchpad"  # see the module docstring
    # responses are <= 256 characters (task.RESPONSE_MAX_CHARS) + <eos>: 257 tokens reach every reference
    max_gen_toks: int = 257
    until: tuple[str, ...] = ("\n\n",)  # a blank line never occurs inside a response

    def __post_init__(self):
        if self.mc_context not in MC_CONTEXTS:
            raise ValueError(f"TaskSpec.mc_context={self.mc_context!r} is not one of {list(MC_CONTEXTS)}")
        if self.n_choices < 2 or self.max_gen_toks < 1:
            raise ValueError(f"TaskSpec needs n_choices >= 2 and max_gen_toks >= 1, got {self}")


# ----------------------------------------------------------------------------------------------- metrics
def process_results_gen(doc: dict, results: list[str]) -> dict[str, float]:
    """`exact_match`: the generated response's `answer: N` equals `doc["answer"]` as an integer (robust to leading
    whitespace of the generation and of the answer line)."""
    got = extract_answer(results[0].lstrip())
    return {"exact_match": float(got is not None and int(got) == int(doc["answer"]))}


# ----------------------------------------------------------------------------------------------- docs
def mc_doc(example: dict, index: int, spec: TaskSpec) -> dict:
    """The multiple-choice view of one held-out example: context, candidates, gold index."""
    if spec.mc_context == "scratchpad":
        cut = example["response"].rindex(ANSWER_TAG) + len(ANSWER_TAG)
        context = example["prompt"] + example["response"][:cut]
    else:
        context = example["prompt"] + ANSWER_TAG
    cands = choices(example, spec.n_choices, choice_seed(spec.choice_seed, index))
    return {"context": context, "choices": cands, "gold": cands.index(str(int(example["answer"])))}


def select(heldout: list[dict], limit: int | None) -> list[tuple[int, dict]]:
    """(index in the split, example) of the first `limit` examples taken round-robin over levels, so a limited
    eval still covers every level (lm-eval's own `--limit` would take the first level only: the split is ordered
    by level). Deterministic; `None` = all, in file order."""
    indexed = list(enumerate(heldout))
    if limit is None or limit >= len(heldout):
        return indexed
    by_level: dict[int, list[tuple[int, dict]]] = {}
    for i, ex in indexed:
        by_level.setdefault(int(ex["level"]), []).append((i, ex))
    queues, picked = [by_level[k] for k in sorted(by_level)], []
    while len(picked) < limit:
        for q in queues:
            if q and len(picked) < limit:
                picked.append(q.pop(0))
    return sorted(picked, key=lambda t: t[0])


def task_docs(heldout: list[dict], spec: TaskSpec, limit: int | None = None) -> list[dict]:
    """One row per selected held-out example carrying every task's fields (gen: prompt/answer; mc: context/choices/
    gold; ppl: text) plus `doc_index` (position in the split) and `level_name` for per-level breakdowns."""
    rows = []
    for i, ex in select(heldout, limit):
        rows.append({**ex, **mc_doc(ex, i, spec), "text": ex["prompt"] + ex["response"], "doc_index": i,
                     "level_name": LEVELS[int(ex["level"])].name})
    return rows


# ----------------------------------------------------------------------------------------------- YAML
def _task_config(name: str, data_file: Path, cache_dir: Path, spec: TaskSpec) -> tuple[dict, dict]:
    """(plain YAML fields, fields that are `!function` references) of one task."""
    base = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data_file)}, "cache_dir": str(cache_dir)},
        "test_split": "test",
        "num_fewshot": 0,
        "metadata": {"version": 1.0},
    }
    if name == "heldout_gen":
        return {**base, "output_type": "generate_until", "doc_to_text": "prompt", "doc_to_target": "answer",
                "generation_kwargs": {"until": list(spec.until), "max_gen_toks": spec.max_gen_toks,
                                      "do_sample": False, "temperature": 0.0},
                "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}]}, \
            {"process_results": "minite_core.eval.tasks.process_results_gen"}
    if name == "heldout_mc":
        return {**base, "output_type": "multiple_choice", "doc_to_text": "context", "doc_to_choice": "choices",
                "doc_to_target": "gold", "target_delimiter": " ",
                "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                                {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}]}, {}
    if name == "heldout_ppl":
        return {**base, "output_type": "loglikelihood_rolling", "doc_to_text": "", "doc_to_target": "text",
                "metric_list": [{"metric": m, "aggregation": agg, "higher_is_better": False} for m, agg in (
                    ("word_perplexity", "weighted_perplexity"), ("byte_perplexity", "weighted_perplexity"),
                    ("bits_per_byte", "bits_per_byte"))]}, {}
    raise ValueError(f"unknown task {name!r}; known: {list(TASKS)}")


def _yaml_text(plain: dict, functions: dict) -> str:
    text = yaml.safe_dump(plain, sort_keys=False, allow_unicode=True)
    return text + "".join(f"{key}: !function {ref}\n" for key, ref in functions.items())


def build_tasks(heldout: str | Path, folder: str | Path, spec: TaskSpec = TaskSpec(),
                tasks: tuple[str, ...] = TASKS, limit: int | None = None) -> Path:
    """Write `folder/{task}.yaml` for each task and `folder/heldout_docs.jsonl` they read (the `limit` examples of
    `select`); returns `folder`."""
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        raise ValueError(f"unknown tasks {unknown}; known: {list(TASKS)}")
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    data_file = folder / "heldout_docs.jsonl"
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    write_jsonl(task_docs(read_jsonl(heldout), spec, limit), data_file)
    for name in tasks:
        plain, functions = _task_config(name, data_file, folder / "hf_datasets_cache", spec)
        (folder / f"{name}.yaml").write_text(_yaml_text(plain, functions))
    (folder / "spec.json").write_text(json.dumps({"heldout": str(heldout), "tasks": list(tasks), "limit": limit,
                                                  **spec.__dict__}, indent=2, default=list) + "\n")
    return folder


def task_manager(folder: str | Path):
    """lm-eval's TaskManager over `folder` only (no built-in tasks: nothing is looked up on the hub)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(folder), include_defaults=False)
