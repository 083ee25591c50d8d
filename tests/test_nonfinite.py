"""Non-finite values on the hot path (quantizer checks off): an Inf or NaN is never encoded as a finite value — its
block gets the E4M3 NaN scale, its tensor (or row) a NaN S_dec, in the reference and in the Triton kernels bit for
bit — and a learner step with one stops naming the layer and the operand (nn/nonfinite.py), from S_dec alone.

CPU: the kernels run under TRITON_INTERPRET=1 (tests/conftest.py). GPU (`-m gpu`): the same comparisons compiled."""
from __future__ import annotations

import itertools
import os

import pytest
import torch

from minite_core.formats import nvfp4 as ref
from minite_core.kernels.reference import quantize_reference
from minite_core.model import PRESETS, CausalLM
from minite_core.nn.nonfinite import NonFinite, Watch

triton = pytest.importorskip("triton")
CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
kernels = pytest.mark.skipif(not (CUDA or os.environ.get("TRITON_INTERPRET") == "1"),
                             reason="no GPU and triton imported without TRITON_INTERPRET=1")
NAN_BYTE = 0x7F  # float8_e4m3fn NaN


def _poisoned(m=32, k=64, dtype=torch.float32):
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(0))
    x[1, 5] = float("inf")  # block (1, 0)
    x[3, 40] = float("-inf")  # block (3, 2)
    x[17, 20] = float("nan")  # block (17, 1): another 16x16 tile row than the infs
    return x.to(dtype)


def _bad_blocks(x):
    return ~torch.isfinite(x.float()).reshape(x.shape[0], -1, 16).all(-1)  # (M, K/16)


@pytest.mark.parametrize("mode", ["tensor", "row"])
def test_reference_never_encodes_inf_as_a_finite_value(mode):
    x = _poisoned()
    t = ref.quantize(x, scale_mode=mode, check=False)
    scale = t.scale.view(torch.uint8)
    assert (scale[_bad_blocks(x)] == NAN_BYTE).all()
    if mode == "tensor":  # the tensor's amax is not finite: S_dec NaN, every value NaN (no shifted finite values)
        assert torch.isnan(t.global_scale) and torch.isnan(ref.dequantize(t)).all()
    else:  # per row: only the rows holding one
        bad_rows = _bad_blocks(x).any(1)
        assert torch.equal(torch.isnan(t.global_scale[:, 0]), bad_rows)
        assert torch.isnan(ref.dequantize(t)[bad_rows]).all() and torch.isfinite(ref.dequantize(t)[~bad_rows]).all()
    with pytest.raises(ValueError, match="non-finite"):  # with the check on, as before: an error
        ref.quantize(x, scale_mode=mode)


def test_a_static_scale_keeps_s_dec_and_poisons_the_block():
    x = _poisoned()
    t = ref.quantize(x, amax=4.0, check=False)
    assert torch.isfinite(t.global_scale)
    assert torch.equal(t.scale.view(torch.uint8) == NAN_BYTE, _bad_blocks(x))
    assert torch.equal(torch.isnan(ref.dequantize(t)).reshape(32, -1, 16).all(-1), _bad_blocks(x))


def _same_where_finite(t_sut, t_ref, bad):
    """Scales and S_dec bitwise (NaN bytes included); codes bitwise in the blocks with a finite scale (a NaN-scale
    block decodes to NaN whatever its codes: DESIGN.md leaves them unspecified)."""
    assert torch.equal(t_sut.scale.view(torch.uint8).cpu(), t_ref.scale.view(torch.uint8).cpu()), "scales differ"
    g_sut, g_ref = t_sut.global_scale.cpu(), t_ref.global_scale.cpu()
    assert torch.equal(torch.isnan(g_sut), torch.isnan(g_ref)) and torch.equal(g_sut.nan_to_num(), g_ref.nan_to_num())
    keep = ~bad.cpu().repeat_interleave(8, dim=1)  # 8 bytes (16 codes) a block
    if g_ref.dim():
        keep &= ~torch.isnan(g_ref)  # a NaN row: its block scales are NaN too
    elif torch.isnan(g_ref):
        keep[:] = False
    assert torch.equal(t_sut.data.cpu()[keep], t_ref.data.cpu()[keep]), "codes differ"


