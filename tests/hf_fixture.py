"""A Hugging Face checkpoint and math data made here, in the layouts users bring (no hub, no download):

- `write_checkpoint(dir, cfg)`: a random Qwen3-MoE (or dense Qwen3) written by transformers itself
  (`save_pretrained` in bf16, sharded with model.safetensors.index.json) beside a byte-level BPE tokenizer trained
  here with the `tokenizers` library on the fixture's own text, with a Qwen-style chat template
  (`<|im_start|>role ... <|im_end|>`).
- `gsm8k_problems(n)`: GSM8K-style word problems (`question`, `answer` = worked solution ending `#### N`);
  `verl_rows(problems)`: the same as verl's GSM8K preprocessing writes them (examples/data_preprocess/gsm8k.py);
  `write_parquet` / `write_jsonl` put rows in a file.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from minite_core.model.config import ModelConfig
from minite_core.task.math_data import GSM8K_INSTRUCTION

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
VOCAB = 384  # byte-level alphabet (256) + the specials + ~125 merges; the model's vocabulary too

_NAMES = ("Ava", "Ben", "Cleo", "Dan", "Eve", "Finn", "Gus", "Hana")
_ITEMS = ("apples", "pencils", "stickers", "marbles", "books", "coins")


def gsm8k_problems(n: int, seed: int = 0) -> list[dict]:
    """n GSM8K-style problems: {"question", "answer": worked solution ending `#### N`}."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
        a, b, c = rng.randint(2, 60), rng.randint(2, 40), rng.randint(2, 5)
        if rng.random() < 0.5:
            q = f"{name} has {a} {item} and buys {b} more. How many {item} does {name} have now?"
            sol = f"{name} has {a}+{b}={a + b} {item}.\n#### {a + b}"
        else:
            q = f"{name} packs {c} boxes of {a} {item} each and gives away {b}. How many {item} are left?"
            left = c * a - b
            sol = f"The boxes hold {c}*{a}={c * a} {item}.\n{c * a}-{b}={left}\n#### {left}"
        out.append({"question": q, "answer": sol})
    return out


def verl_rows(problems: list[dict], split: str) -> list[dict]:
    """verl's GSM8K parquet layout (examples/data_preprocess/gsm8k.py)."""
    return [{"data_source": "openai/gsm8k",
             "prompt": [{"role": "user", "content": f"{p['question']} {GSM8K_INSTRUCTION}"}],
             "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": p["answer"].split("#### ")[-1]},
             "extra_info": {"split": split, "index": i, "answer": p["answer"], "question": p["question"]}}
            for i, p in enumerate(problems)]


def write_parquet(rows: list[dict], path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def train_tokenizer(texts: list[str]):
    """A byte-level BPE tokenizer trained on `texts`, Qwen-style specials and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHAT_TEMPLATE, model_max_length=512,
                                   clean_up_tokenization_spaces=False)


def tiny_config(moe: bool = True, eos_token_id: int | None = None) -> ModelConfig:
    """Tiny shapes the NVFP4 GEMMs accept (every K a multiple of 16)."""
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, rope_theta=10000.0, max_position_embeddings=512,
                  bos_token_id=None, eos_token_id=eos_token_id, pad_token_id=None)
    if moe:
        return ModelConfig(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, **common)
    return ModelConfig(num_experts=0, **common)


def write_checkpoint(path: Path, moe: bool = True, seed: int = 0, texts: list[str] | None = None) -> Path:
    """A random tiny model written by transformers (bf16, two shards + index) with a trained BPE tokenizer."""
    import transformers

    path.mkdir(parents=True, exist_ok=True)
    texts = texts or [p["question"] + "\n" + p["answer"] for p in gsm8k_problems(200, seed=seed + 1)]
    tok = train_tokenizer(texts + [CHAT_TEMPLATE, GSM8K_INSTRUCTION])
    tok.save_pretrained(str(path))
    cfg = tiny_config(moe, eos_token_id=tok.eos_token_id)
    torch.manual_seed(seed)  # transformers' init draws from the global RNG
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg.to_hf()),
                                                          dtype=torch.float32)
    with torch.no_grad():  # norms are initialised to 1: perturb them so they are checked too
        gen = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
    total = sum(p.numel() for p in model.parameters()) * 2  # bf16 bytes
    model.to(torch.bfloat16).save_pretrained(str(path), max_shard_size=total * 3 // 5)  # -> exactly 2 shards
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 2, "the fixture must be a 2-shard checkpoint"
    return path
