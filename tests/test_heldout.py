"""Held-out evaluation (rl/heldout.py): the set is the same round-robin choice every time, the SEs are the
binomial and paired formulas, and an evaluation goes through the sampler engine in batches, greedily."""
from __future__ import annotations

import math

import pytest
import torch

from minite_core.engines import Sampler
from minite_core.model import CausalLM, set_profile
from minite_core.rl.heldout import Heldout, binomial_se, evaluate, heldout_set, paired_gain
from minite_core.rl.pretrain import PretrainConfig
from minite_core.task.arithmetic import LEVEL_INDEX, LEVELS, TaskConfig, make_splits
from minite_core.task.tokenizer import build_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


def _examples(levels=(0, 1), per_level=5):
    return make_splits(TaskConfig(levels=levels, n_train_per_level=4, n_heldout_per_level=per_level))[1]


def test_heldout_set_round_robin_and_stable():
    ex = _examples()  # 5 add2 then 5 add3, file order
    got = heldout_set(ex, 5)
    assert [e["level"] for e in got] == [0, 1, 0, 1, 0]
    assert got == [ex[0], ex[5], ex[1], ex[6], ex[2]]
    assert heldout_set(ex, 5) == got  # the same problems every call
    assert heldout_set(ex, 0) == ex and heldout_set(ex, 10) == [ex[i] for i in (0, 5, 1, 6, 2, 7, 3, 8, 4, 9)]
    uneven = ex[:5] + ex[5:7]  # a level runs out: the others fill the rest in order
    assert [e["level"] for e in heldout_set(uneven, 7)] == [0, 1, 0, 1, 0, 0, 0]
    with pytest.raises(ValueError, match="rl.eval_n"):
        heldout_set(ex, 11)
    with pytest.raises(ValueError, match=">= 0"):
        heldout_set(ex, -1)


def test_standard_errors():
    assert binomial_se(0.5, 512) == pytest.approx(0.0221, abs=1e-4)  # the 2.2 points
    assert binomial_se(0.0, 10) == 0.0 and math.isnan(binomial_se(0.5, 0))
    # paired: d = after - before = [+1, 0, 0, -1, +1]; mean 0.2, sample std sqrt(0.7), SE sqrt(0.7 / 5)
    before = [False, True, False, True, False]
    after = [True, True, False, False, True]
    gain, se = paired_gain(before, after)
    assert gain == pytest.approx(0.2) and se == pytest.approx(math.sqrt(0.7 / 5))
    assert paired_gain([True] * 4, [True] * 4) == (0.0, 0.0)
    with pytest.raises(ValueError, match="of one set"):
        paired_gain([True], [True, False])


def test_metrics_per_level():
    h = Heldout(correct=(True, False, True, True), groups=("add2", "add3", "add2", "add3"), response_len=70.0)
    m = h.metrics()
    assert m["acc"] == 0.75 and m["se"] == pytest.approx(math.sqrt(0.75 * 0.25 / 4))
    assert m["acc/add2"] == 1.0 and m["acc/add3"] == 0.5 and m["response_len"] == 70.0
    assert LEVEL_INDEX["add3"] == 1


def test_evaluate_is_batched_greedy_and_restores_the_model(monkeypatch):
    cfg = PretrainConfig(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         moe_intermediate_size=32)
    model = CausalLM(cfg.model_config()).init_weights(0)
    set_profile(model, "te-nvfp4")
    model.train()
    calls = []
    generate = Sampler.generate

    def spy(self, prompts, **kw):
        calls.append((len(prompts), kw["batch_size"], kw["temperature"], self.profile.name))
        return generate(self, prompts, **kw)

    monkeypatch.setattr(Sampler, "generate", spy)
    ex = _examples(per_level=3)
    res = evaluate(model, "bf16", build_tokenizer(), ex, max_new_tokens=8, batch_size=4)
    assert calls == [(6, 4, 0.0, "bf16")]  # one engine call for all problems, in batches of 4, greedy
    assert res.n == 6 and res.groups == tuple(LEVELS[e["level"]].name for e in ex) and 1 <= res.response_len <= 8
    assert model.profile.name == "te-nvfp4" and model.training
    with pytest.raises(ValueError, match="empty"):
        evaluate(model, "bf16", build_tokenizer(), [], max_new_tokens=8)
    assert torch.is_grad_enabled()
