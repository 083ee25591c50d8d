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
    # points, issue 20)
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


def load_split(data_dir: str | Path, split: str) -> list[dict]:
    """``split`` = "train" | "heldout" from a ``minite data`` directory."""
    name = {"train": TRAIN, "heldout": HELDOUT}.get(split)
    if name is None:
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    return read_jsonl(Path(data_dir) / name, fields=EXAMPLE_FIELDS)


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
    args = p.parse_args(argv)
    cfg = config_from_json(DataConfig, args.config_json)
    metrics = write_data(args.out, cfg, args.seed)
    write_result(Path(args.out) / "data.json", stage="data", experiment=args.experiment,
                 config={**config_to_dict(cfg), "seed": args.seed}, metrics=metrics)
    print(f"data: {metrics['n_train']} train / {metrics['n_heldout']} held-out examples, {cfg.tokenizer} tokenizer "
          f"of {metrics['vocab']} tokens -> {args.out}")
    return 0
