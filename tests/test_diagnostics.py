"""Diagnostics: metrics (vectorised == loop reference), trace, attribution, and the `minite diagnose` pipeline on
a tiny random checkpoint with the DAG's four pairs (the measured k3 ordering is printed, see -s)."""
from __future__ import annotations

import json
import math

import pytest
import torch

from minite_core.diagnostics import attribution as attr
from minite_core.diagnostics.cli import DEFAULT_PAIRS, main as diagnose_main, parse_pairs
from minite_core.engines.mismatch import (KEYS, full_vocab_kl_ref, mismatch_by_position, mismatch_by_position_ref,
                                             mismatch_metrics, mismatch_metrics_ref, routing_agreement,
                                             routing_agreement_ref)
from minite_core.diagnostics.trace import trace_pair
from minite_core.engines import Learner, Sampler, processed_logprobs
from minite_core.engines.learner import full_vocab_kl
from minite_core.model import PRESETS, CausalLM, save_pretrained
from minite_core.profiles import get_profile

METRIC_RTOL = 1e-9  # float64 vectorised vs Python floats: summation order only


def _random_case(seed, N=5, T=40, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    lp_s = -torch.rand(N, T, generator=g) * 4  # (N, T) log-probs in [-4, 0]
    lp_l = (lp_s + scale * torch.randn(N, T, generator=g)).clamp(max=0)
    mask = torch.rand(N, T, generator=g) < 0.8
    am_l, am_s = torch.randint(0, 5, (N, T), generator=g), torch.randint(0, 5, (N, T), generator=g)
    return lp_l, lp_s, mask, am_l, am_s


def _close(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], float) and math.isnan(a[k]):
            assert math.isnan(b[k]), k
        else:
            assert a[k] == pytest.approx(b[k], rel=METRIC_RTOL, abs=1e-12), k


