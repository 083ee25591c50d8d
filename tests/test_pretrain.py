"""SFT pretraining (rl/pretrain.py) and the data stage (rl/data.py): loss goes down, outputs follow the results
contract and load back, a killed + resumed run writes the same loss curve, data is deterministic."""
from __future__ import annotations

import csv
import dataclasses
import json

import pytest
import torch

from minite_core.model import load_pretrained
from minite_core.results import read_result
from minite_core.task import data as data_mod
from minite_core.results import config_from_json
from minite_core.rl.pretrain import PretrainConfig, pretrain, sft_batch
from minite_core.task.tokenizer import EOS_ID, load_tokenizer

DATA = {"levels": ["add2"], "n_train_per_level": 128, "n_heldout_per_level": 8}
# 32-wide, 1 layer: ~20 ms a step on one core; lr high so that 24 steps show a clear drop
TINY = PretrainConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, batch_size=8,
                      lr=1e-2, warmup_steps=4, max_steps=24, eval_every=12, target_accuracy=(0.99, 1.0),
                      checkpoint_every=8)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("data")
    assert data_mod.main(["--out", str(out), "--seed", "3", "--config-json", json.dumps(DATA)]) == 0
    return out


def _loss_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_data_is_deterministic_and_contracted(data_dir, tmp_path):
    data_mod.main(["--out", str(tmp_path), "--seed", "3", "--config-json", json.dumps(DATA)])
    for name in ("train.jsonl", "heldout.jsonl"):
        assert (tmp_path / name).read_bytes() == (data_dir / name).read_bytes()
    res = read_result(data_dir / "data.json", stage="data")
    assert res["metrics"]["n_train"] == 128 and res["metrics"]["n_heldout"] == 8
    assert len(load_tokenizer(data_dir / "tokenizer")) == 54
    with pytest.raises(ValueError, match="unknown keys"):
        config_from_json(data_mod.DataConfig, '{"levelz": ["add2"]}')


def test_sft_batch_masks_response_tokens_only():
    prompts, responses = [[1, 10, 11], [1, 12]], [[20, 21, EOS_ID], [22, EOS_ID]]
    ids, mask = sft_batch(prompts, responses, [0, 1])
    assert ids.tolist() == [[1, 10, 11, 20, 21, EOS_ID], [1, 12, 22, EOS_ID, 0, 0]]
    # mask[b, t] = "the token at t+1 is a response token": targets 20, 21, eos / 22, eos
    assert mask.tolist() == [[False, False, True, True, True], [False, True, True, False, False]]


def test_pretrain_loss_decreases_and_writes_outputs(data_dir, tmp_path):
    m = pretrain(TINY, data_dir=data_dir, out=tmp_path / "p", state_dir=tmp_path / "s", seed=0, progress=False)
    rows = _loss_rows(tmp_path / "p" / "loss.csv")
    assert [int(r["step"]) for r in rows] == list(range(1, 25))
    first = sum(float(r["loss"]) for r in rows[:4]) / 4
    last = sum(float(r["loss"]) for r in rows[-4:]) / 4
    assert last < 0.6 * first, (first, last)
    assert rows[11]["acc"] != "" and rows[10]["acc"] == ""  # evaluation steps carry the accuracy
    res = read_result(tmp_path / "p" / "pretrain.json", stage="pretrain")
    assert m["stop_reason"] == "max_steps" and res["metrics"]["steps"] == 24
    assert set(res["metrics"]["accuracy_per_level"]) == {"add2"}
    model = load_pretrained(tmp_path / "p" / "model")
    assert model.config.num_experts == 4 and model.config.eos_token_id == EOS_ID
    assert len(load_tokenizer(tmp_path / "p" / "model")) == 54


def test_pretrain_resume_is_exact(data_dir, tmp_path):
    cfg = dataclasses.replace(TINY, max_steps=12, eval_every=6, checkpoint_every=4)
    pretrain(cfg, data_dir=data_dir, out=tmp_path / "a", state_dir=tmp_path / "sa", seed=1, progress=False)
    part = pretrain(cfg, data_dir=data_dir, out=tmp_path / "b", state_dir=tmp_path / "sb", seed=1,
                    progress=False, stop_after=5)
    assert part == {"stopped_at": 5}
    pretrain(cfg, data_dir=data_dir, out=tmp_path / "b", state_dir=tmp_path / "sb", seed=1, progress=False)
    drop = ("tokens_per_s",)
    strip = lambda rows: [{k: v for k, v in r.items() if k not in drop} for r in rows]  # noqa: E731
    assert strip(_loss_rows(tmp_path / "a" / "loss.csv")) == strip(_loss_rows(tmp_path / "b" / "loss.csv"))
    wa, wb = load_pretrained(tmp_path / "a" / "model"), load_pretrained(tmp_path / "b" / "model")
    for (na, pa), (_, pb) in zip(wa.named_parameters(), wb.named_parameters()):
        assert torch.equal(pa, pb), na
