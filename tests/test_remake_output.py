"""`GroupedLinear.remake_output` (nn/experts.py): SwiGLU and the MoE combine keep the expert GEMMs' input codes
instead of their bf16 outputs, and backward makes the outputs again — the same bits as the knob off: the output, the
input gradient and every parameter gradient of an MoE layer, and the loss and every gradient of a learner step
(atol=0, rtol=0, torch.equal), for every learner profile whose experts quantize activations, on the reference
backend (the per-expert loop) and on the fast path (Triton: the interpreter on CPU, compiled with `-m gpu`) with the
fused quantizer on and off. The counted saved bytes fall by exactly the outputs less the codes — the gate|up
input's codes per token under minite's per-token scales, per padded row under TE's per-tensor ones; bf16 ignores it.
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from minite_core.bench.learner_setup import CONFIGS, build
from minite_core.bench.saved_activations import saved_activation_bytes
from minite_core.kernels import dispatch
from minite_core.model import PRESETS, set_profile
from minite_core.model.qwen3_moe import SparseMoE
from minite_core.nn import GroupedLinear, QuantLinear
from minite_core.nn.experts import _row_local
from minite_core.nn.moe_layout import moe_layout, permute
from minite_core.nn.walk import set_sr_seeds
from minite_core.profiles import PROFILES, get_profile

CUDA = torch.cuda.is_available()
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # conftest sets it without a GPU
# every learner profile whose experts quantize activations (a sampler's packed-weight profiles are not learners)
LEARNERS = sorted(n for n, p in PROFILES.items()
                  if p.grad is not None and p.activation is not None and p.decode_gemm == "cached-bf16")


def _knob(model, on: bool, fused: bool = False) -> None:
    for m in model.modules():
        if isinstance(m, GroupedLinear):
            m.remake_output, m.fused_quant = on, fused


# ---- an MoE layer: y, dx and every gradient -------------------------------------------------------------------------
def _moe(profile: str, device, hidden=32, width=16, experts=4, top_k=2) -> SparseMoE:
    cfg = PRESETS["tiny-moe"].replace(hidden_size=hidden, moe_intermediate_size=width, num_experts=experts,
                                      num_experts_per_tok=top_k)
    torch.manual_seed(0)
    moe = SparseMoE(cfg)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.1)
    for j, m in enumerate(m for m in moe.modules() if isinstance(m, (QuantLinear, GroupedLinear))):
        m.profile, m.seed = get_profile(profile), 1000 + j
    return moe.to(device)


def _moe_step(moe, x, on: bool, fused: bool):
    _knob(moe, on, fused)
    for m in moe.modules():
        if isinstance(m, (QuantLinear, GroupedLinear)):
            m.weight_cache.clear()
    moe.zero_grad(set_to_none=True)
    xi = x.detach().requires_grad_(True)
    y = moe(xi)
    (y.float() * torch.linspace(-1, 1, y.shape[-1], device=y.device)).sum().backward()
    return y.detach(), xi.grad, {n: p.grad for n, p in moe.named_parameters()}


def _check_moe(profile: str, device, fused: bool, tokens: int = 24, **shape):
    moe = _moe(profile, device, **shape)
    x = torch.randn(1, tokens, moe.experts.gate_up.in_features, generator=torch.Generator().manual_seed(2))
    x = x.to(device, torch.bfloat16)
    y_ref, dx_ref, g_ref = _moe_step(moe, x, False, fused)
    y_sut, dx_sut, g_sut = _moe_step(moe, x, True, fused)
    assert torch.equal(y_sut, y_ref) and torch.equal(dx_sut, dx_ref), profile
    assert g_sut.keys() == g_ref.keys()
    for name, g in g_ref.items():
        assert torch.equal(g_sut[name], g), (profile, name)
    assert all(g.abs().sum() > 0 for g in g_ref.values())  # router, gate|up and down all in play


@pytest.mark.parametrize("profile", LEARNERS)
def test_moe_layer_bitwise_reference(profile, one_thread):
    """The reference backend: the per-expert loop of `linear` (the recipe runs each expert's `fprop_dq` again)."""
    with dispatch.using_backend("reference"):
        _check_moe(profile, "cpu", fused=False)


@pytest.mark.skipif(not (INTERPRETED or CUDA), reason="needs a CUDA GPU or TRITON_INTERPRET=1 (set by conftest)")
@pytest.mark.parametrize("profile,fused", [("minite", False), ("minite", True), ("te-nvfp4", False),
                                           ("te-nvfp4", True), ("minite-onpolicy", False)])
def test_moe_layer_bitwise_fast_path(profile, fused, one_thread):
    """The fast path: the grouped kernels, the recipe the same grouped GEMM on the decoded codes. With fused_quant
    the knob-off forward quantizes in the GEMM's prologue and the knob-on one in the separate pass (the codes):
    the same bits. minite-onpolicy: the row-local dot. (minite-4over6 has no Triton quantizer: reference only.)"""
    if CUDA:
        pytest.skip("the CPU interpreter variant; the GPU variant is test_gpu_moe_layer_and_step_bitwise")
    with dispatch.using_backend("triton"):
        _check_moe(profile, "cpu", fused)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("profile", ["minite", "te-nvfp4", "minite-onpolicy"])
@pytest.mark.parametrize("fused", [False, True])
def test_gpu_moe_layer_and_step_bitwise(profile, fused):
    """Compiled: an MoE layer at a width past one tile (uneven expert segments), then a whole learner step."""
    with dispatch.using_backend("triton"):
        _check_moe(profile, "cuda", fused, tokens=600, hidden=512, width=384, experts=16, top_k=4)
        model, _, ids, labels = build(CONFIGS["tiny"], torch.device("cuda"))
        _check_step(model, ids, labels, profile, fused)


# ---- a learner step: loss and every gradient -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    """The learner bench's tiny CPU config: MoE, dense, MoE layers; fp32 masters; one fixed batch."""
    torch.manual_seed(0)
    model, _, ids, labels = build(CONFIGS["tiny"], torch.device("cpu"))
    return model, ids, labels


def _step(model, ids, labels):
    model.zero_grad(set_to_none=True)
    set_sr_seeds(model, 0, 3)
    logits = model(ids)
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _check_step(model, ids, labels, profile: str, fused: bool = False):
    set_profile(model, profile)
    _knob(model, False, fused)
    loss_ref, g_ref = _step(model, ids, labels)
    _knob(model, True, fused)
    loss_sut, g_sut = _step(model, ids, labels)
    _knob(model, False)
    assert torch.equal(loss_sut, loss_ref), profile
    assert g_sut.keys() == g_ref.keys()
    for name, g in g_ref.items():
        assert torch.equal(g_sut[name], g), (profile, name)


@pytest.mark.parametrize("profile", [*LEARNERS, "bf16"])
def test_learner_step_bitwise_reference(tiny, profile):
    _check_step(*tiny, profile)


@pytest.mark.parametrize("profile", ["minite", "te-nvfp4"])
def test_saved_bytes_fall_by_the_outputs_less_the_codes(profile, one_thread):
    """One MoE layer on the reference backend, counted by bench.saved_activations: the knob drops the gate|up output
    SwiGLU kept (bf16 Tp x 2I) and the (N, k, D) rows the reference combine kept (bf16), and adds the two inputs' row
    codes (uint8 rows x K/2, E4M3 rows x K/16, fp32 S_dec a row) — exactly that, nothing hidden from the count.
    The gate|up input is the permutation of the N token rows: under minite's per-token scales its codes are kept
    for the N tokens (gathered to the Tp rows in backward); under TE's per-expert tensor scales for all Tp rows."""
    moe = _moe(profile, "cpu")
    x = torch.randn(1, 24, 32, generator=torch.Generator().manual_seed(2)).bfloat16()
    with dispatch.using_backend("reference"):
        counts = {}
        for on in (False, True):
            _knob(moe, on)
            counts[on] = saved_activation_bytes(moe, x)
        layout = moe_layout(moe.route(x[0])[1], moe.num_experts)
    tp, (n, k), d, i = layout.num_rows, layout.dest.shape, 32, 16
    x_rows = n if profile == "minite" else tp  # rows of gate|up input codes kept
    off, on = ({k: c["by_dtype"].get(k, 0) for k in ("uint8", "float8_e4m3fn", "bfloat16", "float32")}
               for c in (counts[False], counts[True]))
    assert on["uint8"] - off["uint8"] == (x_rows * d + tp * i) // 2
    assert on["float8_e4m3fn"] - off["float8_e4m3fn"] == (x_rows * d + tp * i) // 16
    assert off["bfloat16"] - on["bfloat16"] == tp * 2 * i * 2 + n * k * d * 2
    assert on["float32"] - off["float32"] == (x_rows + tp) * 4  # S_dec a row, of x (per token or per row) and of h
    assert counts[True]["total"] < counts[False]["total"]


def test_token_codes_are_the_padded_rows_codes(one_thread):
    """The per-token recipe's premise, checked on the quantizer itself: under minite's per-token scales the codes
    of permute(x) are the token rows' codes gathered through the layout, a pad (zero) row getting the quantizer's
    codes of a zero row (codes 0, scale 0, S_dec 1); under TE's per-tensor scales they are not row-local."""
    layout = moe_layout(torch.tensor([[0, 1], [1, 2], [2, 0]]), 4)
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(5)).bfloat16() * 3
    x_pad = permute(x, layout)
    spec = get_profile("minite").activation
    assert _row_local(spec) and not _row_local(get_profile("te-nvfp4").activation)
    with dispatch.using_backend("reference"):
        q_pad, q_tok = dispatch.quantize(x_pad, spec), dispatch.quantize(x, spec)
        zero = dispatch.quantize(torch.zeros(1, 32, dtype=torch.bfloat16), spec)
    assert not zero.data.any() and not zero.scale.view(torch.uint8).any() and zero.global_scale.item() == 1.0
    for pad, tok, z in ((q_pad.data, q_tok.data, zero.data), (q_pad.scale.view(torch.uint8),
                        q_tok.scale.view(torch.uint8), zero.scale.view(torch.uint8)),
                        (q_pad.global_scale, q_tok.global_scale, zero.global_scale)):
        assert torch.equal(torch.cat([tok, z]).index_select(0, layout.src), pad)


def test_tiny_model_saves_less_and_bf16_ignores_it(tiny):
    """Every NVFP4 learner profile saves fewer bytes with the knob; bf16 has no codes to keep (no recipe)."""
    model, ids, _ = tiny
    for profile in ("minite", "te-nvfp4"):
        set_profile(model, profile)
        _knob(model, False)
        off = saved_activation_bytes(model, ids)
        _knob(model, True)
        on = saved_activation_bytes(model, ids)
        assert on["total"] < 0.85 * off["total"], (profile, on["total"], off["total"])
        assert "_RecomputeBackward" not in off["by_producer"] or profile == "te-nvfp4"
    set_profile(model, "bf16")
    _knob(model, True)
    gl = next(m for m in model.modules() if isinstance(m, GroupedLinear))
    layout = moe_layout(torch.tensor([[0, 1], [1, 2]]), gl.num_experts)
    x = torch.randn(layout.num_rows, gl.in_features).bfloat16().requires_grad_()
    assert gl(x, layout, remade=True).make is None
    assert "uint8" not in saved_activation_bytes(model, ids)["by_dtype"]
    _knob(model, False)
