"""Synthetic arithmetic task (format, lengths, splits, reward, choices) and the character-level tokenizer."""
from __future__ import annotations

import itertools
import random

import pytest

from minite_core.task.arithmetic import (
    LEVELS,
    PROMPT_MAX_CHARS,
    RESPONSE_MAX_CHARS,
    RESPONSE_MIN_CHARS,
    TaskConfig,
    choices,
    extract_answer,
    level_index,
    make_example,
    make_splits,
    prompt_space_size,
    reward,
    solve,
)
from minite_core.task.jsonl import read_jsonl, write_jsonl
from minite_core.task.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    VOCAB,
    build_tokenizer,
    load_tokenizer,
    save_tokenizer,
)

SMALL = TaskConfig(n_train_per_level=64, n_heldout_per_level=16)  # fast splits for the tests


def _operands(level: int):
    """All (a, b) operand pairs of a level (multiplier digits 1..9), as make_example can draw them."""
    lv = LEVELS[level]
    a_range = range(10 ** (lv.digits_a - 1), 10**lv.digits_a)
    if lv.op == "+":
        b_range = range(10 ** (lv.digits_b - 1), 10**lv.digits_b)
    else:
        b_range = [int("".join(d)) for d in itertools.product("123456789", repeat=lv.digits_b)]
    return itertools.product(a_range, b_range)


# ----------------------------------------------------------------------------------------------- format + lengths
def test_example_format():
    ex = make_example(7, "add2")
    assert set(ex) == {"prompt", "response", "answer", "level"}
    assert ex["level"] == 0 and ex["prompt"].endswith("=\n")
    assert ex["response"].splitlines()[-1] == f"answer: {ex['answer']}"
    response, answer = solve("+", 47, 85)
    assert response == "add 47+85 by columns, right to left\n7+5+0=12 -> 2\n4+8+1=13 -> 132\nanswer: 132"
    assert answer == "132"
    response, answer = solve("*", 47, 56)
    assert response.splitlines()[1:4] == ["47*6:", "6*7+0=42 -> 2", "6*4+4=28 -> 282"]
    assert "add 282+2350" in response and answer == str(47 * 56)
    with pytest.raises(ValueError):
        level_index("add9")
    with pytest.raises(ValueError):
        make_example(0, len(LEVELS))


@pytest.mark.parametrize("level", range(len(LEVELS)))
def test_response_length_bounds_and_correctness(level):
    """Exhaustive where the level has <= 10^5 prompts, else 5000 samples; every response is in [64, 256] chars,
    every character is in the tokenizer's vocabulary, and the scratchpad's answer is the true result."""
    lv = LEVELS[level]
    vocab = set(VOCAB)
    if prompt_space_size(level) <= 100_000:
        pairs = list(_operands(level))
    else:
        rng = random.Random(level)
        pairs = [(int(e["prompt"].split(lv.op)[0]), int(e["prompt"][:-2].split(lv.op)[1]))
                 for e in (make_example(rng, level) for _ in range(5000))]
    lengths = []
    for a, b in pairs:
        response, answer = solve(lv.op, a, b)
        assert int(answer) == (a + b if lv.op == "+" else a * b)
        assert extract_answer(response) == answer
        lengths.append(len(response))
        assert set(response) <= vocab
    assert RESPONSE_MIN_CHARS <= min(lengths) and max(lengths) <= RESPONSE_MAX_CHARS, (lv.name, min(lengths))
    print(f"{lv.name}: {min(lengths)}-{max(lengths)} chars, mean {sum(lengths) / len(lengths):.1f}")


def test_prompt_length_and_vocab():
    for level in range(len(LEVELS)):
        ex = make_example(level, level)
        assert len(ex["prompt"]) < PROMPT_MAX_CHARS and set(ex["prompt"]) <= set(VOCAB)


# ----------------------------------------------------------------------------------------------- determinism + splits
def test_determinism():
    assert make_example(123, "mul3x2") == make_example(random.Random(123), 5)
    assert make_example(123, "mul3x2") != make_example(124, "mul3x2")
    assert make_splits(SMALL) == make_splits(SMALL)
    other = make_splits(TaskConfig(seed=1, n_train_per_level=64, n_heldout_per_level=16))
    assert other[0] != make_splits(SMALL)[0]
    state = random.getstate()
    make_splits(SMALL)
    assert random.getstate() == state  # no global RNG


def test_splits_disjoint_and_sized():
    train, heldout = make_splits(SMALL)
    assert len(train) == len(LEVELS) * 64 and len(heldout) == len(LEVELS) * 16
    tr, he = [e["prompt"] for e in train], [e["prompt"] for e in heldout]
    assert len(set(tr)) == len(tr) and len(set(he)) == len(he) and not set(tr) & set(he)
    assert sorted({e["level"] for e in heldout}) == list(range(len(LEVELS)))
    # held-out does not depend on the train size
    bigger = make_splits(TaskConfig(n_train_per_level=128, n_heldout_per_level=16))
    assert bigger[1] == heldout
    with pytest.raises(ValueError):
        make_splits(TaskConfig(levels=(0,), n_train_per_level=prompt_space_size(0), n_heldout_per_level=1))


