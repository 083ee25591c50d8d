"""TE's NVFP4 GEMMs as TE's reference code computes them, on CPU, against our emulation.

With TE's `NVFP4QuantizerRef` loaded from the wheel (tests/te_reference.py; skipped with the reason without .te/),
the quantizers our `nvfp4_ref_factory` configures for a `te.Linear` produce the three GEMMs the way
custom_recipes/gemm.py `custom_gemm` feeds them to `NVFP4QuantizerRef.qgemm`: fprop (x rowwise, W rowwise), dgrad
(dy rowwise, W columnwise), wgrad (dy columnwise, x columnwise). Against them:
- `te_compare.te_reference_dataflow` (TE's dataflow written with our formats) agrees to fp32 rounding: the
  remaining difference is qgemm's global scale amax_x·amax_w / (36·448²) vs our S_dec_x·S_dec_w and its per-block
  accumulation order;
- our QuantLinear under the mode's `emulated_by` profile agrees as closely on all three (bitwise, in fact: it runs
  TE's qgemm order, w4a4_gemm="te-ref", tests/test_te_gemm.py), wgrad included, since
  the profile models the two wgrad choices TE's reference makes (found from te_compare's H200 GEMM table, where
  wgrad was 4e-2..9e-2 apart): the RHT'd wgrad operands rounded to bf16 (`wgrad_rht_dtype`, `nvfp4`), and the
  column-wise x^T scaled per row of x^T (`wgrad_input_scale_mode="row"`, `nvfp4-rowscaled`, `nvfp4-4over6`).
  Without them (the profiles' defaults) wgrad is a knob apart again: the last test pins that each one matters.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from minite_core.peers.te_compare import agreement, te_reference_dataflow
from minite_core.peers.te_learner import MODES
from minite_core.nn import QuantLinear
from tests import te_reference
from tests.te_reference import te_reference_gemms

OK, REASON = te_reference.available()
pytestmark = pytest.mark.skipif(not OK, reason=REASON)


@pytest.fixture(scope="module")
def ref():
    return te_reference.load()


def _operands(m=64, k=128, n=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g) * k ** -0.5
    dy = torch.randn(m, n, generator=g).bfloat16()
    return x, w, dy


def _ours(mode, x, w, dy) -> dict:
    lin = QuantLinear(w.shape[1], w.shape[0])
    with torch.no_grad():
        lin.weight.copy_(w)
    lin.profile = mode.emulated_by
    x_in = x.clone().requires_grad_(True)
    y = lin(x_in)
    y.backward(dy)
    return {"fprop": y.detach().float(), "dgrad": x_in.grad.float(), "wgrad": lin.weight.grad.float()}


@pytest.mark.parametrize("name", ["nvfp4", "nvfp4-rowscaled", "nvfp4-4over6"])
def test_dataflow_matches_te_reference_gemms(ref, name):
    mode = MODES[name]
    x, w, dy = _operands()
    te = te_reference_gemms(ref, mode, x, w, dy)
    flow = te_reference_dataflow(x, w, dy, mode)
    for out in ("fprop", "dgrad", "wgrad"):
        a = agreement(flow[out], te[out])
        assert a["rel"] < 1e-3 and a["eq_bf16"] > 0.99, (out, a)


@pytest.mark.parametrize("name", ["nvfp4", "nvfp4-rowscaled", "nvfp4-4over6"])
def test_quantlinear_vs_te_reference(ref, name):
    mode = MODES[name]
    x, w, dy = _operands(seed=1)
    te, ours = te_reference_gemms(ref, mode, x, w, dy), _ours(mode, x, w, dy)
    for out in ("fprop", "dgrad", "wgrad"):  # identical quantizers: GEMM rounding only
        a = agreement(ours[out], te[out])
        assert a["rel"] < 1e-3 and a["eq_bf16"] > 0.99, (out, a)


@pytest.mark.parametrize("name,knob", [("nvfp4", {"wgrad_rht_dtype": "float32"}),
                                       ("nvfp4-rowscaled", {"wgrad_input_scale_mode": "tensor"}),
                                       ("nvfp4-4over6", {"wgrad_input_scale_mode": "tensor"})])
def test_wgrad_knob_off_is_a_knob_apart(ref, name, knob):
    """Each wgrad knob is needed: back at the default, wgrad is 10x above GEMM rounding, below the NVFP4 error."""
    mode = MODES[name]
    mode = dataclasses.replace(mode, emulated_by=mode.emulated_by.replace(**knob))
    x, w, dy = _operands(seed=1)
    te, ours = te_reference_gemms(ref, mode, x, w, dy), _ours(mode, x, w, dy)
    a = agreement(ours["wgrad"], te["wgrad"])
    exact = dy.float().t() @ x.float()
    assert 1e-2 < a["rel"] < agreement(te["wgrad"], exact)["rel"], a
