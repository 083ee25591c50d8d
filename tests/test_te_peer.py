"""Transformer Engine as a peer learner (peers/te_learner.py, peers/te_compare.py).

CPU (always): the adapter's plumbing against a stand-in with TE's API shape (tests/fake_te.py, plain-torch bf16
GEMMs = our bf16 QuantLinear's): every decoder GEMM swapped for a TE module under the same name, router and LM head
kept, the weights copied (or shared), rows padded to 32, experts without tokens skipped (per-expert) or padded
(grouped), log-probs of the TE copy equal to ours bit for bit, a full update step, te_compare's helpers with
the first-divergence trace (bf16: no module apart; NVFP4 vs the stand-in's bf16: layer 0's q_proj first).
GPU (`-m gpu`, real TE; skipped with the reason otherwise): TE's NVFP4QuantizerRef vs our formats on CUDA bit for
bit, one te.Linear per mode vs our QuantLinear and vs TE's dataflow in our formats, end-to-end log-probs, and a
full update step in every mode (bf16, FP8 current / blockwise where the GPU has them, NVFP4 reference).
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from minite_core.peers import te_learner
from minite_core.engines.learner import Learner
from minite_core.model import PRESETS, CausalLM
from minite_core.nn import GroupedLinear, QuantLinear
from tests import fake_te, te_reference

TE_OK, TE_REASON = te_learner.available()
TE_SHAPE = PRESETS["tiny-moe"].replace(hidden_size=64, head_dim=16, intermediate_size=64, moe_intermediate_size=32)
needs_te = pytest.mark.skipif(not TE_OK, reason=TE_REASON)


# ---------------------------------------------------------------- CPU: plumbing against the stand-in
REF_OK, REF_REASON = te_reference.available()


@pytest.fixture
def fake(monkeypatch):
    """The stand-in TE; with TE's real reference quantizer module under custom_recipes when .te/ has it."""
    for name, module in fake_te.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    if REF_OK:
        ref, pkg = te_reference.load(), "transformer_engine.pytorch.custom_recipes"
        monkeypatch.setitem(sys.modules, pkg, type(sys)(pkg))
        monkeypatch.setitem(sys.modules, f"{pkg}.reference_nvfp4", ref)
        monkeypatch.setitem(sys.modules, f"{pkg}.reference_utils", ref.reference_utils)
    monkeypatch.setattr(te_learner, "require", lambda: None)
    monkeypatch.setattr(te_learner, "_require_cuda_model", lambda model: None)
    monkeypatch.setattr(te_learner, "_RECIPES", {})
    fake_te.ACTIVE_RECIPES.clear()
    return fake_te


def _model(seed=0):
    return CausalLM(PRESETS["tiny-moe"]).init_weights(seed, std=0.2)  # MoE, dense (layer 1), MoE layers


def _te_shape_model(seed=0):
    """tiny-moe with every GEMM's K a multiple of 32 (TE's reference qgemm needs it, NVFP4QuantizerRef.qgemm)."""
    return CausalLM(TE_SHAPE).init_weights(seed, std=0.2)


def _batch():
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 64, (n,), generator=g).tolist() for n in (5, 9, 3)]
    responses = [torch.randint(4, 64, (n,), generator=g).tolist() for n in (7, 2, 12)]
    return prompts, responses


@pytest.mark.parametrize("experts", ["per-expert", "grouped"])
def test_te_copy_matches_our_bf16_learner(fake, experts):
    model = _model()
    te_model = te_learner.build_te_model(model, "bf16", experts=experts)
    ours = {n for n, m in model.named_modules() if isinstance(m, QuantLinear) and m.role == "linear"}
    assert ours == {n for n, m in te_model.named_modules() if isinstance(m, te_learner.TELinear)
                    and not n.split(".")[-1].isdigit()}  # same names (per-expert TELinears are children)
    grouped = {n for n, m in model.named_modules() if isinstance(m, GroupedLinear)}
    assert grouped == {n for n, m in te_model.named_modules() if isinstance(m, te_learner.TEExperts)}
    kept = {n for n, m in te_model.named_modules() if isinstance(m, QuantLinear)}
    assert kept == {"lm_head"} | {n for n in kept if n.endswith("mlp.gate")} and len(kept) == 3  # router x2 + head
    p, r = _batch()
    lp_ours, _, mask = Learner(model, "bf16").logprobs(p, r)
    lp_te, _, mask_te = te_learner.TELearner(model, "bf16", experts=experts).logprobs(p, r)
    assert torch.equal(mask, mask_te) and torch.equal(lp_ours, lp_te)


