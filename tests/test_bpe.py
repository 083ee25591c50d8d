"""The byte-level BPE tokenizer (task/tokenizer.py) and the stages that meet multi-character tokens: deterministic
training, the vocabulary and response lengths the GPU experiment's comments state, exact round trips, the reward
through encode/decode, SFT masks, the generation budget in tokens and the sampler; the character tokenizer (the
smoke's) unchanged."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from minite_core.engines import make_sampler
from minite_core.model import CausalLM
from minite_core.rl.pretrain import PretrainConfig, max_response_tokens, model_vocab, sft_batch
from minite_core.task import data as data_mod
from minite_core.task.arithmetic import TaskConfig, level_index, make_splits, reward
from minite_core.task.tokenizer import (BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID, build_tokenizer,
                                        decode_response, encode, load_tokenizer, make_tokenizer,
                                        train_bpe_tokenizer)

pytestmark = pytest.mark.usefixtures("one_thread")


def _splits(levels, n_train, n_heldout=8):
    return make_splits(TaskConfig(levels=tuple(level_index(lv) for lv in levels), n_train_per_level=n_train,
                                  n_heldout_per_level=n_heldout))


def _texts(rows):
    return [e["prompt"] + e["response"] for e in rows]


@pytest.fixture(scope="module")
def h200_bpe():
    """The GPU experiment's tokenizer: add3 + mul3x1, 4096 train prompts a level (experiments/h200.yaml `data`)."""
    train, heldout = _splits(["add3", "mul3x1"], 4096, 256)
    return train_bpe_tokenizer(_texts(train), 2048), train, heldout


def test_bpe_vocabulary_and_response_lengths_of_the_gpu_experiment(h200_bpe):
    """>= 1,000 tokens (every 1-3 digit number is one), special ids 0..3, and the lengths the docs state:
    responses of 49-51 tokens for add3 and mul3x1 (91-98 characters)."""
    tok, train, _ = h200_bpe
    assert len(tok) == 1301 >= 1000
    assert tok.convert_ids_to_tokens(list(range(4))) == list(SPECIAL_TOKENS)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (PAD_ID, BOS_ID, EOS_ID, UNK_ID)
    vocab = tok.get_vocab()
    assert all(str(n) in vocab for n in range(1000))  # the 3-digit chunks of Llama 3's split, each one token
    lengths = {li: [len(ids) for ids in tok([e["response"] for e in train if e["level"] == li],
                                            add_special_tokens=False).input_ids] for li in (1, 3)}
    assert {li: (min(v), max(v)) for li, v in lengths.items()} == {1: (49, 51), 3: (49, 51)}
    assert model_vocab(len(tok)) == 1312


def test_bpe_round_trip_and_prompt_response_boundary(h200_bpe):
    tok, train, heldout = h200_bpe
    odd = ["", " ", "\n", "  a\n\n b  ", "(1/2)-3.?:", "ünïcode ✓ 1234567", "A~"]
    for text in odd + _texts(train[:64] + heldout[:64]):
        ids = tok(text, add_special_tokens=False).input_ids
        assert UNK_ID not in ids and tok.decode(ids) == text  # byte level: every string, exactly
    prompts, responses = encode(tok, heldout)
    for e, p, r in zip(heldout, prompts, responses):
        assert p[0] == BOS_ID and r[-1] == EOS_ID
        assert p + r[:-1] == tok(e["prompt"] + e["response"]).input_ids  # apart == together
        assert reward(decode_response(tok, r), e["answer"]) == 1.0


def test_bpe_training_is_deterministic_across_processes(tmp_path):
    """Another process (its own hash seeds, Python's and the trainer's) writes the same tokenizer.json byte for
    byte as this one."""
    cfg = json.dumps({"levels": ["add2", "mul3x1"], "n_train_per_level": 512, "n_heldout_per_level": 8,
                      "tokenizer": "bpe"})
    code = f"import sys; from minite_core.task import data; data.main(['--out', sys.argv[1], '--config-json', {cfg!r}])"
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "a")], check=True, capture_output=True,
                   env={**os.environ, "PYTHONHASHSEED": "12345"})
    data_mod.main(["--out", str(tmp_path / "b"), "--config-json", cfg])
    a, b = ((tmp_path / n / "tokenizer" / "tokenizer.json").read_bytes() for n in ("a", "b"))
    assert a == b
    res = json.loads((tmp_path / "a" / "data.json").read_text())["metrics"]
    assert res["tokenizer"] == "bpe" and res["vocab"] == len(load_tokenizer(tmp_path / "a" / "tokenizer"))
    assert res["levels"]["add2"]["response_tokens_max"] == 38 < res["levels"]["add2"]["response_chars_min"]


def test_char_tokenizer_is_the_smoke_one(tmp_path):
    """`tokenizer: char` (the default) writes the character tokenizer: one token a character, 54 tokens."""
    data_mod.main(["--out", str(tmp_path), "--config-json", json.dumps({"n_train_per_level": 16,
                                                                        "n_heldout_per_level": 2})])
    tok = load_tokenizer(tmp_path / "tokenizer")
    assert tok.get_vocab() == build_tokenizer().get_vocab() and len(tok) == 54
    m = json.loads((tmp_path / "data.json").read_text())["metrics"]["levels"]["add2"]
    assert (m["response_tokens_min"], m["response_tokens_max"]) == (m["response_chars_min"], m["response_chars_max"])
    with pytest.raises(ValueError, match="tokenizer must be one of"):
        data_mod.DataConfig(tokenizer="words")
    with pytest.raises(ValueError, match="vocab_size must be >= 260"):
        make_tokenizer("bpe", ["1+1"], 100)


def test_sft_batch_budget_and_sampler_with_multi_character_tokens():
    train, heldout = _splits(["add2"], 128)
    tok = train_bpe_tokenizer(_texts(train), 2048)
    prompts, responses = encode(tok, train)
    ids, mask = sft_batch(prompts, responses, [0, 1])
    for b in range(2):  # the loss positions predict exactly the response tokens, <eos> included
        targets = ids[b, 1:][mask[b]].tolist()
        assert targets == responses[b]
    longest = max(len(r) - 1 for r in responses + encode(tok, heldout)[1])
    assert max_response_tokens(tok, train + heldout) == longest + 17 == 38 + 17  # tokens, not characters (94)
    cfg = PretrainConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
    model = CausalLM(cfg.model_config(model_vocab(len(tok)))).init_weights(0)
    assert model.config.vocab_size == model_vocab(len(tok)) >= len(tok)
    out = make_sampler(model, "bf16", engine="reference").generate(
        prompts[:3], max_new_tokens=6, temperature=1.0, seed=1, batch_size=3)
    for r in out.response_ids:
        assert 1 <= len(r) <= 6 and all(0 <= t < model.config.vocab_size for t in r)
        decode_response(tok, r)  # any sampled id decodes (pads of the rounded-up vocabulary included)
    assert decode_response(tok, [model.config.vocab_size - 1, EOS_ID]) == ""  # a pad row of the LM head: nothing
