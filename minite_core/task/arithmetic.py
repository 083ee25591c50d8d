"""Verifiable synthetic reasoning task: multi-digit arithmetic with a worked scratchpad.

What: a prompt such as ``47+85=\\n`` or ``478*56=\\n`` and a response that works the problem right to left, one
column (or one multiplier digit) per line, and ends with the line ``answer: N``. The reward checks only ``N``.

Why this task: RL on a tiny character-level model needs (a) an exactly verifiable reward, (b) responses in the
64–256 token range (the character tokenizer: tokens == characters; the BPE one of the GPU runs makes them ~0.53
token a character, 38–155 tokens) so that per-token learner/sampler mismatch accumulates over a realistic horizon,
and (c) graded difficulty so an SFT-pretrained base model is accurate on easy levels and only partially accurate on
hard ones (RL headroom). Everything is made locally and deterministically from explicit seeds; nothing is
downloaded.

Scratchpad format (every line but the last carries the running result after ``->``, so the answer line is a copy of
the previous line's running result — learnable for a small model; the carry is written explicitly as ``+c``):

    47+85=                      <- prompt
    add 47+85 by columns, right to left
    7+5+0=12 -> 2
    4+8+1=13 -> 132             <- last column writes the whole sum (the final carry)
    answer: 132

Multiplication by a one-digit multiplier uses ``d*x+c=s`` steps; by a two-digit multiplier, one block per
multiplier digit (``47*5 shift 1:``), then the two partial products are added column by column. Multiplier digits
are 1..9 (no zero digits), so every partial product is a proper number; the multiplicand may contain zeros.

Differs from the usual GSM8K-style RL task: difficulty is a parameter, not a property of a scraped data set, and the
response length per level is bounded by construction (``make_example`` checks the bound on every example).
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

from minite_core.seeds import task_stream_seed

RESPONSE_MIN_CHARS = 64  # DESIGN.md RL: responses are 64–256 tokens (= characters, character tokenizer)
RESPONSE_MAX_CHARS = 256
PROMPT_MAX_CHARS = 32


@dataclass(frozen=True)
class Level:
    """One difficulty level: ``op`` is "+" or "*"; operands have exactly ``digits_a`` / ``digits_b`` digits."""

    name: str
    op: str
    digits_a: int
    digits_b: int


# Ordered by (expected) difficulty; a level is referred to by its index or its name. Response lengths in characters
# (min–max; exhaustive for add2/mul3x1/mul2x2/mul3x2, 20k samples for add3/add5; tests/test_task.py checks the
# bounds): add2 73–77, add3 91–96, add5 130–137, mul3x1 93–98, mul2x2 153–180, mul3x2 205–236.
LEVELS: tuple[Level, ...] = (
    Level("add2", "+", 2, 2),    # 2 column steps: a tiny model should reach ~100%
    Level("add3", "+", 3, 3),
    Level("add5", "+", 5, 5),    # long carry chains
    Level("mul3x1", "*", 3, 1),  # single-digit products with carries
    Level("mul2x2", "*", 2, 2),  # two partial products + a column addition
    Level("mul3x2", "*", 3, 2),  # hardest: ~225 chars, expected to stay partially solved (RL headroom)
)
LEVEL_INDEX = {lv.name: i for i, lv in enumerate(LEVELS)}


@dataclass(frozen=True)
class TaskConfig:
    levels: tuple[int, ...] = tuple(range(len(LEVELS)))  # all levels: easy ones for SFT signal, hard ones for headroom
    seed: int = 0  # run seed; each (seed, level, split) gets its own random.Random stream (seeds.task_stream_seed)
    n_train_per_level: int = 4096  # distinct prompts; smallest level prompt space is add2 (8100) / mul2x2 (7290)
    n_heldout_per_level: int = 256  # binomial std err of accuracy <= 3.1 points per level


def level_index(level: int | str) -> int:
    """Normalise a level given by index or name; ValueError for an unknown level."""
    if isinstance(level, str):
        if level not in LEVEL_INDEX:
            raise ValueError(f"unknown level {level!r}; known: {sorted(LEVEL_INDEX)}")
        return LEVEL_INDEX[level]
    if not 0 <= int(level) < len(LEVELS):
        raise ValueError(f"level index {level} out of range [0, {len(LEVELS)})")
    return int(level)


def prompt_space_size(level: int | str) -> int:
    """Number of distinct prompts a level can produce (a split may not ask for more)."""
    lv = LEVELS[level_index(level)]
    n_a = 9 * 10 ** (lv.digits_a - 1)
    n_b = 9 * 10 ** (lv.digits_b - 1) if lv.op == "+" else 9 ** lv.digits_b  # multiplier digits are 1..9
    return n_a * n_b


# ----------------------------------------------------------------------------------------------- scratchpad
def _digits_le(n: int) -> list[int]:
    """Little-endian decimal digits of a non-negative integer."""
    return [int(c) for c in reversed(str(n))]


def _column_lines(a: int, b: int) -> list[str]:
    """``x+y+c=s -> running`` for each column right to left; the last column writes the whole s."""
    da, db = _digits_le(a), _digits_le(b)
    n = max(len(da), len(db))
    carry, acc, lines = 0, "", []
    for i in range(n):
        x = da[i] if i < len(da) else 0
        y = db[i] if i < len(db) else 0
        s = x + y + carry
        acc = (str(s) if i == n - 1 else str(s % 10)) + acc
        lines.append(f"{x}+{y}+{carry}={s} -> {acc}")
        carry = s // 10
    return lines


def _digit_product_lines(a: int, d: int) -> list[str]:
    """``d*x+c=s -> running`` for each digit x of a right to left; the last digit writes the whole s."""
    da = _digits_le(a)
    carry, acc, lines = 0, "", []
    for i, x in enumerate(da):
        s = d * x + carry
        acc = (str(s) if i == len(da) - 1 else str(s % 10)) + acc
        lines.append(f"{d}*{x}+{carry}={s} -> {acc}")
        carry = s // 10
    return lines


def solve(op: str, a: int, b: int) -> tuple[str, str]:
    """(response scratchpad, answer string) for ``a op b``. Pure; the single source of the task's format."""
    if op == "+":
        answer = a + b
        lines = [f"add {a}+{b} by columns, right to left", *_column_lines(a, b)]
    elif op == "*":
        answer = a * b
        db = _digits_le(b)
        if len(db) == 1:
            lines = [f"multiply {a}*{b} by digits, right to left", *_digit_product_lines(a, b)]
        elif len(db) == 2:
            lines = [f"multiply {a}*{b}"]
            for j, d in enumerate(db):
                lines.append(f"{a}*{d}" + (f" shift {j}" if j else "") + ":")
                lines += _digit_product_lines(a, d)
            p0, p1 = a * db[0], a * db[1] * 10
            lines.append(f"add {p0}+{p1}")
            lines += _column_lines(p0, p1)
        else:
            raise ValueError(f"multiplier {b} has {len(db)} digits; the format supports 1 or 2")
    else:
        raise ValueError(f"unknown op {op!r}")
    lines.append(f"answer: {answer}")
    return "\n".join(lines), str(answer)