def test_empty_experts_and_quantized_grouped_padding(fake):
    from minite_core.nn.moe_layout import moe_layout, permute

    src = GroupedLinear(4, 32, 48)
    torch.nn.init.normal_(src.weight)
    top_idx = torch.tensor([[1, 3]] * 9 + [[3, 1]] * 8)  # experts 0 and 2 get no token
    layout = moe_layout(top_idx, 4)
    x = permute(torch.randn(17, 32).bfloat16(), layout)  # (Tp, 32): 16-aligned segments, zero pad rows
    bounds = layout.bounds()
    ref = torch.cat([torch.nn.functional.linear(x[s:t], src.weight[e].bfloat16())
                     for e, (s, t) in enumerate(zip(bounds[:-1], bounds[1:])) if t > s])
    for mode, path in (("bf16", "per-expert"), ("bf16", "grouped"), ("fp8-current", "grouped")):
        out = te_learner.TEExperts(src, te_learner.get_mode(mode), experts=path)(x, layout)
        assert out.shape == (layout.num_rows, 48) and torch.equal(out, ref), (mode, path)
    assert [type(r).__name__ for r in fake.ACTIVE_RECIPES] == ["Float8CurrentScaling"]
    with pytest.raises(ValueError, match="per-expert"):
        te_learner.TEExperts(src, te_learner.get_mode("nvfp4"), experts="grouped")


@pytest.mark.parametrize("share", [False, True])
def test_update_step_copy_or_share(fake, share):
    model = _model(1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    te_model = te_learner.build_te_model(model, "bf16", share_weights=share)
    opt = torch.optim.SGD(te_model.parameters(), lr=0.5)
    ids = torch.randint(4, 64, (2, 17), generator=torch.Generator().manual_seed(2))
    loss = te_learner.te_train_step(te_model, opt, ids[:, :-1], ids[:, 1:])
    assert math.isfinite(loss.item())
    q = "model.layers.0.self_attn.q_proj"
    moved = not torch.equal(te_model.get_submodule(q).weight.detach(), before[q + ".weight"])
    assert moved and all(p.grad is None for p in te_model.parameters())
    same = all(torch.equal(p.detach(), before[n]) for n, p in model.named_parameters())
    assert same != share  # copy: the original is untouched; shared: it moved with the TE copy
    if share:
        e = "model.layers.0.mlp.experts.gate_up"
        assert torch.equal(te_model.get_submodule(e).experts[1].weight.detach(),
                           model.get_submodule(e).weight.detach()[1])


@pytest.mark.skipif(not REF_OK, reason=REF_REASON)
def test_compare_helpers_run_on_the_stand_in(fake):
    """te_compare's GEMM and end-to-end helpers end to end on CPU (values from the stand-in's bf16 GEMMs: only
    the bf16 rows mean something here, and they must agree exactly)."""
    from minite_core.peers.te_compare import _summary, compare_e2e, compare_gemm

    r = {}
    for mode in ("bf16", "nvfp4", "nvfp4-rowscaled"):
        r.update(compare_gemm(mode, 64, 128, 96, device="cpu"))
    for out in ("fprop", "dgrad", "wgrad"):
        assert r[f"gemm/bf16/64x128x96/{out}/ours/eq_bf16"] == 1.0
        assert all(f"gemm/nvfp4/64x128x96/{out}/{sut}/rel" in r for sut in ("ours", "dataflow"))
    assert all(math.isfinite(v) for v in r.values())
    p, resp = _batch()
    # NVFP4 end to end against TE's reference forward on the stand-in (fake_te: its quantizers + qgemm), and the
    # same mode emulated with our default fp32 GEMM (w4a4_gemm="reference"): the trace must find that one
    nv = te_learner.MODES["nvfp4"]
    fp32_gemm = dataclasses.replace(nv, name="nvfp4-fp32gemm",
                                    emulated_by=nv.emulated_by.replace(w4a4_gemm="reference"))
    modes = ("bf16", "nvfp4", "nvfp4-rowscaled", "nvfp4-4over6", fp32_gemm)
    e2e = compare_e2e(_te_shape_model(), p, resp, modes=modes)
    assert "e2e/nvfp4/te-vs-te-bf16/k3" in e2e and e2e["e2e/nvfp4/te-vs-te-bf16/max_abs_delta"] > 0
    for mode in ("bf16", "nvfp4", "nvfp4-rowscaled", "nvfp4-4over6"):  # w4a4_gemm="te-ref": TE's to the bit
        t = f"e2e/{mode}/trace/"
        assert e2e[f"e2e/{mode}/ours-vs-te/max_abs_delta"] == 0.0 and e2e[t + "first_nonzero"] == "none", mode
        assert {v for k, v in e2e.items() if k.startswith(t) and k.endswith("/rel")} == {0.0}, mode
        assert e2e[t + "lm_head/eq_bf16"] == 1.0 and e2e[t + "model.layers.0.mlp.gate/routing_flip"] == 0.0
    t = "e2e/nvfp4-fp32gemm/trace/"
    first = e2e[t + "first_nonzero"]
    assert first.split(".")[-1] in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                                    "gate_up", "down"), first  # a GEMM: the arithmetic knob
    assert e2e[t + "model.layers.0.input_layernorm/rel"] == 0.0 < e2e[t + first + "/rel"]
    assert e2e[t + "model.layers.0.self_attn.q_proj/step"] == 1.0 and t + "model.layers.0.mlp.experts.down/rel" in e2e
    md = _summary({**r, **e2e}, {"grouped/bf16/all-experts": "ok"})
    assert "| nvfp4/64x128x96 | wgrad |" in md and "| bf16/ours-vs-te |" in md and "all-experts`: ok" in md
    assert "| nvfp4 (threshold 1e-03) | none | none |" in md and f"| nvfp4-fp32gemm (threshold 1e-03) | `{first}`" in md