@pytest.mark.parametrize("seed,scale", [(0, 0.3), (1, 3.0), (2, 1e-4)])
def test_metrics_vectorised_equals_loop(seed, scale):
    lp_l, lp_s, mask, am_l, am_s = _random_case(seed, scale=scale)
    kl = torch.rand(lp_l.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    kw = dict(argmax_learner=am_l, argmax_sampler=am_s, kl=kl)
    _close(mismatch_metrics(lp_l, lp_s, mask, **kw), mismatch_metrics_ref(lp_l, lp_s, mask, **kw))
    vec, ref = mismatch_by_position(lp_l, lp_s, mask, **kw), mismatch_by_position_ref(lp_l, lp_s, mask, **kw)
    assert [(r["lo"], r["hi"]) for r in vec] == [(0, 8), (8, 16), (16, 32), (32, 64)]
    for a, b in zip(vec, ref):
        _close(a, b)


def test_metrics_identity_and_small_delta():
    lp = -torch.rand(3, 10)
    mask = torch.ones(3, 10, dtype=torch.bool)
    m = mismatch_metrics(lp, lp, mask, argmax_learner=torch.zeros(3, 10), argmax_sampler=torch.zeros(3, 10))
    assert m["mismatch/k1"] == m["mismatch/k3"] == m["mismatch/chi2"] == m["mismatch/argmax_flip"] == 0.0
    assert m["mismatch/ess"] == pytest.approx(1.0) and m["mismatch/pearson_p"] == pytest.approx(1.0)
    d = 1e-4  # fp32 r - 1 - Δ would be cancellation noise here; expm1 in float64 gets Δ²/2
    k3 = mismatch_metrics(lp + d, lp, mask)["mismatch/k3"]
    assert k3 == pytest.approx(d * d / 2, rel=1e-3)
    empty = mismatch_metrics(lp, lp, torch.zeros_like(mask))
    assert empty["mismatch/tokens"] == 0 and math.isnan(empty["mismatch/k3"])
    assert set(KEYS) == {k.split("/")[1] for k in m}


def test_max_abs_delta_and_kl_keys():
    lp = -torch.rand(2, 6)
    mask = torch.ones(2, 6, dtype=torch.bool)
    bumped = lp.clone()
    bumped[1, 3] -= 0.5
    m = mismatch_metrics(bumped, lp, mask)
    assert m["mismatch/max_abs_delta"] == pytest.approx(0.5) and "mismatch/kl_full_vocab" not in m
    kl = torch.zeros(2, 6, dtype=torch.float64)
    kl[0, 0] = 1.2  # masked out below
    mask[0, 0] = False
    assert mismatch_metrics(lp, lp, mask, kl=kl)["mismatch/kl_full_vocab"] == 0.0


@pytest.mark.parametrize("seed,scale", [(0, 0.3), (1, 3.0), (2, 1e-4)])
def test_full_vocab_kl_equals_loop_reference(seed, scale):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(7, 50, generator=g) * 2
    lp_s = processed_logprobs(logits, top_p=0.9)  # a top-p tail of -inf: p = 0 terms add nothing
    lp_l = processed_logprobs(logits + scale * torch.randn(7, 50, generator=g))
    kl = full_vocab_kl(lp_s, lp_l)
    assert kl.dtype == torch.float64 and (kl >= 0).all()
    assert kl.tolist() == pytest.approx(full_vocab_kl_ref(lp_s, lp_l), rel=1e-9, abs=1e-15)
    assert (full_vocab_kl(lp_l, lp_l) == 0).all()
    assert torch.isinf(full_vocab_kl(lp_l, lp_s)).all()  # the sampler kept tokens the other side cut: KL = inf


def _random_routes(g, n_rows=4, layers=3, K=2, E=6, flip=0.3):
    ref, sut = [], []
    for _ in range(n_rows):
        S = int(torch.randint(3, 9, (1,), generator=g))
        a = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(S * layers)]).view(S, layers, K)
        b = a.flip(-1).clone()  # same sets, other order: not a disagreement
        change = torch.rand(S, layers, generator=g) < flip
        b[..., 0] = torch.where(change, (b[..., 0] + 1 + (b[..., 0] + 1 == b[..., 1]).long()) % E, b[..., 0])
        b[-1] = -1  # the sampler's unfed last token
        ref.append(a.int())
        sut.append(b.int())
    return ref, sut


def test_routing_agreement_equals_loop_reference():
    g = torch.Generator().manual_seed(0)
    ref, sut = _random_routes(g)
    layers = (0, 2, 5)
    vec, loop = routing_agreement(ref, sut, layers), routing_agreement_ref(ref, sut, layers)
    assert vec.keys() == loop.keys()
    for k in vec:
        assert vec[k] == pytest.approx(loop[k], rel=1e-12), k
    assert 0 < vec["routing/topk_disagree"] < vec["routing/topk_disagree_any_layer"] <= 1
    assert vec["routing/tokens"] == sum(len(r) - 1 for r in ref)
    same = routing_agreement(ref, [r.flip(-1) for r in ref], layers)  # a set has no order
    assert same["routing/topk_disagree"] == 0.0 and same["routing/first_divergent_layer"] is None
    late = [r.clone() for r in ref]
    late[1][0, 2] = (late[1][0, 2] + 1) % 6  # one token, last layer only (ids stay distinct or not: a set changes)
    assert routing_agreement(ref, late, layers)["routing/first_divergent_layer"] == 5


