"""The math reward (task/math_reward.py) on a table of responses and ground truths: extraction order, normalisation,
and the comparison (exact fractions, then Math-Verify)."""
import pytest

from minite_core.task.math_reward import as_fraction, extract_answer, math_reward, normalize

# (response, ground truth, reward)
CASES = [
    # --- extraction: \boxed wins, then ####, then "Answer:", then the last number
    ("so the total is \\boxed{42}.", "42", 1.0),
    ("first 3, then \\boxed{7}, finally \\boxed{42}", "42", 1.0),
    ("\\boxed{7} and later #### 42", "42", 0.0),  # a box beats ####
    ("She pays 5+7=12 dollars.\n#### 12", "12", 1.0),
    ("#### 10\nwait, #### 12", "12", 1.0),  # the last ####
    ("Step 1: 3*4=12\nAnswer: 12", "12", 1.0),  # DAPO-Math's last line
    ("answer: 13", "12", 0.0),
    ("He has 3 apples and buys 4 more, so 7 apples", "7", 1.0),  # last number
    ("The numbers are 7 and 8", "7", 0.0),
    ("I do not know.", "7", 0.0),  # no answer at all
    ("", "7", 0.0),
    ("\\boxed{\\frac{1}{2", "1/2", 0.0),  # unbalanced box: cut mid-answer, falls back to the last number
    ("the result is \\boxed{{3}}", "3", 1.0),  # nested braces
    ("\\fbox{9}", "9", 1.0),
    # --- integers and thousands separators
    ("#### 1,234", "1234", 1.0),
    ("\\boxed{1,234,567}", "1234567", 1.0),
    ("#### 1234", "1,234", 1.0),
    ("\\boxed{-5}", "-5", 1.0),
    ("\\boxed{-5}", "5", 0.0),
    ("\\boxed{0}", "0", 1.0),
    # --- decimals
    ("\\boxed{18.00}", "18", 1.0),
    ("#### 0.5", ".5", 1.0),
    ("\\boxed{2.50}", "2.5", 1.0),
    ("\\boxed{2.51}", "2.5", 0.0),
    ("\\boxed{0.333}", "1/3", 0.0),  # a rounded decimal is not the fraction
    # --- fractions, simple LaTeX
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{\\dfrac{3}{4}}", "3/4", 1.0),
    ("\\boxed{\\tfrac{3}{4}}", "\\frac{3}{4}", 1.0),
    ("\\boxed{6/8}", "\\frac{3}{4}", 1.0),
    ("\\boxed{-\\frac{2}{3}}", "-\\frac{2}{3}", 1.0),
    ("\\boxed{\\frac{2}{3}}", "-\\frac{2}{3}", 0.0),
    ("\\boxed{\\frac{14}{3}}", "\\frac{14}{3}", 1.0),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
    ("\\boxed{\\sqrt{3}}", "\\sqrt{2}", 0.0),
    ("\\boxed{\\pi r^2}", "\\pi r^2", 1.0),
    ("\\boxed{(1,2)}", "(1, 2)", 1.0),
    ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    # --- $...$, units, percent, degrees, text
    ("The answer is $\\boxed{72}$.", "72", 1.0),
    ("#### $18", "18", 1.0),
    ("\\boxed{\\$18}", "18", 1.0),
    ("\\boxed{72 dollars}", "72", 1.0),
    ("\\boxed{5\\text{ cm}}", "5", 1.0),
    ("\\boxed{10\\%}", "10", 1.0),
    ("\\boxed{90^\\circ}", "90", 1.0),
    ("\\boxed{\\text{(B)}}", "B", 1.0),
    ("#### 12.", "12", 1.0),
    # --- ground truths in their own formats
    ("#### 7", "Alice has 3+4=7 apples.\n#### 7", 1.0),  # GSM8K's full answer field
    ("\\boxed{7}", "so she has \\boxed{7}", 1.0),  # MATH's full solution field
]


@pytest.mark.parametrize("response,truth,expected", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_reward_table(response, truth, expected):
    assert math_reward(response, truth) == expected


def test_table_is_large_and_has_both_outcomes():
    assert len(CASES) >= 40
    assert {e for _, _, e in CASES} == {0.0, 1.0}


def test_extraction_order_and_normalisation():
    assert extract_answer("\\boxed{a} #### b Answer: c 9") == "a"
    assert extract_answer("#### b\nAnswer: c") == "b"
    assert extract_answer("Answer: c\n9") == "c"
    assert extract_answer("1, 2 and 3") == "3"
    assert extract_answer("nothing") is None
    assert normalize("$1,234.$") == "1234"
    assert normalize("\\$ 5\\,000") == "5000"
    assert normalize("(1,2)") == "(1,2)"  # not a thousands separator
    assert as_fraction("\\frac{-3}{4}") == as_fraction("-0.75") == as_fraction("-3/4")
    assert as_fraction("1/0") is None and as_fraction("x") is None