@pytest.mark.skipif(not REF_OK, reason=REF_REASON)
def test_compare_quantizers_with_te_reference_on_cpu(fake):
    """te_compare.compare_quantizers (what the H200 run reports) on CPU, with TE's real reference module."""
    from minite_core.peers.te_compare import compare_quantizers

    r = compare_quantizers(m=64, k=128, device="cpu")
    assert {k: v for k, v in r.items() if "rht_wgrad_fp32" not in k and v != 1.0} == {}
    assert min(v for k, v in r.items() if "rht_wgrad_fp32" in k) < 1.0  # the pinned bf16-RHT difference


@pytest.mark.skipif(not REF_OK, reason=REF_REASON)
def test_cli_run_writes_te_v1_json(fake, monkeypatch, tmp_path):
    """The command the lead runs on the H200, on CPU against the stand-in: it completes and writes the contract."""
    from minite_core.peers import te_compare

    monkeypatch.setattr(te_learner, "available", lambda: (True, "stand-in"))
    monkeypatch.setattr(te_compare, "GEMM_SHAPES", ((64, 128, 96),))
    monkeypatch.setattr(te_compare, "H200_RL_MODEL", TE_SHAPE)
    assert te_compare.main(["run", "--out", str(tmp_path), "--device", "cpu", "--skip-probe", "--prompts", "3"]) == 0
    res = json.loads((tmp_path / "agreement.json").read_text())
    assert res["schema"] == "te/v1" and res["experiment"] == "h200" and {"gpu", "torch", "commit"} <= set(res["env"])
    assert set(res["errors"]) == {"mode/fp8-current", "mode/fp8-block"}  # the stand-in has no FP8
    assert "gemm/nvfp4-4over6/64x128x96/wgrad/dataflow/rel" in res["metrics"]
    assert "e2e/nvfp4-rowscaled/ours-vs-te/k3" in res["metrics"] and (tmp_path / "summary.md").exists()
    assert res["metrics"]["e2e/bf16/trace/first_divergence"] == "none"
    assert "first-divergence trace" in (tmp_path / "summary.md").read_text()


def _diagnose_argv(ckpt, out, pairs, *extra):
    return ["--checkpoint", str(ckpt), "--pairs", pairs, "--num-prompts", "4", "--max-new-tokens", "12",
            "--seed", "0", "--device", "cpu", "--out", str(out), "--experiment", "test", *extra]


