"""A stand-in for `transformer_engine.pytorch` with the API shape peers/te_learner.py uses (te.Linear,
te.GroupedLinear, te.autocast), in plain torch on CPU: bf16 GEMMs exactly as our bf16 QuantLinear computes them;
under a CustomRecipe (the NVFP4 modes) and without autograd (the learner's log-probs), te.Linear runs TE's own
reference quantizers and qgemm (loaded from .te/src, tests/te_reference.py). It checks the adapter's side of
the contract (bf16 inputs, rows padded to a multiple of 32, m_splits on the host) so tests/test_te_peer.py can run
build_te_model / TELearner / te_train_step without TE or a GPU. Beyond that reference forward it says nothing about TE's numerics: the `gpu` tests in the same file run the real TE."""
from __future__ import annotations

import contextlib
import types

import torch
import torch.nn.functional as F
from torch import nn

ACTIVE_RECIPES: list = []  # recipes of the te.autocast contexts entered, in order
_CURRENT: list = []  # the te.autocast contexts open now (innermost last)


class Linear(nn.Module):
    def __init__(self, in_features, out_features, bias=True, params_dtype=None, device="cuda", name=None):
        super().__init__()
        assert not bias, "the adapter builds bias-free te.Linear"
        self.name = name
        self.weight = nn.Parameter(torch.randn(out_features, in_features, dtype=params_dtype, device=device))

    def forward(self, x):
        assert x.dtype == torch.bfloat16 and x.shape[0] % 32 == 0, (x.dtype, x.shape)
        recipe = _CURRENT[-1] if _CURRENT else None
        if recipe is not None and "qfactory" in recipe.kwargs and not torch.is_grad_enabled():
            return _custom_fprop(recipe.kwargs["qfactory"], x, self.weight)  # TE's reference quantizers + qgemm
        return F.linear(x, self.weight.to(torch.bfloat16))


def _custom_fprop(qfactory, x, weight):
    """The forward GEMM as TE's Linear runs it under a CustomRecipe (module/linear.py -> general_gemm ->
    custom_recipes/gemm.py custom_gemm -> the input quantizer's qgemm), with TE's reference module registered in
    sys.modules (tests/test_te_peer.py's fixture): x, the fp32 weight quantized by the recipe's quantizers,
    bf16 out. Forward only: with autograd on, the stand-in keeps its bf16 GEMM (the plumbing tests)."""
    import sys

    ref = sys.modules["transformer_engine.pytorch.custom_recipes.reference_nvfp4"]
    roles = (types.SimpleNamespace(module_type="linear", tensor_type=t, name="") for t in ("input", "weight"))
    qi, qw = (qfactory(role) for role in roles)
    X, W = qi.quantize(x), qw.quantize(weight.detach())
    return qi.qgemm(X.data, W.data, None, torch.bfloat16, X.scale, W.scale, gemm_type=ref.gemm.GEMMType.FPROP,
                    qresult_x=X, qresult_w=W)


class GroupedLinear(nn.Module):
    def __init__(self, num_gemms, in_features, out_features, bias=True, params_dtype=None, device="cuda", name=None,
                 use_grouped_tensor=None):
        super().__init__()
        assert not bias and use_grouped_tensor is False
        self.num_gemms = num_gemms
        for i in range(num_gemms):
            self.register_parameter(f"weight{i}", nn.Parameter(torch.randn(out_features, in_features,
                                                                           dtype=params_dtype, device=device)))

    def forward(self, x, m_splits):
        assert isinstance(m_splits, torch.Tensor) and m_splits.device.type == "cpu" and len(m_splits) == self.num_gemms
        sizes = m_splits.tolist()
        assert all(s % 32 == 0 for s in sizes) and x.dtype == torch.bfloat16
        return torch.cat([F.linear(c, getattr(self, f"weight{i}").to(torch.bfloat16))
                          for i, c in enumerate(x.split(sizes))])


@contextlib.contextmanager
def autocast(enabled=True, recipe=None):
    ACTIVE_RECIPES.append(recipe)
    _CURRENT.append(recipe)
    try:
        yield
    finally:
        _CURRENT.pop()


class _Recipe:  # common/recipe/__init__.py: Float8CurrentScaling(), Float8BlockScaling(), CustomRecipe(qfactory=)
    def __init__(self, **kwargs):
        self.kwargs = kwargs


def modules() -> dict[str, types.ModuleType]:
    """sys.modules entries: transformer_engine (version 2.20.2), .pytorch, .common, .common.recipe."""
    names = ("transformer_engine", "transformer_engine.pytorch", "transformer_engine.common",
             "transformer_engine.common.recipe")
    pkg, pt, common, recipe = (types.ModuleType(n) for n in names)
    pkg.__version__, pkg.pytorch, pkg.common, common.recipe = "2.20.2", pt, common, recipe
    pt.Linear, pt.GroupedLinear, pt.autocast = Linear, GroupedLinear, autocast
    pt.is_fp8_available = pt.is_fp8_block_scaling_available = lambda return_reason=False: (False, "stand-in: no FP8")
    for name in ("Float8CurrentScaling", "Float8BlockScaling", "CustomRecipe"):
        setattr(recipe, name, type(name, (_Recipe,), {}))
    return dict(zip(names, (pkg, pt, common, recipe)))
