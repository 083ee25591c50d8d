"""Your math data (task/math_data.py): the layouts the open RL frameworks write, the chat-templated prompt, stop
tokens, the import into the RL stage's splits, and one-line errors for rows and files it cannot use."""
import json

import pytest

from hf_fixture import gsm8k_problems, train_tokenizer, verl_rows, write_jsonl, write_parquet
from minite_core.task import data as data_mod
from minite_core.task.math_data import GSM8K_INSTRUCTION, MATH_INSTRUCTION, MathTask, load_math_file, to_row, turn_end_id
from minite_core.task.tasks import ARITHMETIC, MATH, task_of


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer([p["question"] + p["answer"] for p in gsm8k_problems(50)])


def test_layouts():
    verl = to_row(verl_rows(gsm8k_problems(1), "train")[0], "f", "f: row 0")
    assert verl["answer"].isdigit() and verl["source"] == "openai/gsm8k" and "####" in verl["response"]
    assert verl["messages"][0]["content"].endswith(GSM8K_INSTRUCTION)
    plain = to_row({"question": "2+2?", "answer": "2+2=4\n#### 4"}, "gsm8k_test", "x")
    assert plain["answer"] == "4" and plain["messages"] == [{"role": "user", "content": f"2+2? {GSM8K_INSTRUCTION}"}]
    assert plain["source"] == "gsm8k_test"
    math = to_row({"problem": "Half of 1?", "answer": "\\frac{1}{2}", "solution": "$\\boxed{\\frac12}$"}, "m", "x")
    assert math["answer"] == "\\frac{1}{2}" and math["prompt"].endswith(MATH_INSTRUCTION)
    assert to_row({"problem": "p", "solution": "so \\boxed{7}."}, "m", "x")["answer"] == "7"
    assert to_row({"problem": "p", "expected_answer": "3"}, "m", "x")["answer"] == "3"  # NeMo-RL's OpenMathInstruct
    text = to_row({"prompt": "What is 1+1?", "reward_model": {"ground_truth": "2"}, "data_source": "s"}, "f", "x")
    assert text["messages"] == [{"role": "user", "content": "What is 1+1?"}] and text["source"] == "s"
    dapo = to_row({"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"}],
                   "reward_model": {"ground_truth": ["34"]}}, "f", "x")
    assert dapo["answer"] == "34" and dapo["prompt"] == "q" and len(dapo["messages"]) == 2


def test_unusable_rows_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"f\.jsonl: row 1: no prompt and answer in fields \['text'\]; expected"):
        load_math_file(write_jsonl([{"question": "q", "answer": "#### 1"}, {"text": "x"}], tmp_path / "f.jsonl"))
    with pytest.raises(ValueError, match="ground-truth answer is empty"):
        to_row({"question": "q", "answer": "  "}, "f", "f: row 0")
    with pytest.raises(ValueError, match="roles system/user/assistant"):
        to_row({"prompt": [{"role": "tool", "content": "q"}], "reward_model": {"ground_truth": "1"}}, "f", "x")
    with pytest.raises(FileNotFoundError, match="nope.parquet does not exist"):
        load_math_file(tmp_path / "nope.parquet")
    (tmp_path / "f.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="give a .parquet or .jsonl file"):
        load_math_file(tmp_path / "f.csv")


def test_prompt_goes_through_the_chat_template(tok):
    rows = [to_row(r, "f", "x") for r in verl_rows(gsm8k_problems(3), "train")]
    ids = MathTask().prompt_ids(tok, rows)
    for row, got in zip(rows, ids):
        text = tok.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=False)
        assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_start|>assistant\n")
        assert got == tok(text, add_special_tokens=False)["input_ids"]
    end = tok.convert_tokens_to_ids("<|im_end|>")
    assert turn_end_id(tok) == end and end in MathTask().stop_ids(tok)
    seqs = MathTask().calibration_sequences(tok, rows)
    assert all(s[:len(p)] == p and s[-1] == end and len(s) > len(p) + 1 for s, p in zip(seqs, ids))
    tok_plain = train_tokenizer(["a b"])
    tok_plain.chat_template = None
    with pytest.raises(ValueError, match="has no chat template"):
        MathTask().prompt_ids(tok_plain, rows)


def test_reward_and_task_choice(tok):
    row = to_row({"question": "q", "answer": "#### 1,234"}, "f", "x")
    assert MATH.reward("so \\boxed{1234}", row) == 1.0 and MATH.reward("#### 1233", row) == 0.0
    assert task_of([row]) is MATH and task_of([{"prompt": "1+1=", "level": 0}]) is ARITHMETIC
    with pytest.raises(ValueError, match="several tasks"):
        task_of([row, {"prompt": "1+1="}])


def test_import_writes_the_splits_and_refuses_overlap(tmp_path):
    problems = gsm8k_problems(12, seed=3)
    train = write_parquet(verl_rows(problems[:8], "train"), tmp_path / "train.parquet")
    heldout = write_jsonl(problems[8:], tmp_path / "test.jsonl")  # another layout for the other split
    assert data_mod.main(["--out", str(tmp_path / "d"), "--train", str(train), "--heldout", str(heldout)]) == 0
    meta = json.loads((tmp_path / "d" / "data.json").read_text())["metrics"]
    assert (meta["n_train"], meta["n_heldout"], meta["with_solution"]) == (8, 4, 8)
    assert meta["sources"] == {"openai/gsm8k": {"n_train": 8, "n_heldout": 0}, "test": {"n_train": 0, "n_heldout": 4}}
    assert len(data_mod.load_split(tmp_path / "d", "heldout")) == 4
    with pytest.raises(ValueError, match="shares 4 problem"):
        data_mod.import_data(tmp_path / "e", train, write_parquet(verl_rows(problems[:4], "test"), tmp_path / "h.parquet"))
    with pytest.raises(SystemExit):
        data_mod.main(["--out", str(tmp_path / "f"), "--train", str(train)])