def _sample_operands(rng: random.Random, lv: Level) -> tuple[int, int]:
    a = rng.randint(10 ** (lv.digits_a - 1), 10**lv.digits_a - 1)
    if lv.op == "+":
        b = rng.randint(10 ** (lv.digits_b - 1), 10**lv.digits_b - 1)
    else:  # multiplier digits 1..9: no all-zero partial products
        b = int("".join(str(rng.randint(1, 9)) for _ in range(lv.digits_b)))
    return a, b


def make_example(rng_or_seed: random.Random | int, level: int | str) -> dict:
    """One example ``{"prompt", "response", "answer", "level"}`` (answer a decimal string, level an index).

    ``rng_or_seed``: a ``random.Random`` (advanced in place) or an int seed (a fresh ``random.Random(seed)``).
    Raises RuntimeError if the format ever produces a response outside [64, 256] characters.
    """
    rng = rng_or_seed if isinstance(rng_or_seed, random.Random) else random.Random(int(rng_or_seed))
    li = level_index(level)
    lv = LEVELS[li]
    a, b = _sample_operands(rng, lv)
    response, answer = solve(lv.op, a, b)
    prompt = f"{a}{lv.op}{b}=\n"
    if not RESPONSE_MIN_CHARS <= len(response) <= RESPONSE_MAX_CHARS or len(prompt) >= PROMPT_MAX_CHARS:
        raise RuntimeError(f"level {lv.name}: prompt {len(prompt)} / response {len(response)} chars out of bounds")
    return {"prompt": prompt, "response": response, "answer": answer, "level": li}


