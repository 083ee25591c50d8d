"""Which task a data set is, and what the stages do with its rows — one interface for the RL loop, the held-out
evaluation, calibration and the diagnostics' prompts.

Two tasks: the project's arithmetic task (`minite data`'s rows: prompt, response, answer, level index; the
character tokenizer's conventions, task/tokenizer.py) and math problems from your files (task/math_data.py: chat
messages through the tokenizer's chat template, the math reward). `task_of(rows)` picks one by the rows' `task`
field ("math"; absent = arithmetic), so every stage that reads a data directory treats it alike.

The interface (duck-typed; both classes implement it):
    prompt_ids(tok, rows) -> [[int]]          what the sampler is fed
    reward(text, row, format_credit) -> float the verifiable reward of a decoded response
    decode(tok, ids) -> str                   a response's text (stop tokens dropped)
    stop_ids(tok) -> (int, ...)               tokens that end a response (kept in it)
    group(row) -> str                         the per-group breakdown of accuracies (level / data source)
    calibration_sequences(tok, rows) -> [[int]]   token sequences that calibrate static activation scales
    max_new_tokens(tok, rows) -> int | None   the response budget the data implies (None: none; config's)
"""
from __future__ import annotations

from minite_core.task import arithmetic
from minite_core.task.math_data import MathTask
from minite_core.task.tokenizer import EOS_ID, calibration_sequences, decode_response, encode


class ArithmeticTask:
    """The project's arithmetic task (task/arithmetic.py) under the character tokenizer."""

    name = "arithmetic"

    def prompt_ids(self, tok, rows: list[dict]) -> list[list[int]]:
        return encode(tok, rows)[0]

    def reward(self, text: str, row: dict, format_credit: float = 0.0) -> float:
        return arithmetic.reward(text, row["answer"], format_credit)

    def decode(self, tok, ids: list[int]) -> str:
        return decode_response(tok, ids)

    def stop_ids(self, tok) -> tuple[int, ...]:
        del tok
        return (EOS_ID,)

    def group(self, row: dict) -> str:
        return arithmetic.LEVELS[int(row["level"])].name

    def calibration_sequences(self, tok, rows: list[dict]) -> list[list[int]]:
        return calibration_sequences(tok, rows)

    def max_new_tokens(self, tok, rows: list[dict]) -> int:
        """The longest reference response in tokens + <eos> + 16 tokens of slack for a wrong, longer one."""
        return max(len(ids) for ids in tok([r["response"] for r in rows], add_special_tokens=False)["input_ids"]) + 17


ARITHMETIC, MATH = ArithmeticTask(), MathTask()


def task_of(rows: list[dict]):
    """The task of a data set's rows (module docstring); mixed rows are an error."""
    if not rows:
        raise ValueError("no rows: an empty data set has no task")
    kinds = {r.get("task", "arithmetic") for r in rows}
    if len(kinds) > 1:
        raise ValueError(f"rows of several tasks in one data set: {sorted(kinds)}")
    kind = kinds.pop()
    if kind not in (ARITHMETIC.name, MATH.name):
        raise ValueError(f"unknown task {kind!r} in the rows' `task` field; one of arithmetic, math")
    return MATH if kind == MATH.name else ARITHMETIC
