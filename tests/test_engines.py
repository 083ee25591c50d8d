"""Engines: sampler shapes / stop handling / seeds, processed log-probs, learner == sampler on the same profile."""
from __future__ import annotations

import math

import pytest
import torch

from minite_core.engines import Learner, Sampler, pack_right, processed_logprobs
from minite_core.nn import gemm_modules
from minite_core.seeds import derive_seed
from minite_core.model import PRESETS, CausalLM
from minite_core.profiles import get_profile

FP32 = get_profile("bf16").replace(name="fp32", dtype="float32", router_dtype="float32", lm_head_dtype="float32")
DECODE_ATOL = 1e-4  # |logp_learner - logp_sampler|, same fp32 profile: cached decode vs full sequence (seen ~2e-6)
PROMPTS = [[1, 5, 6, 7], [1, 8, 9], [1, 10, 11, 12, 13, 14], [1, 20]]


@pytest.fixture(scope="module")
def moe():
    return CausalLM(PRESETS["tiny-moe"]).init_weights(0, std=0.3)  # std 0.3: logits far from flat


@pytest.fixture(scope="module")
def dense():
    return CausalLM(PRESETS["tiny-dense"]).init_weights(1, std=0.3)


def test_derive_seed_is_pure_and_mixed():
    assert derive_seed(0, 1) == derive_seed(0, 1)
    seeds = {derive_seed(s, i) for s in range(4) for i in range(64)}
    assert len(seeds) == 256 and all(0 <= s < 1 << 48 for s in seeds)


def test_sampler_shapes_stop_and_finished(moe):
    # stop on half the vocabulary so most rows stop early; max_new_tokens bounds the rest
    stop = tuple(range(0, 64, 2))
    r = Sampler(moe, "bf16").generate(PROMPTS, max_new_tokens=10, seed=3, stop_ids=stop)
    assert len(r) == len(PROMPTS) and r.prompt_ids == PROMPTS
    for resp, lp, amx, fin in zip(r.response_ids, r.logprobs, r.argmax_ids, r.finished):
        assert 1 <= len(resp) <= 10 and len(lp) == len(resp) == len(amx)
        assert all(t not in stop for t in resp[:-1])  # nothing after a stop token
        assert fin == (resp[-1] in stop)
        assert fin or len(resp) == 10
        assert all(x <= 0.0 for x in lp)
    assert any(r.finished)
    t = r.padded()
    assert t["response_ids"].shape == t["logprobs"].shape == t["mask"].shape == (4, max(map(len, r.response_ids)))
    assert int(t["mask"].sum()) == r.num_tokens


def test_sampler_deterministic_by_seed_and_batch_independent(dense):
    s = Sampler(dense, FP32)
    a = s.generate(PROMPTS, max_new_tokens=12, seed=7)
    b = s.generate(PROMPTS, max_new_tokens=12, seed=7)
    c = s.generate(PROMPTS, max_new_tokens=12, seed=8)
    assert a.response_ids == b.response_ids and a.logprobs == b.logprobs
    assert a.response_ids != c.response_ids
    one = s.generate(PROMPTS, max_new_tokens=12, seed=7, batch_size=1)  # other rows/padding no longer present
    assert one.response_ids == a.response_ids
    assert max(abs(x - y) for u, v in zip(one.logprobs, a.logprobs) for x, y in zip(u, v)) < DECODE_ATOL


def test_greedy_is_argmax(dense):
    s = Sampler(dense, FP32)
    a = s.generate(PROMPTS, max_new_tokens=8, temperature=0.0, seed=0)
    b = s.generate(PROMPTS, max_new_tokens=8, temperature=0.0, seed=99)
    assert a.response_ids == b.response_ids == a.argmax_ids


