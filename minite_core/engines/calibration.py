"""Calibrating a model's static activation scales on task examples — the one path every stage takes.

`calibrate_on_examples(model, tok, rows, n=, seed=)`: the run seed picks `n` of the rows (task.data
`calibration_examples`), each becomes the task's calibration sequence (task/tasks.py: <bos> + prompt + response +
<eos> for the arithmetic task, chat-templated prompt + solution + turn end for your math data),
they are batched by `model.calibration_batches` (fixed batch size, right padding, attention mask) and
`model.calibrate` records each GEMM's input amax over real tokens only. RL (`minite rl`), lm-eval (`minite eval`),
diagnostics (`minite diagnose --calib`), the NVFP4 export (`minite export --calib-jsonl`) and the vLLM comparison
all call this, so one checkpoint and one set of examples give one set of static scales (tests/test_calibration.py).
"""
from __future__ import annotations

from minite_core.model.calibrate import calibrate
from minite_core.model.calibrate import calibration_batches
from minite_core.task.data import calibration_examples
from minite_core.task.tasks import task_of
from minite_core.task.tokenizer import PAD_ID


def calibrate_on_examples(model, tok, rows: list[dict], *, n: int, seed: int) -> dict:
    """Set `input_amax` on every calibratable GEMM from `n` of `rows` (chosen by `seed`) -> a description for the
    result's config: {"examples", "seed", "max_amax"}."""
    chosen = calibration_examples(rows, n, seed)
    device = model.lm_head.weight.device
    batches = calibration_batches(task_of(rows).calibration_sequences(tok, chosen), pad_id=PAD_ID, device=device)
    amax = calibrate(model, batches)
    return {"examples": len(chosen), "seed": seed, "max_amax": max(amax.values())}


def calibrate_on_sequences(model, sequences: list[list[int]]) -> dict:
    """The same for token sequences that are not task examples (random tokens, `minite diagnose` without --calib)."""
    amax = calibrate(model, calibration_batches(sequences, pad_id=PAD_ID, device=model.lm_head.weight.device))
    return {"sequences": len(sequences), "max_amax": max(amax.values())}