def test_diagnose_te_learner_pair_on_the_stand_in(fake, monkeypatch, tmp_path):
    """`minite diagnose` with a real-TE learner (`te:bf16`) end to end on the stand-in: TELearner rescores the
    sampler's tokens (the stand-in's GEMMs run), every metric equals our bf16 learner's on the same rollout (the
    stand-in is our bf16 GEMM), the trace and the attribution are skipped for that pair with the reason."""
    from minite_core.diagnostics.cli import TE_SKIP, main
    from minite_core.model import save_pretrained

    monkeypatch.setattr(te_learner, "available", lambda: (True, "stand-in"))
    calls = []
    forward = fake.Linear.forward
    monkeypatch.setattr(fake.Linear, "forward", lambda self, x: calls.append(self.name) or forward(self, x))
    ckpt = save_pretrained(_model(), tmp_path / "ckpt")
    out = tmp_path / "diag.json"
    assert main(_diagnose_argv(ckpt, out, "bf16:bf16,te:bf16:bf16", "--trace", "--trace-sequences", "2",
                               "--k3-budget", "te:bf16:bf16=1", "--attribution")) == 0
    res = json.loads(out.read_text())
    assert "model.layers.0.self_attn.q_proj" in calls and "model.layers.0.mlp.experts.down.1" in calls
    ours, te = res["metrics"]["bf16:bf16"], res["metrics"]["te:bf16:bf16"]
    assert te["mismatch/tokens"] > 0 and te["routing/applies"] and "routing/topk_disagree/layer2" in te
    assert te == ours and res["by_position"]["te:bf16:bf16"] == res["by_position"]["bf16:bf16"]
    assert res["skipped"] == [{"pair": "te:bf16:bf16", "step": s, "reason": TE_SKIP[s]}
                              for s in ("trace", "attribution")]
    assert {t["pair"] for t in res["trace"]} == {"bf16:bf16"} and res["attribution"]["rows"]
    assert res["budget"][0]["pair"] == "te:bf16:bf16" and res["budget"][0]["pass"]
    assert res["config"]["te"] == "stand-in" and res["config"]["pairs"] == ["bf16:bf16", "te:bf16:bf16"]


def test_diagnose_te_pair_fails_in_one_line_without_te(monkeypatch, tmp_path, capsys):
    """No TE (or no CUDA, or a mode this GPU lacks): one line naming the pair and TE's reason, before the
    checkpoint is even read (it does not exist here); never a fallback to our emulation."""
    from minite_core.cli import main
    from minite_core.diagnostics.cli import parse_pairs

    monkeypatch.setattr(te_learner, "available", lambda: (False, "transformer_engine is not installed: see README"))
    argv = ["diagnose", *_diagnose_argv(tmp_path / "missing", tmp_path / "d.json", "bf16:bf16,te:nvfp4:vllm-nvfp4")]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["minite diagnose: error: pair te:nvfp4:vllm-nvfp4: the real TE learner cannot run: "
                   "transformer_engine is not installed: see README (--debug shows the traceback)"]
    assert not (tmp_path / "d.json").exists()
    assert parse_pairs("te:nvfp4:vllm-nvfp4,te-nvfp4:vllm-nvfp4") == [("te:nvfp4", "vllm-nvfp4"),
                                                                      ("te-nvfp4", "vllm-nvfp4")]
    for bad, why in (("te:fp4:bf16", "unknown TE mode"), ("bf16:te:bf16", "unknown profile"),
                     ("te:bf16", "unknown profile")):
        with pytest.raises(ValueError, match=why):
            parse_pairs(bad)


def test_diagnose_te_mode_this_gpu_lacks_fails_in_one_line(fake, monkeypatch, tmp_path):
    """TE present but the mode is not (the stand-in has no FP8): the same one-line failure with TE's reason."""
    from minite_core.diagnostics.cli import require_te

    monkeypatch.setattr(te_learner, "available", lambda: (True, "stand-in"))
    require_te([("te:bf16", "bf16")])
    with pytest.raises(RuntimeError, match=r"^pair te:fp8-block:bf16: .*not supported here: stand-in: no FP8$"):
        require_te([("te:bf16", "bf16"), ("te:fp8-block", "bf16")])


