"""MoE routing hook (model/routing.py): recording changes nothing, the sampler records prefill and every decode
step, replay (R3) executes the given expert sets with the learner's own gate weights (so the router keeps its
gradient), and a dense model reports that routing does not apply."""
from __future__ import annotations

from functools import partial

import pytest
import torch

from minite_core.engines.mismatch import routing_agreement, routing_agreement_ref
from minite_core.engines import Learner, Sampler
from minite_core.model import PRESETS, CausalLM, set_profile
from minite_core.model.routing import Routing, moe_layers, use_routing
from minite_core.profiles import get_profile

FP32 = get_profile("bf16").replace(name="fp32", dtype="float32")
FP32_R3 = FP32.replace(name="fp32-r3", routing_replay=True)
PROMPTS = [[1, 5, 6], [1, 7, 8, 9, 10], [1, 11], [1, 12, 13, 14]]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def moe():
    return CausalLM(PRESETS["tiny-moe"]).init_weights(0, std=0.3)  # MoE layers 0 and 2, layer 1 dense


def _sample(model, profile=FP32, **kw):
    return Sampler(model, profile).generate(PROMPTS, max_new_tokens=8, seed=3, record_routes=True, **kw)


def test_recording_changes_nothing_and_sees_every_token(moe):
    set_profile(moe, "minite")
    ids = torch.tensor([[1, 5, 6, 7], [1, 8, 9, 10]])
    with torch.no_grad():
        plain = moe(ids)
        with use_routing(moe, Routing()) as routing:
            recorded = moe(ids)
    assert torch.equal(plain, recorded)
    assert moe_layers(moe) == (0, 2) and set(routing.executed) == {0, 2}
    assert all(moe.model.layers[i].mlp.routing is None for i in (0, 2))  # cleared after the block
    for i in (0, 2):
        (top,) = routing.executed[i]
        assert top.shape == (8, 2) and routing.chosen[i][0] is top


def test_sampler_records_prefill_and_decode_steps(moe):
    roll = _sample(moe)
    for p, r, routes in zip(roll.prompt_ids, roll.response_ids, roll.routes):
        assert routes.shape == (len(p) + len(r), 2, 2) and routes.dtype == torch.int32
        routed = (routes[..., 0] >= 0).all(-1)
        assert routed[:len(p) + len(r) - 1].all()  # prompt (prefill) + every fed response token
        # the last sampled token is fed only when the row stopped early and others went on decoding
        assert (routes[~routed] == -1).all()
    # the learner's full-sequence forward under the same fp32 profile routes those tokens to the same sets
    sc = Learner(moe, FP32).score(roll.prompt_ids, roll.response_ids, record_routes=True)
    agree = routing_agreement(sc.routes, roll.routes, moe_layers(moe))
    assert agree == routing_agreement_ref(sc.routes, roll.routes, moe_layers(moe))
    assert agree["routing/topk_disagree"] == 0.0 and agree["routing/first_divergent_layer"] is None
    assert agree["routing/tokens"] == sum(int((x[..., 0] >= 0).all(-1).sum()) for x in roll.routes)


def test_replaying_own_routes_is_bitwise_identity(moe):
    roll = _sample(moe, "minite")
    own = Learner(moe, FP32).score(roll.prompt_ids, roll.response_ids, record_routes=True)
    again = Learner(moe, FP32_R3).score(roll.prompt_ids, roll.response_ids, routes=own.routes, record_routes=True)
    assert torch.equal(own.logp, again.logp)  # gathered gate weights == top-k values, same sets and rank order
    assert all(torch.equal(a, b) for a, b in zip(own.routes, again.routes))


def test_replay_executes_the_sampler_sets(moe):
    roll = _sample(moe, "te-nvfp4")  # a different engine: some sets differ from the fp32 learner's own
    plain = Learner(moe, FP32).score(roll.prompt_ids, roll.response_ids, record_routes=True)
    r3 = Learner(moe, FP32_R3).score(roll.prompt_ids, roll.response_ids, routes=roll.routes, record_routes=True)
    layers = moe_layers(moe)
    assert routing_agreement(plain.routes, roll.routes, layers)["routing/topk_disagree"] > 0  # else vacuous
    assert routing_agreement(r3.routes, roll.routes, layers)["routing/topk_disagree"] == 0.0
    # the first MoE layer's router sees the same input either way (later ones see the replayed layers' outputs)
    key = "routing/topk_disagree/layer0"
    assert routing_agreement(r3.router_routes, roll.routes, layers)[key] == \
        routing_agreement(plain.routes, roll.routes, layers)[key] > 0
    for executed, given in zip(r3.routes, roll.routes):
        routed = (given[..., 0] >= 0).all(-1)
        assert torch.equal(executed[routed], given[routed])
    assert not torch.equal(plain.logp, r3.logp)
    with pytest.raises(ValueError, match="replays the sampler's routing"):
        Learner(moe, FP32_R3).score(roll.prompt_ids, roll.response_ids)


def test_replayed_gate_weights_are_the_routers_own_and_carry_gradient(moe):
    layer = moe.model.layers[0].mlp
    set_profile(moe, FP32.replace(name="fp32-router", router_dtype="float32"))  # weights not rounded to bf16
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, moe.config.hidden_size, generator=g)
    given = torch.tensor([[3, 1], [0, 2], [-1, -1], [2, 3], [1, 0], [-1, -1]])  # -1 rows keep their own
    layer.routing = partial(Routing(replay={0: given}), 0)
    try:
        top_w, top_idx = layer.route(x)
    finally:
        layer.routing = None
    own_w, own_idx = layer.route(x)
    probs = torch.softmax(layer.gate(x), dim=-1)
    keep = given[:, 0] < 0
    assert torch.equal(top_idx[~keep], given[~keep]) and torch.equal(top_idx[keep], own_idx[keep])
    expect = probs.gather(-1, top_idx)
    torch.testing.assert_close(top_w, expect / expect.sum(-1, keepdim=True), rtol=0, atol=1e-7)  # norm_topk_prob
    layer.gate.weight.grad = None
    (top_w * torch.randn(top_w.shape, generator=g)).sum().backward()
    assert layer.gate.weight.grad is not None and layer.gate.weight.grad.abs().sum() > 0


def test_dense_model_has_no_routing():
    dense = CausalLM(PRESETS["tiny-dense"]).init_weights(0, std=0.3)
    roll = _sample(dense)
    assert roll.routes is None and moe_layers(dense) == ()
    sc = Learner(dense, FP32_R3).score(roll.prompt_ids, roll.response_ids, routes=None, record_routes=True)
    assert sc.routes is None  # replay on a dense model: nothing to replay, no error
    m = routing_agreement(sc.routes, roll.routes, ())
    assert m == {"routing/applies": False, "routing/topk_disagree": None, "routing/first_divergent_layer": None}
    assert m == routing_agreement_ref(sc.routes, roll.routes, ())