# ----------------------------------------------------------------------------------------------- splits + IO
def _unique_examples(rng: random.Random, level: int, n: int, exclude: set[str]) -> list[dict]:
    if n + len(exclude) > prompt_space_size(level):
        raise ValueError(
            f"level {LEVELS[level].name}: asked for {n} prompts (+{len(exclude)} excluded) but only "
            f"{prompt_space_size(level)} distinct prompts exist"
        )
    out, seen = [], set(exclude)
    while len(out) < n:  # rejection sampling; terminates since n + |exclude| <= prompt space
        ex = make_example(rng, level)
        if ex["prompt"] not in seen:
            seen.add(ex["prompt"])
            out.append(ex)
    return out


def make_splits(cfg: TaskConfig) -> tuple[list[dict], list[dict]]:
    """(train, heldout): distinct prompts within and across splits, ordered by level then draw.

    Held-out is drawn first from its own stream, so it does not change when ``n_train_per_level`` changes.
    """
    train, heldout = [], []
    for level in cfg.levels:
        li = level_index(level)
        held = _unique_examples(random.Random(task_stream_seed(cfg.seed, li, 1)), li, cfg.n_heldout_per_level, set())
        tr = _unique_examples(
            random.Random(task_stream_seed(cfg.seed, li, 0)), li, cfg.n_train_per_level, {e["prompt"] for e in held}
        )
        heldout += held
        train += tr
    return train, heldout


# ----------------------------------------------------------------------------------------------- reward
_ANSWER_RE = re.compile(r"^[ \t]*answer:[ \t]*(-?\d+)[ \t]*$", re.MULTILINE)


def extract_answer(text: str) -> str | None:
    """The integer on the last well-formed ``answer: N`` line (own line, digits only), or None."""
    matches = _ANSWER_RE.findall(text)
    return matches[-1] if matches else None


def reward(response_text: str, answer: str | int, format_credit: float = 0.0) -> float:
    """1.0 if the final ``answer:`` line equals ``answer`` as an integer; ``format_credit`` if the line is well formed
    but wrong; 0.0 if there is no well-formed answer line."""
    got = extract_answer(response_text)
    if got is None:
        return 0.0
    return 1.0 if int(got) == int(answer) else float(format_credit)


# ----------------------------------------------------------------------------------------------- multiple choice
def _distractor_candidates(value: int) -> set[int]:
    """Plausible slips: off by one carry (±10^k), one digit ±1, two adjacent digits swapped."""
    s = str(value)
    cands = {value + sign * 10**k for k in range(len(s)) for sign in (1, -1)}
    for i in range(len(s)):
        for delta in (1, -1):
            d = int(s[i]) + delta
            if 0 <= d <= 9:
                cands.add(int(s[:i] + str(d) + s[i + 1 :]))
        if i + 1 < len(s):
            cands.add(int(s[:i] + s[i + 1] + s[i] + s[i + 2 :]))
    return cands


def choices(example: dict, n: int, seed: int) -> list[str]:
    """``n`` distinct answer strings, the correct one among them at a seed-chosen position; distractors are plausible
    slips with the same number of digits as the answer (no length cue). Deterministic in (example, n, seed)."""
    if n < 2:
        raise ValueError(f"need n >= 2 choices, got {n}")
    rng = random.Random(seed)
    value = int(example["answer"])
    width = len(str(value))
    ok = lambda v: v != value and v >= 0 and len(str(v)) == width  # noqa: E731
    pool = sorted(v for v in _distractor_candidates(value) if ok(v))
    rng.shuffle(pool)
    picked = pool[: n - 1]
    lo, hi = (10 ** (width - 1) if width > 1 else 0), 10**width - 1
    if hi - lo + 1 < n:
        raise ValueError(f"answer {value} has too few same-width numbers for {n} choices")
    while len(picked) < n - 1:  # tiny answers: top up with random same-width numbers
        v = rng.randint(lo, hi)
        if ok(v) and v not in picked:
            picked.append(v)
    out = [str(v) for v in picked]
    out.insert(rng.randrange(n), str(value))
    return out