def test_processed_logprobs_top_p_renormalises():
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.15), math.log(0.05)]])
    lp = processed_logprobs(logits, top_p=0.8)  # ascending tail mass 0.05, 0.2 <= 0.2 dropped
    assert torch.allclose(lp.exp(), torch.tensor([[0.625, 0.375, 0.0, 0.0]]), atol=1e-6)
    lp1 = processed_logprobs(logits, top_p=0.01)  # always keeps the top token
    assert torch.allclose(lp1.exp(), torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    assert torch.allclose(processed_logprobs(logits * 3, temperature=3.0), torch.log_softmax(logits, -1), atol=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_logprobs_are_log_softmax_of_scaled_logits(dense, temperature):
    # top_p = 1: processed log-probs == log_softmax(logits / T) at the sampled token, logits from a full forward
    r = Sampler(dense, FP32).generate(PROMPTS, max_new_tokens=12, temperature=temperature, seed=1)
    logits, mask = Learner(dense, FP32).response_logits(r.prompt_ids, r.response_ids)
    ref = torch.log_softmax(logits / temperature, -1).gather(-1, r.padded()["response_ids"][..., None])[..., 0]
    assert (ref - r.padded()["logprobs"])[mask].abs().max() < DECODE_ATOL


def test_sampler_top_p_logprobs_renormalised(dense):
    r = Sampler(dense, FP32).generate(PROMPTS, max_new_tokens=12, top_p=0.5, seed=2)
    logits, mask = Learner(dense, FP32).response_logits(r.prompt_ids, r.response_ids)
    t = r.padded()
    ref = processed_logprobs(logits, top_p=0.5).gather(-1, t["response_ids"][..., None])[..., 0]
    raw = torch.log_softmax(logits, -1).gather(-1, t["response_ids"][..., None])[..., 0]
    assert (ref - t["logprobs"])[mask].abs().max() < DECODE_ATOL
    assert bool(((t["logprobs"] - raw)[mask] > -DECODE_ATOL).all())  # renormalised mass >= raw
    assert float((t["logprobs"] - raw)[mask].mean()) > 0.05


@pytest.mark.parametrize("model_name", ["dense", "moe"])
def test_learner_equals_sampler_same_fp32_profile(model_name, request):
    model = request.getfixturevalue(model_name)
    r = Sampler(model, FP32).generate(PROMPTS, max_new_tokens=16, seed=4)
    lp, ent, mask = Learner(model, FP32).logprobs(r.prompt_ids, r.response_ids, with_entropy=True)
    assert lp.shape == ent.shape == mask.shape
    assert (lp - r.padded()["logprobs"])[mask].abs().max() < DECODE_ATOL
    assert bool((ent[mask] >= 0).all()) and bool((ent[mask] <= math.log(64) + 1e-4).all())


def test_learner_grad_and_step_seeds(moe):
    learner = Learner(moe, "minite", seed=5)
    lp, _, mask = learner.logprobs([[1, 2, 3], [1, 4]], [[5, 6], [7, 8, 9]], grad=True)
    assert lp.requires_grad and mask.tolist() == [[True, True, False], [True, True, True]]
    (-lp[mask].mean()).backward()
    assert moe.lm_head.weight.grad is not None
    moe.zero_grad(set_to_none=True)
    learner.set_step(3)
    seeds = [m.seed for _, m in gemm_modules(moe)]
    assert len(set(seeds)) == len(seeds)
    learner.set_step(3)
    assert seeds == [m.seed for _, m in gemm_modules(moe)]
    learner.set_step(4)
    assert seeds != [m.seed for _, m in gemm_modules(moe)]


def test_pack_right_positions():
    ids, attn, pos, mask = pack_right([[1, 2], [3]], [[4, 5, 6], [7]])
    assert ids.tolist() == [[1, 2, 4, 5, 6], [3, 7, 0, 0, 0]]
    assert attn.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert pos[0].tolist() == [1, 2, 3] and pos[1, 0] == 0 and mask.tolist() == [[1, 1, 1], [1, 0, 0]]


def test_learner_scores_the_processed_top_p_distribution():
    """With top_p < 1 the learner rescores the sampler's processed distribution: identical numerics give k3 = 0."""
    import torch as _torch

    from minite_core.diagnostics.cli import measure_pair
    from minite_core.model import PRESETS, CausalLM

    model = CausalLM(PRESETS["tiny-moe"]).init_weights(0, std=0.2)
    g = _torch.Generator().manual_seed(0)
    prompts = [_torch.randint(4, 64, (6,), generator=g).tolist() for _ in range(8)]
    metrics = measure_pair(model, "minite-fp32attn", "minite-fp32attn", prompts, max_new_tokens=16,
                           temperature=1.0, top_p=0.8, seed=0)[0]
    assert metrics["mismatch/k3"] == 0.0
