"""Other RL frameworks' rollout dumps, read into the schema of diagnostics.rollouts (and NeMo-RL's, also written).

Each layout is taken from the framework's own code (repository, path), not guessed:

nemo-rl — NVIDIA-NeMo/RL, nemo_rl/algorithms/grpo.py (the "Logging" block of the training loop) through
  nemo_rl/utils/logger.py `Logger.log_batched_dict_as_jsonl`: `<log_dir>/train_data_step{N}.jsonl`, one line per
  sample, written from a BatchedDataDict sliced one sample at a time, so every value is a batch of ONE
  (`"token_loss_mask": [[0, 0, 1, 1]]`, `"sample_loss_mask": [1]`), plus `"idx"`. Keys: content (the messages'
  texts), rewards, input_lengths, token_ids, token_loss_mask, sample_loss_mask, advantages, generation_logprobs
  (the generation engine's, 0 off the response), prev_logprobs (the policy's, "old"). Arrays span the whole padded
  sequence with entry t the log-prob OF token t (entry 0 has none): the loss (nemo_rl/algorithms/loss/
  loss_functions.py) drops column 0 (`[:, 1:]`) and counts token_loss_mask * sample_loss_mask. The step is the N
  of the file name.
slime — THUDM/slime, slime/observability/train_data_utils.py `save_debug_train_data` (`--save-debug-train-data`,
  default `{dump_details}/train_data/{rollout_id}.pt`): `torch.save` of {"format_version": 2, "rollout_id",
  "samples": [per-sample dicts], "dp_shards", ...}; a sample holds `rollout_log_probs` (the rollout engine's) and
  `log_probs` (the trainer's; slime/backends/megatron_utils/actor.py captures them from the training forward when
  not recomputed), `loss_masks` and `response_lengths` (slime/ray/rollout.py `_convert_samples_to_train_data`):
  response tokens only, one entry each. Read with `torch.load(weights_only=True)`: tensors and plain data only,
  no code runs.
verl — verl-project/verl, verl/trainer/ppo/ray_trainer.py `_log_rollout_data` / `_write_generations`
  (`trainer.rollout_data_dir`): `<dir>/{global_step}.jsonl`, one line per sample with input, output, gts, score,
  step, and every per-sample list of the reward-extra-info dict. The per-token arrays carry verl's batch keys
  (verl/utils/debug/metrics.py, rollout_corr_helper.py): `rollout_log_probs` (the rollout engine's), `old_log_probs`
  (the actor's), `response_mask`, response tokens only. verl's dump holds them when they are put in that dict (one
  list per sample); its stock dump has text and scores only.
minite — this project's own schema (docs/rollouts.md).

`load` detects the layout from a file's first record (or takes `layout`), and every record goes through the
shared checks (rollouts.py): one line naming file, row and column on a bad one.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from minite_core.diagnostics.rollouts import (
    BadRollout, Row, Rollouts, aligned, checked, expand, floats, minite_row, need, records, step_of)
from minite_core.results import atomic_write_bytes

NEMO_RL_FILE = "train_data_step{step}.jsonl"
NEMO_RL_KEYS = ("generation_logprobs", "prev_logprobs", "token_loss_mask")
VERL_KEYS = ("rollout_log_probs", "old_log_probs")
SLIME_KEYS = ("rollout_log_probs", "log_probs", "loss_masks")


def _unbatch(v, array: bool):
    """NeMo-RL's batch-of-one value -> the value: [[a, b, ...]] -> [a, b, ...] (array), [x] -> x (scalar)."""
    if isinstance(v, list) and len(v) == 1 and (isinstance(v[0], list) or not array):
        return v[0]
    return v