def test_jsonl_roundtrip(tmp_path):
    train, _ = make_splits(TaskConfig(levels=(0, 5), n_train_per_level=8, n_heldout_per_level=2))
    path = tmp_path / "sub" / "train.jsonl"
    write_jsonl(train, path)
    assert read_jsonl(path) == train
    assert path.read_text().count("\n") == len(train)


# ----------------------------------------------------------------------------------------------- reward
def test_reward():
    ex = make_example(3, "mul2x2")
    assert reward(ex["response"], ex["answer"]) == 1.0
    assert reward(ex["response"], int(ex["answer"])) == 1.0
    wrong = ex["response"].rsplit("\n", 1)[0] + f"\nanswer: {int(ex['answer']) + 1}"
    assert reward(wrong, ex["answer"]) == 0.0
    assert reward(wrong, ex["answer"], format_credit=0.1) == 0.1
    for malformed in ["", "132", "answer 132", "answer: 13a", "the answer: 132", "answer: 1 32"]:
        assert extract_answer(malformed) is None, malformed
        assert reward(malformed, "132", format_credit=0.1) == 0.0
    assert extract_answer("answer: 1\nanswer: 132  \n") == "132"  # the last well-formed line counts
    assert reward("x\n answer:132\n", "132") == 1.0
    assert reward("answer: 0132", "132") == 1.0  # compared as integers


# ----------------------------------------------------------------------------------------------- choices
def test_choices():
    for level in range(len(LEVELS)):
        ex = make_example(level, level)
        c = choices(ex, 4, seed=0)
        assert len(c) == len(set(c)) == 4 and ex["answer"] in c
        assert all(len(x) == len(ex["answer"]) for x in c)
        assert c == choices(ex, 4, seed=0)
    positions = {choices(make_example(0, 0), 4, seed=s).index(make_example(0, 0)["answer"]) for s in range(20)}
    assert len(positions) > 1  # the correct answer is not always in the same slot
    assert len(choices({"answer": "7"}, 5, seed=1)) == 5  # tiny answers are topped up
    with pytest.raises(ValueError):
        choices({"answer": "7"}, 1, seed=0)


# ----------------------------------------------------------------------------------------------- tokenizer
TRICKY = ["", " ", "\n", "  a\n\n b  ", "47+85=\nadd 47+85 by columns, right to left\nanswer: 132\n", "(1/2)-3.?:"]


def test_tokenizer_vocab_and_specials():
    tok = build_tokenizer()
    assert len(tok) == len(VOCAB) < 64
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (PAD_ID, BOS_ID, EOS_ID, UNK_ID)
    assert tok.convert_ids_to_tokens(list(range(len(VOCAB)))) == list(VOCAB)
    assert tok("ab").input_ids == [BOS_ID, VOCAB.index("a"), VOCAB.index("b")]
    assert tok("a<eos>b", add_special_tokens=False).input_ids == [VOCAB.index("a"), EOS_ID, VOCAB.index("b")]
    assert tok("A~", add_special_tokens=False).input_ids == [UNK_ID, UNK_ID]


def test_tokenizer_roundtrip():
    tok = build_tokenizer()
    train, _ = make_splits(TaskConfig(n_train_per_level=16, n_heldout_per_level=1))
    for text in TRICKY + [e["prompt"] + e["response"] for e in train]:
        ids = tok(text, add_special_tokens=False).input_ids
        assert len(ids) == len(text)  # one token per character
        assert tok.decode(ids) == text
        assert tok.decode(tok(text).input_ids + [EOS_ID, PAD_ID], skip_special_tokens=True) == text


def test_tokenizer_save_load(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = build_tokenizer()
    save_tokenizer(tok, tmp_path / "tok")
    from transformers import AutoTokenizer

    for tok2 in (load_tokenizer(tmp_path / "tok"), AutoTokenizer.from_pretrained(str(tmp_path / "tok"))):
        assert len(tok2) == len(tok) and tok2.get_vocab() == tok.get_vocab()
        assert (tok2.pad_token_id, tok2.bos_token_id, tok2.eos_token_id) == (PAD_ID, BOS_ID, EOS_ID)
        for text in TRICKY:
            assert tok2(text).input_ids == tok(text).input_ids
            assert tok2.decode(tok2(text).input_ids, skip_special_tokens=True) == text
        batch = tok2(["ab", "abcd"], padding=True)
        assert batch.input_ids[0][-2:] == [PAD_ID, PAD_ID] and batch.attention_mask[0] == [1, 1, 1, 0, 0]
