"""Math RL data from your files: the layouts the open RL frameworks' math recipes write, read into one row form.

Accepted layouts (parquet or JSONL, one problem a row; the first match of a row wins):
- verl's preprocessed layout (`examples/data_preprocess/gsm8k.py`, `math_dataset.py`; DAPO-Math-17k is published
  in it): `prompt` = chat messages `[{"role": "user", "content": ...}, ...]`, `reward_model.ground_truth` = the
  answer, `data_source` = its name, `extra_info.answer` (GSM8K: the worked solution) optional. A `prompt` given as
  plain text is one user message.
- GSM8K's own layout (openai/gsm8k): `question`, `answer` = worked solution ending `#### N`. The prompt is the
  question followed by verl's GSM8K instruction (`GSM8K_INSTRUCTION`), the ground truth the `#### N` part.
- MATH's layout (MATH-500, hendrycks_math): `problem`, `answer` (or `expected_answer`, NeMo-RL's OpenMathInstruct
  form; or only `solution`, whose last `\\boxed{}` is the answer). The prompt is the problem followed by
  `MATH_INSTRUCTION` (Qwen's \\boxed convention).
`minite data --train FILE --heldout FILE` writes them as the RL stage's train.jsonl / heldout.jsonl, one row each:
`{"task": "math", "messages", "prompt" (the last user message), "answer", "response" (a worked solution when the
file has one, else ""), "source" (data_source or the file's name)}`.

`MathTask` is what the stages do with such rows (task/tasks.py picks it by `row["task"]`): the prompt goes through
the tokenizer's chat template with the generation prompt (as verl's RLHFDataset: rendered to text, tokenized
without adding special tokens); the reward is task/math_reward.py's; generation stops at the tokenizer's
end-of-sequence token and at the token the chat template closes an assistant turn with (found by rendering a
turn, `turn_end_id`: `<|im_end|>` for Qwen); calibration sequences are prompt + worked solution + turn end.
"""
from __future__ import annotations

from pathlib import Path

from minite_core.task.jsonl import read_jsonl
from minite_core.task.math_reward import extract_answer, last_boxed, math_reward

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'  # verl's gsm8k.py
MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
LAYOUTS = ("verl {prompt: [chat messages] | text, reward_model: {ground_truth}}", "GSM8K {question, answer}",
           "MATH {problem, answer | expected_answer | solution}")
_MARKER = "MINITE_TURN_END_PROBE"


def read_rows(path: str | Path) -> list[dict]:
    """The rows of a .parquet or .jsonl file (a missing file or another extension: an error naming it)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (a math data file: parquet or JSONL, one problem a row)")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    elif path.suffix in (".jsonl", ".json"):
        rows = read_jsonl(path)
    else:
        raise ValueError(f"{path}: unknown file type {path.suffix!r}; give a .parquet or .jsonl file")
    if not rows:
        raise ValueError(f"{path} has no rows")
    return rows


def _answer_text(value) -> str:
    if isinstance(value, (list, tuple)):  # some data sets list several accepted answers: take the first
        value = value[0] if value else ""
    return str(value).strip()


def to_row(row: dict, source: str, where: str) -> dict:
    """One file row in any accepted layout -> the normalised row (module docstring); `where` names it in errors."""
    prompt, answer, response = row.get("prompt"), None, ""
    truth = (row.get("reward_model") or {}).get("ground_truth") if isinstance(row.get("reward_model"), dict) else None
    if prompt is not None and truth is not None:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [
            {"role": str(m["role"]), "content": str(m["content"])} for m in prompt]
        answer = _answer_text(truth)
        response = str((row.get("extra_info") or {}).get("answer") or "")
    elif "question" in row and "answer" in row:
        solution = str(row["answer"])
        answer = extract_answer(solution) if "####" in solution else solution.strip()
        messages = [{"role": "user", "content": f"{row['question']} {GSM8K_INSTRUCTION}"}]
        response = solution if "####" in solution else ""
    elif "problem" in row and any(k in row for k in ("answer", "expected_answer", "solution")):
        raw = row.get("answer", row.get("expected_answer"))
        answer = _answer_text(raw) if raw is not None else last_boxed(str(row["solution"]))
        messages = [{"role": "user", "content": f"{row['problem']}\n{MATH_INSTRUCTION}"}]
        response = str(row.get("solution") or "")
    else:
        raise ValueError(f"{where}: no prompt and answer in fields {sorted(row)}; expected one of: {'; '.join(LAYOUTS)}")
    if not answer:
        raise ValueError(f"{where}: the ground-truth answer is empty")
    if not messages or any(m["role"] not in ("system", "user", "assistant") for m in messages):
        raise ValueError(f"{where}: prompt messages need roles system/user/assistant, got {messages[:2]}")
    users = [m["content"] for m in messages if m["role"] == "user"]
    return {"task": "math", "messages": messages, "prompt": users[-1] if users else messages[-1]["content"],
            "answer": answer, "response": response, "source": str(row.get("data_source") or source)}


def load_math_file(path: str | Path) -> list[dict]:
    """Every row of a math data file, normalised (an unusable row is an error naming the file and row)."""
    path = Path(path)
    return [to_row(r, path.stem, f"{path}: row {i}") for i, r in enumerate(read_rows(path))]


def turn_end_id(tok) -> int:
    """The token that ends an assistant turn under the chat template (`<|im_end|>` for Qwen), found by rendering a
    probe turn: the special token right after its text; else the tokenizer's end-of-sequence token."""
    if tok.chat_template:
        text = tok.apply_chat_template([{"role": "user", "content": "q"}, {"role": "assistant", "content": _MARKER}],
                                       tokenize=False)
        tail = tok(text[text.rindex(_MARKER) + len(_MARKER):], add_special_tokens=False)["input_ids"]
        if tail and tail[0] in set(tok.all_special_ids) | set(tok.get_added_vocab().values()):
            return tail[0]
    if tok.eos_token_id is None:
        raise ValueError(f"tokenizer {tok.name_or_path!r} has no end-of-sequence token and its chat template ends "
                         "no turn with a special token: generation could not stop")
    return tok.eos_token_id


class MathTask:
    """Math problems under the tokenizer's chat template (module docstring)."""

    name = "math"

    def prompt_ids(self, tok, rows: list[dict]) -> list[list[int]]:
        if not tok.chat_template:
            raise ValueError(f"tokenizer {tok.name_or_path!r} has no chat template: math prompts are chat messages "
                             "(a Hugging Face checkpoint carries it in tokenizer_config.json or chat_template.jinja)")
        texts = [tok.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=False) for r in rows]
        return [list(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]]

    def reward(self, text: str, row: dict, format_credit: float = 0.0) -> float:
        del format_credit  # the math reward is correctness only
        return math_reward(text, row["answer"])

    def decode(self, tok, ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=True)

    def stop_ids(self, tok) -> tuple[int, ...]:
        return tuple(sorted({turn_end_id(tok)} | ({tok.eos_token_id} - {None})))

    def group(self, row: dict) -> str:
        return row["source"]

    def calibration_sequences(self, tok, rows: list[dict]) -> list[list[int]]:
        """Prompt + worked solution (when the data has one) + the turn end, per row."""
        end = [turn_end_id(tok)]
        solutions = tok([r["response"] for r in rows], add_special_tokens=False)["input_ids"]
        return [p + list(s) + end for p, s in zip(self.prompt_ids(tok, rows), solutions)]

    def max_new_tokens(self, tok, rows: list[dict]) -> int | None:
        return None  # no bound from the data: the experiment's rl / diagnostics max_new_tokens
