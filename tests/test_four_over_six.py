"""4over6 block-scale selection (formats/four_over_six.py): bit-exact (atol=0) against an independent numpy
float32 oracle written from TE 2.20.2's reference arithmetic, on Gaussian, heavy-tailed, tie and edge inputs; the
choice itself (hand-built blocks where map-to-4 must win, ties that must keep map-to-6); the Quant / profile
wiring and the reference quantizer. The comparison against TE's own reference module is tests/test_te_reference.py.
"""
from __future__ import annotations

import pytest
import torch

from minite_core.formats.e2m1 import e2m1_decode, unpack_fp4
from minite_core.formats.four_over_six import quantize_4over6
from minite_core.formats.nvfp4 import dequantize, quantize
from minite_core.kernels import dispatch
from minite_core.profiles import PROFILES, Profile, Quant
from tests.four_over_six_oracle import inputs, oracle_4over6

CASES = [((1, 16), "tensor"), ((1, 16), "row"), ((16, 16), "tensor")]


@pytest.mark.parametrize("kind", ["gauss", "student_t", "ties", "edge"])
@pytest.mark.parametrize("block, scale_mode", CASES)
@pytest.mark.parametrize("mode, e4m3_max", [("mae", 256.0), ("mse", 256.0), ("mae", 448.0)])
def test_bit_exact_vs_oracle(kind, block, scale_mode, mode, e4m3_max):
    x = inputs()[kind]
    t = quantize_4over6(x, block=block, scale_mode=scale_mode, err_mode=mode, e4m3_max=e4m3_max)
    codes_ref, scale_ref, s_dec_ref = oracle_4over6(x.numpy(), block, scale_mode, mode, e4m3_max)
    torch.testing.assert_close(unpack_fp4(t.data), torch.from_numpy(codes_ref), atol=0, rtol=0)
    torch.testing.assert_close(t.scale.double(), torch.from_numpy(scale_ref), atol=0, rtol=0)
    s_dec = t.global_scale.reshape(-1).expand(x.shape[0])
    torch.testing.assert_close(s_dec, torch.from_numpy(s_dec_ref), atol=0, rtol=0)


def test_bf16_input_same_as_fp32_of_same_values():
    x = torch.randn(32, 64).bfloat16()
    a, b = quantize_4over6(x, scale_mode="row"), quantize_4over6(x.float(), scale_mode="row")
    assert torch.equal(a.data, b.data) and torch.equal(a.scale.view(torch.uint8), b.scale.view(torch.uint8))


def _with_amax_block(block_vals, amax_elem=1536.0):
    """Row 0: a block holding `block_vals`, then a block whose amax fixes S_enc = 1 (amax 1536 = 6 * 256)."""
    x = torch.zeros(1, 32)
    x[0, :16] = torch.tensor(block_vals, dtype=torch.float32)
    x[0, 16] = amax_elem
    return x


def test_map_to_4_wins_where_the_top_of_the_grid_is_too_sparse():
    # S_enc = 1. Block amax 4 with values 3: map-to-6 scale sf6 = 4/6 -> e4m3 0.6875 (enc 1.4545): 4 -> 5.8 -> 6
    # (x̂ = 4.125), 3 -> 4.36 -> 4 (x̂ 2.75). Map-to-4: sf4 = e4m3(1.0) = 1, 4 -> 4, 3 -> 3: exact, error 0.
    vals = [4.0, 3.0, 3.0, 3.0] + [0.0] * 12
    t = quantize_4over6(_with_amax_block(vals))
    assert t.scale[0, 0].float().item() == 1.0  # the map-to-4 scale
    assert torch.equal(dequantize(t)[0, :16], torch.tensor(vals))
    plain = quantize(_with_amax_block(vals), math="exact")  # the 448 bound and map-to-6 lose
    assert not torch.equal(dequantize(plain)[0, :16], torch.tensor(vals))


def test_equal_errors_keep_map_to_6():
    # A block of zeros and one value that both candidates represent exactly: 6 (map-to-6, sf 1) and 6 (map-to-4
    # at sf 1.5 -> code 4 = 4 * 1.5 = 6). Both errors are 0: the tie keeps map-to-6 (sf = 1).
    vals = [6.0] + [0.0] * 15
    t = quantize_4over6(_with_amax_block(vals))
    assert t.scale[0, 0].float().item() == 1.0 and e2m1_decode(unpack_fp4(t.data))[0, 0].item() == 6.0


def test_all_zero_and_errors():
    t = quantize_4over6(torch.zeros(16, 32), block=(16, 16))
    assert (t.data == 0).all() and (t.scale.float() == 0).all() and t.global_scale.item() == 1.0
    with pytest.raises(ValueError, match="err_mode"):
        quantize_4over6(torch.zeros(4, 16), err_mode="mape")
    with pytest.raises(ValueError, match="1x16"):
        quantize_4over6(torch.zeros(16, 16), block=(16, 16), scale_mode="row")
    with pytest.raises(ValueError, match="256 or 448"):
        quantize_4over6(torch.zeros(4, 16), e4m3_max=300)
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize_4over6(torch.zeros(4, 24))


def test_better_sqnr_than_plain_nvfp4():
    # The point of 4over6 (paper, Table 1): lower error than always mapping to 6, on Gaussian data.
    x = torch.randn(256, 256, generator=torch.Generator().manual_seed(1))
    err = lambda t: (dequantize(t) - x).pow(2).sum().item()  # noqa: E731
    assert err(quantize_4over6(x)) < err(quantize(x))


# ---------------------------------------------------------------- Quant / profile / reference-quantizer wiring
def test_quant_knob_validation():
    assert Quant().four_over_six == "off"
    with pytest.raises(ValueError, match="four_over_six"):
        Quant(four_over_six="yes")
    with pytest.raises(ValueError, match="rounding='rne'"):
        Quant(rounding="sr", four_over_six="mae")
    with pytest.raises(ValueError, match="block=\\(1, 16\\)"):
        Quant(block=(16, 16), scale_mode="row", four_over_six="mae")
    with pytest.raises(ValueError, match="wgrad_rht"):
        Profile(name="x", weight=Quant(), activation=Quant(four_over_six="mae"), grad=Quant(rounding="sr"),
                wgrad_rht=True)


def test_profile_and_reference_quantizer_honour_it():
    p = PROFILES["minite-4over6"]
    assert p.weight.four_over_six == p.activation.four_over_six == "mae" and p.grad.four_over_six == "off"
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(2))
    t = dispatch.quantize(x, p.activation, backend="reference")
    ref = quantize_4over6(x, scale_mode="row")
    assert torch.equal(t.data, ref.data) and torch.equal(t.scale.view(torch.uint8), ref.scale.view(torch.uint8))
    assert not torch.equal(t.data, dispatch.quantize(x, PROFILES["minite"].activation, backend="reference").data)


def test_triton_quantizer_refuses_4over6_with_reason():
    from minite_core.kernels.quantize import quantize_triton

    with pytest.raises(NotImplementedError, match="MINITE_KERNELS=reference"):
        quantize_triton(torch.zeros(16, 32), four_over_six="mae")
