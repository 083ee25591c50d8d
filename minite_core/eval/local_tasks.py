"""lm-eval's own task definitions (GSM8K, MATH-500), run offline on files you name — what papers report.

What: `write_local_tasks({"gsm8k": {"test": FILE, "train": FILE}, ...}, folder)` writes one YAML per task into
`folder` that `include:`s the task's YAML shipped with lm-eval (its prompt, few-shot setting, generation stop
strings, answer filters and metrics, unchanged) and replaces only where the documents come from: the local
file, through datasets' packaged `json` / `parquet` builder, with a datasets cache inside `folder`. The task
keeps its name (`gsm8k`), so scores read as lm-eval's. Nothing reaches a hub: the data are local, the `minite`
model loads from a local directory, and `minite eval` sets HF_DATASETS_OFFLINE / HF_HUB_OFFLINE.

Tasks (`TASKS`, lm-eval 0.4.13's definitions):
- `gsm8k`: GSM8K, 5-shot "Question: ... Answer:" prompts, exact match on the `#### N` answer (strict) and on the
  last number (flexible). Splits: `test` (scored), `train` (the few-shot examples; not needed with num_fewshot 0).
  Fields: `question`, `answer` (openai/gsm8k's layout).
- `minerva_math500`: MATH-500 (HuggingFaceH4/MATH-500's layout: `problem`, `solution`), Minerva's 4-shot prompt
  (few-shot examples built into lm-eval), exact match after Minerva's normalisation and Math-Verify. Split `test`.
- `hendrycks_math500`: the same problems, lm-eval's plain "Problem: ... Answer:" prompt and exact match.
A task whose file is missing is a one-line error naming the file to provide and its layout; a file without a
field the task reads is one naming the field.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml


@dataclass(frozen=True)
class LocalTask:
    yaml: str  # the task's YAML inside lm_eval/tasks/
    splits: tuple[str, ...]  # splits it reads; the first is the scored one
    fields: tuple[str, ...]  # fields every document needs
    what: str  # what to provide, for the error message


TASKS = {
    "gsm8k": LocalTask("gsm8k/gsm8k.yaml", ("test", "train"), ("question", "answer"),
                       "GSM8K (openai/gsm8k's layout: question, answer ending '#### N'); train = few-shot examples"),
    "minerva_math500": LocalTask("minerva_math/minerva_math500.yaml", ("test",), ("problem", "solution"),
                                 "MATH-500 (HuggingFaceH4/MATH-500's layout: problem, solution with \\boxed{})"),
    "hendrycks_math500": LocalTask("hendrycks_math/hendrycks_math500.yaml", ("test",), ("problem", "solution"),
                                   "MATH-500 (HuggingFaceH4/MATH-500's layout: problem, solution with \\boxed{})"),
}
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}  # datasets' packaged builders


def _first_row(path: Path) -> dict:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.ParquetFile(path).read_row_group(0).slice(0, 1).to_pylist()
    else:
        from minite_core.task.jsonl import read_jsonl

        rows = read_jsonl(path)[:1]
    if not rows:
        raise ValueError(f"{path} has no rows")
    return rows[0]


def needed_splits(name: str, num_fewshot: int | None) -> tuple[str, ...]:
    """The splits task `name` reads: its few-shot split only when it draws few-shot examples from the data."""
    task = TASKS[name]
    return task.splits[:1] if num_fewshot == 0 else task.splits


def check_files(name: str, files: dict, num_fewshot: int | None = None) -> dict[str, Path]:
    """{split: path} of task `name`, every needed split present, every file there with the task's fields;
    else a one-line error naming the file to provide."""
    if name not in TASKS:
        raise ValueError(f"eval task {name!r} has no local-file definition; one of {', '.join(TASKS)}")
    task, out = TASKS[name], {}
    for split in needed_splits(name, num_fewshot):
        path = files.get(split)
        if path is None:
            raise ValueError(f"eval task {name}: name its {split} split file (eval.lm_eval.{name}.{split}): "
                             f"{task.what}")
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"eval task {name}: {path} does not exist; provide the {split} split of "
                                    f"{task.what}, as .jsonl or .parquet")
        if path.suffix not in BUILDERS:
            raise ValueError(f"eval task {name}: {path} is neither .jsonl nor .parquet")
        missing = [f for f in task.fields if f not in _first_row(path)]
        if missing:
            raise ValueError(f"eval task {name}: {path} has no field(s) {missing}; {task.what}")
        out[split] = path.resolve()
    if len({BUILDERS[p.suffix] for p in out.values()}) > 1:
        raise ValueError(f"eval task {name}: give all its splits in one format (.jsonl or .parquet), got "
                         f"{sorted(str(p) for p in out.values())}")
    return out


def write_local_tasks(tasks: dict[str, dict], folder: str | Path, num_fewshot: int | None = None) -> Path:
    """One YAML per task in `folder` (module docstring); returns `folder`."""
    import lm_eval.tasks

    root = Path(lm_eval.tasks.__file__).parent
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    for name, files in tasks.items():
        paths = check_files(name, files, num_fewshot)
        config = {"include": str(root / TASKS[name].yaml), "task": name,
                  "dataset_path": BUILDERS[next(iter(paths.values())).suffix], "dataset_name": None,
                  "dataset_kwargs": {"data_files": {s: str(p) for s, p in paths.items()},
                                     "cache_dir": str(folder / "hf_datasets_cache")}}
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return folder