def test_config_accepts_te_learner_pairs():
    """The experiment checks (schema + semantics) take `te:<mode>:<sampler>` pairs and budgets, name a bad mode,
    and refuse a te:* attribution base."""
    from snakemake.utils import validate

    from minite_core.experiment import schema_errors, semantic_errors

    schema = Path(__file__).resolve().parents[1] / "workflow" / "schemas" / "config.schema.yaml"

    def errors(diagnostics):
        config = {"experiment": "t", "diagnostics": diagnostics}
        bad = schema_errors(config, schema)
        if bad:
            return bad
        validate(config, str(schema))  # fills the defaults, as the Snakefile does
        return semantic_errors(config)

    pairs = ["te:nvfp4:vllm-nvfp4", "te-nvfp4:vllm-nvfp4", "te:bf16:bf16"]
    assert errors({"pairs": pairs, "budget": {"te:nvfp4:vllm-nvfp4": 0.1}}) == []
    assert errors({"pairs": ["te:fp4:vllm-nvfp4"]}) == [
        "config: diagnostics.pairs[0]: unknown TE mode 'fp4'; one of " + ", ".join(sorted(te_learner.MODES))]
    assert errors({"pairs": ["te:bf16:te:bf16"]})  # the schema: a sampler is a profile name
    assert errors({"attribution_base": "te:nvfp4:vllm-nvfp4"})[0].startswith(
        "config: diagnostics.attribution_base: ")


def test_modes_and_errors():
    assert set(te_learner.MODES) == {"bf16", "fp8-current", "fp8-block", "nvfp4", "nvfp4-rowscaled", "nvfp4-4over6"}
    nv = te_learner.MODES["nvfp4"].emulated_by
    assert nv.weight.block == (16, 16) and nv.grad.rounding == "rne" and nv.wgrad_rht  # TE ref: no SR
    assert te_learner.MODES["nvfp4-rowscaled"].emulated_by.activation.scale_mode == "row"
    with pytest.raises(ValueError, match="unknown TE mode"):
        te_learner.get_mode("fp4")
    if not TE_OK:
        with pytest.raises(RuntimeError, match="unavailable"):
            te_learner.build_te_model(_model(), "bf16")


# ---------------------------------------------------------------- GPU: the real Transformer Engine
@pytest.mark.gpu
@needs_te
@pytest.mark.parametrize("mode", ["bf16", "nvfp4", "nvfp4-rowscaled", "nvfp4-4over6", "fp8-current", "fp8-block"])
def test_gpu_gemm_agreement(mode):
    from minite_core.peers.te_compare import compare_gemm

    ok, why = te_learner.mode_available(mode)
    if not ok:
        pytest.skip(why)
    r = compare_gemm(mode, 256, 512, 384)
    key = f"gemm/{mode}/256x512x384"
    for out in ("fprop", "dgrad", "wgrad"):
        q = r[f"{key}/{out}/quant_rel"]
        assert math.isfinite(q) and q < (0.01 if mode == "bf16" else 0.25), (out, q)
        if mode.startswith("nvfp4"):  # TE's dataflow in our formats = TE up to GEMM rounding
            assert r[f"{key}/{out}/dataflow/rel"] < 1e-3 and r[f"{key}/{out}/dataflow/eq_bf16"] > 0.99, out
        if f"{key}/{out}/ours/rel" in r:  # same quantizers (wgrad too: wgrad_rht_dtype, wgrad_input_scale_mode)
            assert r[f"{key}/{out}/ours/rel"] < (1e-2 if mode == "bf16" else 1e-3), (out, r[f"{key}/{out}/ours/rel"])
        if mode.startswith("nvfp4"):  # emulated_by runs TE's qgemm order (w4a4_gemm="te-ref"): bitwise on CPU
            assert r[f"{key}/{out}/ours/eq_bf16"] == 1.0, (out, r[f"{key}/{out}/ours/rel"])


@pytest.mark.gpu
@needs_te
def test_gpu_quantizers_bit_exact():
    from minite_core.peers.te_compare import compare_quantizers

    r = compare_quantizers()
    for key, v in r.items():
        if "rht_wgrad_fp32" not in key:
            assert v == 1.0, (key, v)