def nemo_rl_row(path, row: int, rec: dict, file_step: int | None) -> Row:
    need(path, row, rec, NEMO_RL_KEYS, "nemo-rl")
    rec = {k: _unbatch(v, k != "sample_loss_mask") if k in NEMO_RL_KEYS + ("sample_loss_mask",) else v
           for k, v in rec.items()}
    gen, prev = floats(path, row, rec, "generation_logprobs"), floats(path, row, rec, "prev_logprobs")
    tmask = floats(path, row, rec, "token_loss_mask")
    aligned(path, row, {"token_loss_mask": tmask, "generation_logprobs": gen, "prev_logprobs": prev})
    keep = float(rec.get("sample_loss_mask", 1) or 0)
    counted = [t for t in range(1, len(tmask)) if tmask[t] * keep]  # column 0 dropped, as the loss does
    lo, hi = (counted[0], counted[-1] + 1) if counted else (len(tmask), len(tmask))
    mask = [bool(tmask[t] * keep) for t in range(lo, hi)]
    learner, sampler = prev[lo:hi], gen[lo:hi]
    checked(path, row, ("prev_logprobs", "generation_logprobs"), learner, sampler, mask)
    if file_step is None:
        raise BadRollout(path, row, None, "a nemo-rl dump carries its step in the file name "
                                          "(train_data_step{N}.jsonl); rename the file or pass --format minite")
    return Row(file_step, learner, sampler, mask)


def verl_row(path, row: int, rec: dict, file_step: int | None) -> Row:
    need(path, row, rec, VERL_KEYS + ("step",), "verl")
    old, rollout = floats(path, row, rec, "old_log_probs"), floats(path, row, rec, "rollout_log_probs")
    arrays = {"old_log_probs": old, "rollout_log_probs": rollout}
    mask = [True] * len(old)
    if rec.get("response_mask") is not None:
        arrays["response_mask"] = floats(path, row, rec, "response_mask")
        mask = [bool(x) for x in arrays["response_mask"]]
    aligned(path, row, arrays)
    checked(path, row, ("old_log_probs", "rollout_log_probs"), old, rollout, mask)
    pid = rec.get("uid", rec.get("request_id"))
    return Row(step_of(path, row, rec["step"]), old, rollout, mask, None if pid is None else str(pid))


def slime_rows(path: Path) -> list[Row]:
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is one line naming it
        raise BadRollout(path, 1, None, f"not a slime train-data dump torch.load can read safely ({e})") from None
    if not isinstance(payload, dict) or "samples" not in payload:
        raise BadRollout(path, 1, None, "a slime dump is a dict with 'samples' (--save-debug-train-data, "
                                        "format_version 2)")
    step = step_of(path, 1, payload.get("rollout_id", 0), "rollout_id")
    rows = []
    for i, s in enumerate(payload["samples"], 1):
        need(path, i, s, SLIME_KEYS, "slime")
        learner, sampler = floats(path, i, s, "log_probs"), floats(path, i, s, "rollout_log_probs")
        lm = floats(path, i, s, "loss_masks")
        aligned(path, i, {"loss_masks": lm, "log_probs": learner, "rollout_log_probs": sampler})
        if "response_lengths" in s and int(s["response_lengths"]) != len(lm):
            raise BadRollout(path, i, "loss_masks", f"has {len(lm)} values, response_lengths says "
                                                    f"{int(s['response_lengths'])}")
        mask = [bool(x) for x in lm]
        checked(path, i, ("log_probs", "rollout_log_probs"), learner, sampler, mask)
        pid = s.get("sample_index")
        rows.append(Row(step, learner, sampler, mask, None if pid is None else str(pid)))
    return rows


ROW_READERS = {"minite": minite_row, "nemo-rl": nemo_rl_row, "verl": verl_row}
LAYOUTS = ("minite", "nemo-rl", "slime", "verl")