def test_learner_full_vocab_kl_matches_the_full_rows(moe):
    """Learner.score's chunked KL == the KL of the full (N, T, V) processed rows of the same chunking."""
    roll = Sampler(moe, "minite").generate([[1, 5, 6], [1, 7, 8, 9], [1, 4]], max_new_tokens=6, seed=1,
                                           keep_logprob_rows=True, temperature=0.8)
    for bs in (None, 1, 2):  # te-nvfp4's per-tensor scales make the logits depend on the chunking itself
        learner = Learner(moe, "te-nvfp4", batch_size=bs)
        logits, mask = learner.response_logits(roll.prompt_ids, roll.response_ids)
        full = processed_logprobs(logits, temperature=0.8)  # (N, T, V)
        sc = learner.score(roll.prompt_ids, roll.response_ids, temperature=0.8, sampler_rows=roll.logprob_rows)
        for i, rows in enumerate(roll.logprob_rows):
            R = len(roll.response_ids[i])
            assert rows.shape == (R, moe.config.vocab_size)
            ref = full_vocab_kl_ref(rows, full[i, :R])
            assert sc.kl_full_vocab[i, :R].tolist() == pytest.approx(ref, rel=1e-9)
            assert 0 < min(ref)
    # the sampler's rows are the distributions it drew from: its logprobs are their entries at the tokens
    for rows, toks, lps in zip(roll.logprob_rows, roll.response_ids, roll.logprobs):
        assert rows[torch.arange(len(toks)), toks].tolist() == lps


def test_attribution_knobs_reach_target_and_skip_backward_only():
    calls = []

    def fake(lp, sp):
        calls.append((lp.name, sp.name))
        return {"mismatch/k3": float(len(calls))}

    res = attr.attribute(fake)
    knobs = [r["knob"] for r in res["rows"]]
    assert knobs[:8] == ["naive", "weight.block", "fused_weight_scale", "activation.static",
                         "activation.scale_mode", "math", "router_dtype", "lm_head_dtype"] and knobs[-1] == "all"
    neutral = [r for r in res["rows"] if r["forward_neutral"]]
    assert {r["knob"] for r in neutral} == {"wgrad_rht", "wgrad_rht_dtype", "grad"}
    assert "recompute_elementwise" not in knobs  # changes no number (profiles.NON_NUMERIC): not an execution choice
    assert all(r["delta_k3"] == 0.0 for r in neutral)  # memoised on the forward key, not re-run
    assert len(calls) == len(res["rows"]) - len(neutral)
    # switching every knob reproduces the target's forward numerics on both sides
    target = get_profile("minite")
    for side in ("te-nvfp4", "vllm-nvfp4", "vllm-marlin-w4a16"):
        p = get_profile(side)
        for knob in attr.knobs_for(get_profile("te-nvfp4"), p, target):
            p = attr.align(p, target, knob.fields)[0]
        assert attr.forward_key(p) == attr.forward_key(target), side


@pytest.fixture(scope="module")
def moe():
    return CausalLM(PRESETS["tiny-moe"]).init_weights(0, std=0.3)


def test_trace_same_profile_prefill_is_exact_and_decode_is_aligned(moe):
    r = Sampler(moe, "minite").generate([[1, 5, 6], [1, 7, 8, 9, 10]], max_new_tokens=6, seed=0)
    same = trace_pair(moe, "minite", "minite", r.prompt_ids, r.response_ids, sut_mode="prefill")
    assert same["first_nonzero"] is None and all(op["rel_err"] == 0.0 for op in same["ops"])
    kinds = {op["kind"] for op in same["ops"]}
    assert kinds == {"gemm", "attention_core", "attention", "router", "grouped_gemm", "mlp", "layer", "lm_head"}
    dec = trace_pair(moe, "minite", "minite", r.prompt_ids, r.response_ids, sut_mode="decode")
    n_tokens = sum(len(p) + len(x) for p, x in zip(r.prompt_ids, r.response_ids))
    lm = next(op for op in dec["ops"] if op["kind"] == "lm_head")  # every position but the unfed last tokens
    assert lm["coverage"] == pytest.approx((n_tokens - 2) / n_tokens)
    naive = trace_pair(moe, "te-nvfp4", "minite", r.prompt_ids, r.response_ids, sut_mode="prefill")
    assert naive["first_divergence"]["op"] == "model.layers.0.self_attn.q_proj"  # first quantized GEMM


