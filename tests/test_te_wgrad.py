"""Our te-nvfp4 / minite learners' GEMMs against TE's reference dataflow (peers.te_compare.te_reference_dataflow,
pure torch: no TE needed) on CPU: fprop, dgrad and wgrad bitwise, the wgrad through the two profile knobs the H200
comparison found (results/h200/te: wgrad 4e-2..9e-2 apart before them): `wgrad_rht_dtype="bfloat16"` (TE's
reference rotates the bf16 operands in bf16) and `wgrad_input_scale_mode="row"` (row_scaled_nvfp4's column-wise
xᵀ has one global scale per row of xᵀ). With the emulation's GEMM set to the dataflow's (w4a4_gemm="reference";
emulated_by itself runs TE's qgemm order, tests/test_te_gemm.py) both GEMMs are fp32 products of the same
dequantized operands, so equal here to the bit; TE's own GEMM rounding is tests/test_te_dataflow.py's and the H200's."""
from __future__ import annotations

import pytest
import torch

from minite_core.formats.rht import rht
from minite_core.peers.te_compare import agreement, te_reference_dataflow
from minite_core.peers.te_learner import MODES
from minite_core.profiles import PROFILES
from tests.te_reference import quantlinear_gemms


def _fp32_gemm(mode):
    """The mode's emulation with the dataflow's fp32 GEMM (emulated_by runs TE's qgemm order: test_te_gemm.py)."""
    return mode.emulated_by.replace(w4a4_gemm="reference")


def _operands(m=48, k=64, n=32, seed=0):  # m not a multiple of 32: the token padding is exercised
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g) * k ** -0.5
    dy = torch.randn(m, n, generator=g).bfloat16()
    return x, w, dy


@pytest.mark.parametrize("name", ["nvfp4", "nvfp4-rowscaled", "nvfp4-4over6"])
def test_emulated_by_equals_te_dataflow_bitwise(name):
    mode = MODES[name]
    x, w, dy = _operands()
    ours, flow = quantlinear_gemms(_fp32_gemm(mode), x, w, dy), te_reference_dataflow(x, w, dy, mode)
    for out in ("fprop", "dgrad", "wgrad"):  # in bf16, TE's output dtype (our wgrad is the fp32 master's dtype)
        assert torch.equal(ours[out].bfloat16(), flow[out].bfloat16()), (out, agreement(ours[out], flow[out]))
    rel = (ours["wgrad"] - flow["wgrad"]).norm() / flow["wgrad"].norm()
    assert rel < 1e-6, rel  # fp32: the same products, summed in another order


@pytest.mark.parametrize("name,knob", [("nvfp4", {"wgrad_rht_dtype": "float32"}),
                                       ("nvfp4-rowscaled", {"wgrad_input_scale_mode": "tensor"})])
def test_knob_at_default_is_a_knob_apart(name, knob):
    mode = MODES[name]
    x, w, dy = _operands()
    ours, flow = quantlinear_gemms(_fp32_gemm(mode).replace(**knob), x, w, dy), te_reference_dataflow(x, w, dy, mode)
    assert agreement(ours["wgrad"], flow["wgrad"].bfloat16())["rel"] > 1e-2


def test_te_nvfp4_profile_carries_te_rht_dtype():
    """The te-nvfp4 profile itself (SR grads) rotates in bf16; at RNE it is the `nvfp4` mode's emulation."""
    assert PROFILES["te-nvfp4"].wgrad_rht_dtype == "bfloat16"
    assert MODES["nvfp4"].emulated_by == PROFILES["te-nvfp4"].replace(name="te-nvfp4-rne-teref", w4a4_gemm="te-ref",
                                                                      **{"grad.rounding": "rne"})
    for name, p in PROFILES.items():  # every other profile keeps its numerics (the defaults)
        if name not in ("te-nvfp4", "te-nvfp4-r3"):
            assert p.wgrad_rht_dtype == "float32" and p.wgrad_input_scale_mode == "tensor", name


def test_rht_bf16_is_one_rounding_of_fp32():
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1)).bfloat16()
    assert torch.equal(rht(x, "bfloat16"), rht(x).bfloat16().float())
    with pytest.raises(ValueError, match="RHT dtype"):
        rht(x, "float16")


def test_knob_values_checked():
    with pytest.raises(ValueError, match="wgrad_rht_dtype"):
        PROFILES["te-nvfp4"].replace(wgrad_rht_dtype="fp16")
    with pytest.raises(ValueError, match="wgrad_input_scale_mode"):
        PROFILES["minite"].replace(wgrad_input_scale_mode="block")
