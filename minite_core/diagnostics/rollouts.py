"""Logged rollouts of any RL framework in one schema: per response, the sampler's and the learner's log-probs of
the sampled tokens, so the mismatch report runs on anyone's engines without their model (docs/rollouts.md).

The schema (one record per response; a JSONL line or a parquet row):
  sampler_logprobs  list[float]  log π_sampler of each response token (the distribution it sampled from)
  learner_logprobs  list[float]  log π_learner of the same tokens (the trainer's recomputed "old" log-probs)
  mask              list[0|1]    optional, default all 1: which tokens count (tool output, padding: 0)
  step              int          optional, default 0: the training step the rollout fed
  prompt_id         str | int    optional: the prompt (groups of one prompt share it)
  kl_full_vocab     list[float]  optional: KL(π_sampler ‖ π_learner) over the whole vocabulary, per token
  sampler_logits, learner_logits  list[list[float]]  optional, T × V: both engines' full rows (logits or
                    log-probs: each row is renormalised), from which kl_full_vocab is computed
Other frameworks' dumps are read by their importers (diagnostics.layouts) into the same `Row`s.

Reading checks every record and stops at the first bad one with ONE line naming the file, the row (1-based: the
line of a JSONL file, the row of a parquet file, the sample of a .pt dump) and the column: a column missing,
per-token arrays of different lengths (ragged or misaligned), a NaN / inf / positive log-prob on a counted token.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

SUFFIXES = (".jsonl", ".parquet", ".pt")
LOGPROB_SLACK = 1e-4  # a log-prob above this is no log-prob (probabilities or logits were logged): an error
REQUIRED = ("sampler_logprobs", "learner_logprobs")


@dataclass
class Row:
    """One response, response tokens only (position 0 = the first sampled token)."""

    step: int
    learner: list[float]
    sampler: list[float]
    mask: list[bool]
    prompt_id: str | None = None
    kl: list[float] | None = None  # per-token full-vocabulary KL(sampler ‖ learner), when logged


@dataclass
class Rollouts:
    """The rows of one external engine pair, with where they came from."""

    name: str
    layout: str
    files: list[str]
    rows: list[Row] = field(default_factory=list)

    def kl_reason(self) -> str | None:
        """None when every row carries the full-vocabulary KL, else why kl_full_vocab is omitted."""
        have = sum(r.kl is not None for r in self.rows)
        if have == len(self.rows) and self.rows:
            return None
        if have:
            return f"only {have} of {len(self.rows)} rows log both engines' logits (or kl_full_vocab)"
        return (f"the {self.layout} log holds the sampled tokens' log-probs only, no logits of either engine: the "
                "full-vocabulary KL needs both engines' rows (docs/rollouts.md: sampler_logits, learner_logits)")

    def padded(self) -> dict[str, torch.Tensor]:
        """(N, T) float64 learner / sampler, bool mask, kl (or None), (N,) long steps; right-padded."""
        n, t = len(self.rows), max((len(r.mask) for r in self.rows), default=0)
        out = {k: torch.zeros(n, t, dtype=torch.float64) for k in ("learner", "sampler")}
        out["mask"] = torch.zeros(n, t, dtype=torch.bool)
        kl = torch.zeros(n, t, dtype=torch.float64) if self.kl_reason() is None else None
        for i, r in enumerate(self.rows):
            k = len(r.mask)
            out["learner"][i, :k] = torch.tensor(r.learner, dtype=torch.float64)
            out["sampler"][i, :k] = torch.tensor(r.sampler, dtype=torch.float64)
            out["mask"][i, :k] = torch.tensor(r.mask, dtype=torch.bool)
            if kl is not None:
                kl[i, :k] = torch.tensor(r.kl, dtype=torch.float64)
        out["kl"] = kl
        out["steps"] = torch.tensor([r.step for r in self.rows], dtype=torch.long)
        return out


class BadRollout(ValueError):
    """A record that does not fit the schema: the message names file, row and column."""

    def __init__(self, path, row: int, column: str | None, what: str):
        where = f"{path}: row {row}" + (f": column {column!r}" if column else "")
        super().__init__(f"{where}: {what} (schema: docs/rollouts.md)")


# ---- files -> records ------------------------------------------------------------------------------------------
def expand(paths) -> list[Path]:
    """Files and directories -> the rollout files, a directory's in natural order (step 2 before step 10)."""
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            files = sorted((f for f in p.iterdir() if f.suffix in SUFFIXES),
                           key=lambda f: [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", f.name)])
            if not files:
                raise FileNotFoundError(f"{p}: no rollout files ({', '.join('*' + s for s in SUFFIXES)}) in it")
            out += files
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(f"{p} does not exist (a rollout log file or a directory of them)")
    return out


def records(path: Path):
    """-> (row number, record dict) of a JSONL / parquet file; a .pt dump is the layouts' (slime) business."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise RuntimeError(f"{path}: reading parquet needs pyarrow ({e}); pip install pyarrow") from None
        for i, rec in enumerate(pq.read_table(path).to_pylist(), 1):
            yield i, rec
        return
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise BadRollout(path, lineno, None, f"not a JSON line ({e.msg})") from None
            if not isinstance(rec, dict):
                raise BadRollout(path, lineno, None, f"expected a JSON object, got {type(rec).__name__}")
            yield lineno, rec


# ---- record checks (shared by every layout) ----------------------------------------------------------------------
def need(path, row: int, rec: dict, columns, layout: str) -> None:
    """Every column of `columns` is in the record, else the one-line error naming the first one missing."""
    for c in columns:
        if c not in rec:
            have = ", ".join(sorted(rec)) or "none"
            raise BadRollout(path, row, c, f"missing; the {layout} layout needs {', '.join(columns)} "
                                           f"(columns here: {have})")


def floats(path, row: int, rec: dict, column: str) -> list[float]:
    """rec[column] as a flat list of floats (a NaN stays NaN: checked against the mask later)."""
    v = rec[column]
    if isinstance(v, torch.Tensor):
        v = v.tolist()
    if not isinstance(v, (list, tuple)) or any(isinstance(x, (list, tuple)) for x in v):
        raise BadRollout(path, row, column, f"expected a flat list of numbers, one per token, got {_kind(v)}")
    try:
        return [math.nan if x is None else float(x) for x in v]
    except (TypeError, ValueError):
        raise BadRollout(path, row, column, "holds a value that is not a number") from None


def aligned(path, row: int, arrays: dict[str, list]) -> None:
    """Per-token arrays of one row must have one length (ragged or shifted logs fail here)."""
    (first, n0), *rest = [(k, len(v)) for k, v in arrays.items()]
    for k, n in rest:
        if n != n0:
            raise BadRollout(path, row, k, f"has {n} values, {first!r} has {n0}: per-token arrays of a row must align")


def checked(path, row: int, columns: tuple[str, str], learner: list[float], sampler: list[float],
            mask: list[bool]) -> None:
    """Counted tokens hold finite log-probs <= 0 (columns = the record's names of learner, sampler)."""
    for name, values in zip(columns, (learner, sampler)):
        for t, (x, m) in enumerate(zip(values, mask)):
            if m and not math.isfinite(x):
                raise BadRollout(path, row, name, f"{x} at token {t}: a counted token needs a finite log-prob")
            if m and x > LOGPROB_SLACK:
                raise BadRollout(path, row, name, f"{x} > 0 at token {t} is no log-prob (probabilities or "
                                                  "logits logged?)")


def step_of(path, row: int, value, column: str = "step") -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise BadRollout(path, row, column, f"expected an integer training step, got {value!r}")
    return int(value)


def _kind(v) -> str:
    return "a nested list" if isinstance(v, (list, tuple)) else type(v).__name__


# ---- the schema's own layout -------------------------------------------------------------------------------------
def minite_row(path, row: int, rec: dict, file_step: int | None) -> Row:
    """One record of the schema (module docstring) -> Row."""
    need(path, row, rec, REQUIRED, "minite")
    learner, sampler = floats(path, row, rec, "learner_logprobs"), floats(path, row, rec, "sampler_logprobs")
    arrays = {"learner_logprobs": learner, "sampler_logprobs": sampler}
    mask = [True] * len(learner)
    if rec.get("mask") is not None:
        arrays["mask"] = floats(path, row, rec, "mask")
        if any(x not in (0.0, 1.0) for x in arrays["mask"]):
            raise BadRollout(path, row, "mask", "expected 0/1 per token")
        mask = [x == 1.0 for x in arrays["mask"]]
    if rec.get("kl_full_vocab") is not None:
        arrays["kl_full_vocab"] = floats(path, row, rec, "kl_full_vocab")
    aligned(path, row, arrays)
    checked(path, row, ("learner_logprobs", "sampler_logprobs"), learner, sampler, mask)
    kl = arrays.get("kl_full_vocab")
    if kl is None and rec.get("sampler_logits") is not None and rec.get("learner_logits") is not None:
        kl = _kl_from_logits(path, row, rec, len(learner))
    if kl is not None and any(m and not (math.isfinite(x) and x >= -1e-12) for x, m in zip(kl, mask)):
        raise BadRollout(path, row, "kl_full_vocab", "a counted token's KL must be finite and >= 0")
    step = step_of(path, row, rec.get("step", file_step if file_step is not None else 0))
    pid = rec.get("prompt_id")
    return Row(step, learner, sampler, mask, None if pid is None else str(pid), kl)


def _kl_from_logits(path, row: int, rec: dict, T: int) -> list[float]:
    from minite_core.engines.learner import full_vocab_kl

    rows = {}
    for c in ("sampler_logits", "learner_logits"):
        try:
            rows[c] = torch.tensor(rec[c], dtype=torch.float64)
        except (TypeError, ValueError):
            raise BadRollout(path, row, c, "expected a T x V list of lists of numbers (ragged?)") from None
        if rows[c].dim() != 2 or rows[c].shape[0] != T:
            raise BadRollout(path, row, c, f"has shape {tuple(rows[c].shape)}, expected ({T}, V): one row per token")
    if rows["sampler_logits"].shape != rows["learner_logits"].shape:
        raise BadRollout(path, row, "learner_logits", f"has shape {tuple(rows['learner_logits'].shape)}, "
                                                      f"sampler_logits {tuple(rows['sampler_logits'].shape)}")
    return full_vocab_kl(rows["sampler_logits"], rows["learner_logits"]).tolist()