def _gpu_model(layers=2):
    from minite_core.peers.te_compare import H200_RL_MODEL

    return CausalLM(H200_RL_MODEL.replace(num_hidden_layers=layers)).init_weights(0, std=0.1).cuda()


@pytest.mark.gpu
@needs_te
def test_gpu_e2e_logprobs():
    from minite_core.peers.te_compare import compare_e2e, task_batch

    modes = tuple(m for m in te_learner.MODES if te_learner.mode_available(m)[0])
    r = compare_e2e(_gpu_model(), *task_batch(8, 0), modes=modes)
    assert r["e2e/bf16/ours-vs-te/max_abs_delta"] < 0.5  # the floor: both bf16
    assert r["e2e/bf16/trace/first_nonzero"] == "none" or r["e2e/bf16/ours-vs-te/max_abs_delta"] > 0  # trace agrees
    for mode in modes[1:]:
        assert math.isfinite(r[f"e2e/{mode}/te-vs-te-bf16/k3"]), mode
        if te_learner.MODES[mode].emulated_by is not None:
            assert math.isfinite(r[f"e2e/{mode}/ours-vs-te/k3"]), mode


@pytest.mark.gpu
@needs_te
@pytest.mark.parametrize("mode", list(te_learner.MODES))
def test_gpu_update_step(mode):
    ok, why = te_learner.mode_available(mode)
    if not ok:
        pytest.skip(why)
    te_model = te_learner.build_te_model(_gpu_model(), mode)
    opt = torch.optim.AdamW(te_model.parameters(), lr=1e-3)
    ids = torch.randint(4, 64, (2, 65), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    q = te_model.model.layers[0].self_attn.q_proj.weight
    experts = [m.weight for m in te_model.model.layers[0].mlp.experts.down.experts]
    before = [w.detach().clone() for w in [q] + experts]
    loss = te_learner.te_train_step(te_model, opt, ids[:, :-1], ids[:, 1:])
    assert math.isfinite(loss.item())
    moved = [not torch.equal(b, w.detach()) for b, w in zip(before, [q] + experts)]
    assert moved[0] and any(moved[1:])  # experts that got no token keep their weights


@pytest.mark.gpu
@needs_te
def test_gpu_diagnose_te_learner_pairs(tmp_path):
    """The H200 step of workflow/scripts/h200_te.sh on a 2-layer random model: real TE as the learner of a pair.
    TE bf16 ↔ bf16 is our bf16 pair up to GEMM rounding (te_compare measured ours-vs-te bf16 log-probs equal on
    the H200 with the reference kernels); real TE NVFP4 ↔ vLLM-NVFP4 is far above that floor."""
    from minite_core.diagnostics.cli import main
    from minite_core.model import save_pretrained

    ckpt = save_pretrained(_gpu_model().cpu(), tmp_path / "ckpt")
    out = tmp_path / "diag-te" / "mismatch.json"
    pairs = "te:nvfp4:vllm-nvfp4,te-nvfp4:vllm-nvfp4,te:bf16:bf16,bf16:bf16"
    assert main(["--checkpoint", str(ckpt), "--pairs", pairs, "--num-prompts", "8", "--max-new-tokens", "32",
                 "--device", "cuda", "--kernels", "reference", "--sampler-engine", "fast-eager", "--trace",
                 "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    k3 = {pair: m["mismatch/k3"] for pair, m in res["metrics"].items()}
    assert all(math.isfinite(v) for v in k3.values()) and res["config"]["te"].startswith("transformer_engine 2.20")
    assert res["metrics"]["te:bf16:bf16"]["mismatch/tokens"] == res["metrics"]["bf16:bf16"]["mismatch/tokens"]
    assert k3["te:bf16:bf16"] == pytest.approx(k3["bf16:bf16"], rel=0.05, abs=1e-6), k3
    assert k3["te:nvfp4:vllm-nvfp4"] > 10 * k3["bf16:bf16"], k3
    assert {s["pair"] for s in res["skipped"]} == {"te:nvfp4:vllm-nvfp4", "te:bf16:bf16"}
    assert {t["pair"] for t in res["trace"]} == {"te-nvfp4:vllm-nvfp4", "bf16:bf16"}
