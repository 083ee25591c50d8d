"""The math reward: the final answer of a response, compared with the ground truth after normalisation.

What (`math_reward(response, ground_truth) -> 1.0 | 0.0`):
1. `extract_answer(response)` takes the final answer the way the open recipes' rewards do, first match wins:
   the last `\\boxed{...}` (braces balanced; MATH, Qwen's prompt), the last `#### ...` (GSM8K; verl's
   `gsm8k.py` reward), the last `Answer: ...` line (DAPO-Math's prompt; verl's `math_dapo.py`), else the last
   number in the text (verl's "flexible" GSM8K extraction).
2. `normalize` strips what does not change the value: `$...$` and `\\$`, `\\text{...}` / `\\mathrm{...}` wrappers,
   spacing commands (`\\,` `\\!` `\\;`), thousands separators (`1,234`), a trailing full stop, `^\\circ` and `%`,
   `\\dfrac` / `\\tfrac` (-> `\\frac`), and a trailing unit word (`72 dollars`, `5 cm`).
3. `same_answer(pred, gold)`: both plain numbers (integers, decimals, `a/b`, `\\frac{a}{b}`) compare exactly as
   fractions; anything else goes through Math-Verify (`math_verify.parse` + `verify`: LaTeX and plain expressions
   parsed to sympy and compared symbolically, intervals, tuples and sets included).

Why Math-Verify and not a string comparison: `\\frac{1}{2}`, `0.5` and `1/2` are one answer, and so are
`2\\sqrt{2}` and `\\sqrt{8}`; Math-Verify (Hugging Face, the verifier of open-r1 and of lm-eval's
`minerva_math` `math_verify` metric) settles those symbolically. It runs under a signal-based timeout, which
works only on the main thread; elsewhere it runs without one (`_timeout`).
Tested on a table of cases (tests/test_math_reward.py).
"""
from __future__ import annotations

import re
import threading
from fractions import Fraction

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_HASHES = re.compile(r"####\s*([^\n]+)")
_ANSWER_LINE = re.compile(r"(?i)answer\s*(?:is)?\s*:\s*([^\n]+)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_THOUSANDS = re.compile(r"(?<![\d.])(-?\d{1,3}(?:,\d{3})+)(?![\d,])")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
_UNIT = re.compile(r"(?<=\d)\s*(?:[a-zA-Z]+\.?)(?:\s*[a-zA-Z]+\.?)?$")
_FRAC = re.compile(r"^(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}$")
_SIMPLE = re.compile(r"^-?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+)?$")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`), braces balanced; None without one."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    i = start = starts[-1]
    depth = 1
    while i < len(text):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
        i += 1
    return None  # unbalanced: the response was cut inside the box


def extract_answer(text: str) -> str | None:
    """The response's final answer (module docstring, item 1); None when it has none."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    for pattern in (_HASHES, _ANSWER_LINE):
        found = pattern.findall(text)
        if found:
            return found[-1].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def normalize(answer: str) -> str:
    """Strip what does not change the value (module docstring, item 2)."""
    s = answer.strip()
    s = s.replace("\\$", "").replace("$", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("\\left", "").replace("\\right", "")
    for cmd in ("\\,", "\\!", "\\;", "\\ ", "~"):
        s = s.replace(cmd, "")
    s = _TEXT.sub(r"\1", s)
    s = s.replace("^\\circ", "").replace("^{\\circ}", "").replace("\\%", "").replace("%", "")
    s = _THOUSANDS.sub(lambda m: m.group(1).replace(",", ""), s)
    s = s.strip().rstrip(".").strip()
    s = _UNIT.sub("", s) if re.match(r"^-?[\d.,/]+\s*[a-zA-Z]", s) else s
    return s.strip()


def as_fraction(s: str) -> Fraction | None:
    """A plain number (integer, decimal, a/b, \\frac{a}{b}) as an exact fraction; None for anything else."""
    m = _FRAC.match(s)
    if m:
        sign, num, den = m.groups()
        return None if int(den) == 0 else (-1 if sign else 1) * Fraction(int(num), int(den))
    if not _SIMPLE.match(s):
        return None
    num, _, den = s.partition("/")
    if den and int(den) == 0:
        return None
    return Fraction(num) / (Fraction(den) if den else 1)


def _timeout(seconds: int) -> int | None:
    """Math-Verify's timeout uses SIGALRM: main thread only."""
    return seconds if threading.current_thread() is threading.main_thread() else None


def same_answer(pred: str, gold: str) -> bool:
    """`pred` and `gold` (normalised answers) are the same value (module docstring, item 3)."""
    if pred == gold:
        return True
    a, b = as_fraction(pred), as_fraction(gold)
    if a is not None and b is not None:
        return a == b
    from math_verify import parse, verify  # imported on first use: sympy and the LaTeX grammar load in ~1 s

    t = _timeout(5)
    gold_parsed = parse(f"${gold}$", parsing_timeout=t)
    pred_parsed = parse(f"${pred}$", parsing_timeout=t)
    return bool(gold_parsed and pred_parsed and verify(gold_parsed, pred_parsed, timeout_seconds=t))


def math_reward(response: str, ground_truth: str) -> float:
    """1.0 when the response's final answer equals the ground truth (module docstring), else 0.0."""
    pred = extract_answer(response)
    if pred is None:
        return 0.0
    gold = extract_answer(ground_truth) if "####" in ground_truth or "\\boxed" in ground_truth else ground_truth
    return float(same_answer(normalize(pred), normalize(gold or "")))