def detect(path: Path, rec: dict) -> str:
    """The layout of a JSONL / parquet file from its first record."""
    for layout, keys in (("minite", ("sampler_logprobs", "learner_logprobs")), ("nemo-rl", NEMO_RL_KEYS),
                         ("verl", VERL_KEYS)):
        if all(k in rec for k in keys):
            return layout
    raise BadRollout(path, 1, None, f"columns ({', '.join(sorted(rec)) or 'none'}) match no known layout: minite "
                                    "needs sampler_logprobs + learner_logprobs, nemo-rl generation_logprobs + "
                                    "prev_logprobs + token_loss_mask, verl rollout_log_probs + old_log_probs; "
                                    "or pass --format")


def _file_step(path: Path) -> int | None:
    m = re.search(r"step_?(\d+)", path.stem) or re.fullmatch(r"(\d+)", path.stem)
    return int(m.group(1)) if m else None


def load(paths, *, name: str, layout: str = "auto") -> Rollouts:
    """Rollout files / directories of ONE engine pair -> Rollouts (every record checked)."""
    if layout not in ("auto",) + LAYOUTS:
        raise ValueError(f"--format {layout!r}: one of auto, {', '.join(LAYOUTS)}")
    files = expand(paths)
    out = Rollouts(name=name, layout=layout, files=[str(f) for f in files])
    for f in files:
        if f.suffix == ".pt":
            if layout not in ("auto", "slime"):
                raise ValueError(f"{f}: a .pt file is a slime dump; --format {layout} reads .jsonl / .parquet")
            found, rows = "slime", slime_rows(f)
        else:
            found, rows = None, []
            for row, rec in records(f):
                found = found or (detect(f, rec) if layout == "auto" else layout)
                if found == "slime":
                    raise ValueError(f"{f}: --format slime reads the .pt dumps of --save-debug-train-data")
                rows.append(ROW_READERS[found](f, row, rec, _file_step(f)))
        if found is None:
            continue  # an empty file
        if out.layout not in ("auto", found):
            raise ValueError(f"{f}: layout {found}, but the pair's other files are {out.layout}; one pair, one layout")
        out.layout = found
        out.rows += rows
    if not out.rows:
        raise ValueError(f"{', '.join(map(str, paths))}: no rollout records")
    return out


def write_nemo_rl_step(directory, step: int, *, prompt_ids: list[list[int]], response_ids: list[list[int]],
                       logp_sampler: torch.Tensor, logp_learner: torch.Tensor, mask: torch.Tensor,
                       rewards: list[float], advantages: list[float], contents: list[list[str]]) -> Path:
    """One RL step's rollouts as NeMo-RL's train_data_step{N}.jsonl (module docstring), atomically.
    logp_* / mask: (N, T) over the response tokens; the file spans prompt + response, padded to the longest."""
    S = max(len(p) + len(r) for p, r in zip(prompt_ids, response_ids))
    lines = []
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        P, R = len(p), len(r)
        pad = [0.0] * (S - P - R)
        m = [float(x) for x in mask[i, :R].tolist()]
        seq = lambda vals: [0.0] * P + vals + pad  # noqa: E731 - a response-token array on the full sequence
        rec = {"content": [contents[i]], "rewards": [rewards[i]], "input_lengths": [P + R],
               "token_ids": [p + r + [0] * (S - P - R)], "token_loss_mask": [[int(x) for x in seq(m)]],
               "sample_loss_mask": [1], "advantages": [seq([advantages[i] * x for x in m])],
               "generation_logprobs": [seq(logp_sampler[i, :R].tolist())],
               "prev_logprobs": [seq(logp_learner[i, :R].tolist())], "idx": i}
        lines.append(json.dumps(rec))
    return atomic_write_bytes(Path(directory) / NEMO_RL_FILE.format(step=step), ("\n".join(lines) + "\n").encode())


def prune_steps_after(directory, step: int) -> None:
    """Remove the train_data_step{N}.jsonl files with N > step (a resumed run rewrites them)."""
    for f in Path(directory).glob("train_data_step*.jsonl"):
        if (_file_step(f) or 0) > step:
            f.unlink()