def test_trace_reference_replays_the_sampler_routes(moe):
    """R3 in the trace: the learner reference executes the sampler's expert sets, so every (token, expert) row of
    its expert GEMMs has a sampler counterpart (coverage = the tokens' coverage); without replay, flips drop some."""
    r = Sampler(moe, "minite").generate([[1, 5, 6], [1, 7, 8, 9, 10], [1, 11, 12]], max_new_tokens=8, seed=0,
                                        record_routes=True)
    cover = {}
    for ref in ("te-nvfp4", "te-nvfp4-r3"):
        t = trace_pair(moe, ref, "minite", r.prompt_ids, r.response_ids, sut_mode="decode", routes=r.routes)
        cover[ref] = {op["op"]: op["coverage"] for op in t["ops"]}
    for layer in (0, 2):
        tokens = cover["te-nvfp4"][f"model.layers.{layer}.mlp.gate"]
        experts = f"model.layers.{layer}.mlp.experts.gate_up"
        assert cover["te-nvfp4-r3"][experts] == pytest.approx(tokens) and cover["te-nvfp4"][experts] < tokens


def test_parse_pairs():
    assert parse_pairs(DEFAULT_PAIRS)[1] == ("te-nvfp4", "vllm-nvfp4")
    with pytest.raises(ValueError):
        parse_pairs("bf16")
    with pytest.raises(ValueError):
        parse_pairs("bf16:nope")


def test_diagnose_pipeline_four_pairs(tmp_path, capsys):
    ckpt = save_pretrained(CausalLM(PRESETS["tiny-moe"]).init_weights(0, std=0.3), tmp_path / "ckpt")
    out = tmp_path / "diag.json"
    rc = diagnose_main(["--checkpoint", str(ckpt), "--pairs", DEFAULT_PAIRS, "--num-prompts", "6",
                        "--max-new-tokens", "16", "--seed", "0", "--trace", "--trace-sequences", "3",
                        "--attribution", "--out", str(out), "--figures", str(tmp_path / "fig"),
                        "--experiment", "test"])
    assert rc == 0
    payload = json.loads(out.read_text())
    assert payload["schema"] == "diagnostics/v1" and payload["experiment"] == "test"
    assert payload["config"]["calibration"].startswith("random(")
    k3 = {pair: m["mismatch/k3"] for pair, m in payload["metrics"].items()}
    assert list(k3) == DEFAULT_PAIRS.split(",")
    assert all(m["mismatch/tokens"] > 0 for m in payload["metrics"].values())
    assert {t["sut_mode"] for t in payload["trace"]} == {"prefill", "decode"} and len(payload["trace"]) == 8
    rows = payload["attribution"]["rows"]
    assert rows[0]["mismatch/k3"] == k3["te-nvfp4:vllm-nvfp4"] and rows[-1]["mismatch/k3"] == k3["minite:minite"]
    assert sorted(p.name for p in (tmp_path / "fig").iterdir()) == ["attribution.png", "k3_by_pair.png",
                                                                    "k3_by_position.png", "kl_by_position.png",
                                                                    "routing_by_layer.png", "trace.png"]
    for m in payload["metrics"].values():  # every pair: full-vocabulary KL, max |Δ|, routing agreement
        assert m["mismatch/kl_full_vocab"] >= 0 and m["mismatch/max_abs_delta"] >= 0
        assert m["routing/applies"] is True and set(m) >= {"routing/topk_disagree/layer0",
                                                            "routing/topk_disagree/layer2"}
    assert all("mismatch/kl_full_vocab" in r for rows in payload["by_position"].values() for r in rows)
    assert payload["budget"] is None
    with capsys.disabled():
        print("\n  measured k3: " + "  ".join(f"{p}={v:.3e}" for p, v in k3.items()))
    # the naive pair's gap is orders of magnitude above both references on this model (robust: seen >= 50x)
    assert k3["bf16:bf16"] < k3["te-nvfp4:vllm-nvfp4"] / 10
    assert k3["minite:minite"] < k3["te-nvfp4:vllm-nvfp4"] / 10
