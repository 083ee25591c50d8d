"""`minite data`: the RL stage's inputs — train / held-out JSONL of the arithmetic task and the tokenizer directory.

What it writes under ``--out``:
    train.jsonl     one example a line: {"prompt", "response", "answer", "level"} (task/arithmetic.py's format)
    heldout.jsonl   same, prompts disjoint from train (never used for training or calibration)
    tokenizer/      the tokenizer (transformers ``save_pretrained`` layout): character level, or byte-level BPE
                    trained on train.jsonl's prompts + responses (``tokenizer: bpe``; task/tokenizer.py)
    data.json       results contract (stage "data"): counts, the vocabulary size, response lengths per level in
                    characters and in tokens

Deterministic: the files are a function of (``DataConfig``, run seed) only (``task.make_splits`` draws each
(seed, level, split) from its own stream), so re-running the rule reproduces them byte for byte.

Your own math data instead (`minite data --train FILE --heldout FILE --out DIR`, the experiment's
`data: {train, heldout}`): the files are read in any layout task/math_data.py accepts and written as train.jsonl /
heldout.jsonl in its row form, with data.json (counts per source); no tokenizer is written (the model's is used).

The config names levels by name (``["add2", "add3"]``): experiment YAML reads better than indices and survives a
reordering of ``task.LEVELS``.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch

from minite_core.results import config_from_json, config_to_dict, write_result
from minite_core.seeds import tagged
from minite_core.task.arithmetic import LEVELS, TaskConfig, level_index, make_splits
from minite_core.task.jsonl import EXAMPLE_FIELDS, read_jsonl, write_jsonl
from minite_core.task.math_data import load_math_file
from minite_core.task.tokenizer import KINDS, make_tokenizer, save_tokenizer

TRAIN, HELDOUT, TOKENIZER = "train.jsonl", "heldout.jsonl", "tokenizer"


@dataclass(frozen=True)
class DataConfig:
    # add2 alone: the only level a 2-core CPU model learns to partial accuracy in ~1 min (smoke); GPU runs add the
    # longer levels, whose 130-236 token responses give the mismatch a realistic horizon.
    levels: tuple[str, ...] = ("add2",)
    # train prompts per level: > steps x batch of the smoke pretraining would be needed to avoid repeats; repeats
    # are harmless for SFT here (the smoke model underfits), and 2048 writes in well under a second
    n_train_per_level: int = 2048
    # held-out prompts per level: 512 = what an RL evaluation scores by default (RLConfig.eval_n; binomial SE <= 2.2
    # points, what a held-out claim needs)
    n_heldout_per_level: int = 512
    # "char": one token a character (the CPU smoke: a 64-entry LM head); "bpe": byte-level BPE trained on the train
    # split (GPU runs: a vocabulary of real-model kind, ~1,300 tokens on add3 + mul3x1; task/tokenizer.py)
    tokenizer: str = "char"
    # BPE only: the ceiling of the vocabulary; the task text runs out of merges below 2048 (1,301 for add3 + mul3x1)
    vocab_size: int = 2048

    def __post_init__(self):
        if self.tokenizer not in KINDS:
            raise ValueError(f"DataConfig.tokenizer must be one of {list(KINDS)}, got {self.tokenizer!r}")
        if not self.levels:
            raise ValueError("DataConfig.levels is empty: name at least one task level")
        for name in self.levels:
            level_index(name)  # unknown level -> ValueError naming it
        if self.n_train_per_level < 1 or self.n_heldout_per_level < 1:
            raise ValueError(f"DataConfig needs n_train_per_level, n_heldout_per_level >= 1, got "
                             f"{self.n_train_per_level}, {self.n_heldout_per_level}")

    def task_config(self, seed: int) -> TaskConfig:
        return TaskConfig(levels=tuple(level_index(lv) for lv in self.levels), seed=seed,
                          n_train_per_level=self.n_train_per_level, n_heldout_per_level=self.n_heldout_per_level)


def write_data(out: str | Path, cfg: DataConfig, seed: int) -> dict:
    """Write the splits + tokenizer under ``out``; returns the metrics dict of data.json."""
    out = Path(out)
    train, heldout = make_splits(cfg.task_config(seed))
    write_jsonl(train, out / TRAIN)
    write_jsonl(heldout, out / HELDOUT)
    tok = make_tokenizer(cfg.tokenizer, [e["prompt"] + e["response"] for e in train], cfg.vocab_size)
    save_tokenizer(tok, out / TOKENIZER)
    per_level = {}
    for name in cfg.levels:
        li = level_index(name)
        rows = [e for e in train if e["level"] == li]
        chars = [len(e["response"]) for e in rows]
        tokens = [len(ids) for ids in tok([e["response"] for e in rows], add_special_tokens=False)["input_ids"]]
        per_level[LEVELS[li].name] = {"n_train": len(rows), "n_heldout": sum(e["level"] == li for e in heldout),
                                      **_stats("response_chars", chars), **_stats("response_tokens", tokens)}
    return {"n_train": len(train), "n_heldout": len(heldout), "tokenizer": cfg.tokenizer, "vocab": len(tok),
            "levels": per_level}


def _stats(name: str, values: list[int]) -> dict:
    return {f"{name}_min": min(values), f"{name}_max": max(values), f"{name}_mean": sum(values) / len(values)}


def import_data(out: str | Path, train: str | Path, heldout: str | Path) -> dict:
    """Your math files as the RL stage's splits under ``out`` (module docstring); returns data.json's metrics."""
    out = Path(out)
    splits = {TRAIN: load_math_file(train), HELDOUT: load_math_file(heldout)}
    seen = {r["prompt"] for r in splits[TRAIN]}
    shared = sum(r["prompt"] in seen for r in splits[HELDOUT])
    if shared:  # a held-out problem that RL trains on flatters every held-out number
        raise ValueError(f"{heldout} shares {shared} problem(s) with {train}: held-out problems must not be trained on")
    for name, rows in splits.items():
        write_jsonl(rows, out / name)
    sources = {}
    for split, rows in (("train", splits[TRAIN]), ("heldout", splits[HELDOUT])):
        for r in rows:
            sources.setdefault(r["source"], {"n_train": 0, "n_heldout": 0})[f"n_{split}"] += 1
    return {"task": "math", "n_train": len(splits[TRAIN]), "n_heldout": len(splits[HELDOUT]), "sources": sources,
            "with_solution": sum(bool(r["response"]) for r in splits[TRAIN])}


def load_split(data_dir: str | Path, split: str) -> list[dict]:
    """``split`` = "train" | "heldout" from a ``minite data`` directory."""
    name = {"train": TRAIN, "heldout": HELDOUT}.get(split)
    if name is None:
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    rows = read_jsonl(Path(data_dir) / name)
    fields = ("task", "messages", "answer", "source") if rows[0].get("task") == "math" else EXAMPLE_FIELDS
    for lineno, row in enumerate(rows, 1):  # (blank lines are skipped: a row's number, not always its line)
        missing = [k for k in fields if k not in row]
        if missing:
            raise ValueError(f"{Path(data_dir) / name}: row {lineno}: missing field(s) {missing} (rows need "
                             f"{list(fields)})")
    return rows


def calibration_examples(rows: list[dict], n: int, seed: int) -> list[dict]:
    """The `n` examples (of a split's rows) that calibrate static activation scales, chosen by the run seed: the
    same choice in every stage (RL, eval, diagnostics, export), so one checkpoint gets one set of scales."""
    if n < 1:
        raise ValueError(f"calibration needs n >= 1 examples, got {n}")
    if not rows:
        raise ValueError("no calibration examples: the calibration file is empty")
    g = torch.Generator().manual_seed(tagged(seed, "init"))
    return [rows[i] for i in torch.randperm(len(rows), generator=g)[:n].tolist()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="minite data", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=int, default=0, help="run seed")
    p.add_argument("--config-json", default="{}", help="DataConfig fields as JSON (the experiment's `data:`)")
    p.add_argument("--experiment", default="adhoc")
    p.add_argument("--train", default=None, help="your math train file (parquet / JSONL), with --heldout")
    p.add_argument("--heldout", default=None, help="your math held-out file (parquet / JSONL), with --train")
    args = p.parse_args(argv)
    if (args.train is None) != (args.heldout is None):
        p.error("--train and --heldout go together (your data's two splits)")
    if args.train is not None:
        metrics = import_data(args.out, args.train, args.heldout)
        write_result(Path(args.out) / "data.json", stage="data", experiment=args.experiment,
                     config={"train": str(args.train), "heldout": str(args.heldout)}, metrics=metrics)
        print(f"data: {metrics['n_train']} train / {metrics['n_heldout']} held-out math problems -> {args.out}")
        return 0
    cfg = config_from_json(DataConfig, args.config_json)
    metrics = write_data(args.out, cfg, args.seed)
    write_result(Path(args.out) / "data.json", stage="data", experiment=args.experiment,
                 config={**config_to_dict(cfg), "seed": args.seed}, metrics=metrics)
    print(f"data: {metrics['n_train']} train / {metrics['n_heldout']} held-out examples, {cfg.tokenizer} tokenizer "
          f"of {metrics['vocab']} tokens -> {args.out}")
    return 0