@kernels
@pytest.mark.parametrize("block,mode,math,amax,dtype", list(itertools.product(
    [(1, 16), (16, 16)], ["tensor", "row"], ["exact", "fast"], [None, 4.0], [torch.float32, torch.bfloat16])))
def test_triton_quantizer_matches_the_reference_on_non_finite_input(block, mode, math, amax, dtype):
    from minite_core.kernels.quantize import quantize_triton

    x = _poisoned(dtype=dtype)
    bad = _bad_blocks(x)
    if block == (16, 16):  # a tile is poisoned by any of its rows
        bad = bad.reshape(2, 16, -1).any(1, keepdim=True).expand(2, 16, -1).reshape(32, -1)
    kw = dict(block=block, scale_mode=mode, math=math, amax=amax, check=False)
    t_sut, dq = quantize_triton(x.to(DEV), emit_dq=True, **kw)
    t_ref, _ = quantize_reference(x, **kw)
    _same_where_finite(t_sut, t_ref, bad)
    assert torch.isnan(dq.float().cpu().reshape(32, -1, 16)[bad]).all()  # the GEMM operand is NaN there too


@kernels
@pytest.mark.parametrize("rounding", ["rne", "sr"])
def test_along_token_quantizer_matches_the_reference_on_non_finite_input(rounding):
    from minite_core.kernels.quantize_cols import quantize_cols_triton

    x = _poisoned(m=64, k=64)  # x [T, C]: the operand is xᵀ [C, T], quantized along T
    t_sut, _ = quantize_cols_triton(x.to(DEV), rounding=rounding, seed=3, check=False)
    t_ref, _ = quantize_reference(x.t().contiguous(), rounding=rounding, seed=3, check=False)
    _same_where_finite(t_sut, t_ref, _bad_blocks(x.t()))
    assert torch.isnan(t_sut.global_scale.cpu())


def _step(model, profile, *, x_hook=None, grad_hook=None):
    """One learner forward + backward under a Watch; hooks poison one layer's input or output gradient."""
    from minite_core.engines import Learner

    handles = [h for h in (x_hook, grad_hook) if h is not None]
    try:
        with Watch(model) as watch:
            logp, _, mask = Learner(model, profile).logprobs([[1, 5, 6, 7]] * 2, [[8, 9, 10]] * 2, grad=True)
            (-(logp * mask).sum()).backward()
        watch.check("test step")
    finally:
        for h in handles:
            h.remove()


@pytest.mark.parametrize("profile", ["minite", "te-nvfp4"])
def test_a_learner_step_stops_naming_the_layer(profile):
    model = CausalLM(PRESETS["tiny-dense"]).init_weights(0).to(DEV)  # the auto backend follows the device
    _step(model, profile)  # finite: no error
    o_proj, down = model.model.layers[0].self_attn.o_proj, model.model.layers[1].mlp.down_proj
    with pytest.raises(NonFinite, match=r"test step: non-finite activation \(inf/NaN\) at "
                                        r"model\.layers\.0\.self_attn\.o_proj\.weight"):
        _step(model, profile, x_hook=o_proj.register_forward_pre_hook(_poison(float("inf"))))
    with pytest.raises(NonFinite, match=r"non-finite gradient \(dgrad operand\) \(inf/NaN\) at "
                                        r"model\.layers\.1\.mlp\.down_proj\.weight"):
        _step(model, profile, grad_hook=down.register_full_backward_pre_hook(_poison(float("nan"))))


def _poison(value: float):
    """A forward-pre / backward-pre hook: the module's input (or output gradient) with one element set to value."""
    def hook(module, args):
        t = args[0].clone()
        t[0, 0, 0] = value
        return (t,)
    return hook
