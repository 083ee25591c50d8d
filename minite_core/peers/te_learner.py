"""TELearner: a learner whose GEMMs run through NVIDIA Transformer Engine 2.20.2 itself (optional peer, CUDA).

What. Our `Learner(model, "te-nvfp4")` *emulates* TE's NVFP4 recipe with this project's bit-exact reference; this
adapter runs TE on the same weights, so the emulation can be checked against TE (peers/te_compare.py) and TE
can be the learner of a pair or a row of the throughput bench (bf16, FP8 current scaling, FP8 blockwise):
  build_te_model(model, mode)  a copy of our CausalLM (same weights: copied, or shared with share_weights=True)
                               whose decoder GEMMs are TE modules: every QuantLinear of role "linear" becomes a
                               `TELinear` (one `te.Linear`), every expert GroupedLinear a `TEExperts` (one
                               te.Linear per expert, or one `te.GroupedLinear` with experts="grouped", bf16/FP8
                               only). Module names are unchanged, so traces and hooks address both models alike.
                               Attention, norms, embeddings, router and LM head stay ours, under `mode.host`.
  TELearner(model, mode)       `engines.learner.Learner` on that copy: the same logprobs(...) API, grad=True for RL.
  te_train_step(...)           one complete learner update (forward, token-mean CE, backward, step, zero_grad).
Every TE GEMM runs under `torch.autocast("cuda", bf16)` (fp32 masters, bf16 activations: te.Linear's activation
dtype comes from torch's autocast, module/base.py `set_activation_dtype`) and, for quantized modes, TE's own
`te.autocast(recipe=...)` (pytorch/quantization.py `autocast`). Rows (tokens) are zero-padded to a multiple of 32:
the NVFP4 reference GEMM needs K % 32 == 0 and the wgrad GEMM's K is the token count (reference_nvfp4.py
`NVFP4QuantizerRef.qgemm`), FP8 needs rows % 8 (utils.py `assert_dim_for_fp8_exec`); zero rows change no amax
and add nothing to dW.

Modes (MODES). bf16: no TE recipe. fp8-current / fp8-block: `Float8CurrentScaling()` / `Float8BlockScaling()`
with TE's defaults (common/recipe/__init__.py). nvfp4*: `CustomRecipe(qfactory=...)` returning TE's pure-torch
`NVFP4QuantizerRef` (custom_recipes/reference_nvfp4.py) — the only way to run TE's NVFP4 arithmetic on Hopper,
where `NVFP4BlockScaling` refuses (sm_100+). `nvfp4` is configured as `NVFP4BlockScaling`'s defaults, read from
custom_recipes/quantizer_factories.py `nvfp4_factory`: weights 16×16 2D, no RHT; inputs 1×16 with RHT; grads 1×16
with RHT (TE applies RHT only to the column-wise copy, i.e. the wgrad operands); stochastic rounding on grads is
the one default the reference cannot follow — NVFP4QuantizerRef has no SR option — so its grads are RNE, and it is
compared with our te-nvfp4 profile at grad RNE (`emulated_by`; te-nvfp4 rotates the wgrad operands in bf16 as
TE does, `wgrad_rht_dtype`). `nvfp4-rowscaled` is TE's `row_scaled_nvfp4`
(= NVFP4BlockScaling(row_scaled_activation=True, disable_rht=True, disable_2d_quantization=True)), miniTE's
per-token activations; `nvfp4-4over6` adds TE's 4over6 (nvfp4_4over6="all": weights and activations, E4M3
bound 256, MAE; quantization.py `NVFP4BlockScalingRecipeState.make_quantizers`). row_scaled_nvfp4 also scales the
column-wise xᵀ of wgrad per row of xᵀ, so their `emulated_by` set `wgrad_input_scale_mode="row"` (minite's own
xᵀ is per tensor). Every NVFP4 `emulated_by` also computes its GEMMs in the order of TE's reference GEMM
(`w4a4_gemm="te-ref"`, kernels.reference.gemm_te_reference: exact per-16-block code dot products times both
block scales, fp32 sum in K order, times amax_a·amax_b / (36·448²); bitwise on CPU, tests/test_te_gemm.py): that
GEMM is what te.Linear runs on Hopper, so with it the comparison is ours vs TE to the bit, per GEMM and end to
end, wherever the inputs agree. This is a choice for the TE-reference comparison only: the te-nvfp4 profile
keeps the default GEMM ("reference": dequantize with S_dec, one fp32 matmul), the arithmetic of TE's *native*
recipe on an FP4 tensor core (global scales in the epilogue, hardware accumulation order), which is what it
emulates; `te_compare`'s `dataflow` rows keep that fp32 GEMM beside it.

Not here: TE's native NVFP4 kernels (sm_100+; this is the reference arithmetic run by TE's modules). The expert
loop (one te.Linear per expert) is a Python loop with one host sync per grouped GEMM (`counts.tolist()`), as our
reference GroupedLinear; te.GroupedLinear is the grouped alternative for bf16 / FP8. Missing TE, a CPU-only
machine, another TE version, or a TE whose import would break torch's cuDNN in this process (peers/te_cudnn.py)
make `available()` return (False, reason) and every constructor raise with it.
"""
from __future__ import annotations

import contextlib
import copy
import importlib.util
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from minite_core.engines.learner import Learner
from minite_core.model import CausalLM, set_profile
from minite_core.nn import GroupedLinear, QuantLinear, clear_weight_caches
from minite_core.nn.moe_layout import MoELayout
from minite_core.peers import te_cudnn
from minite_core.profiles import PROFILES, Profile

TE_VERSION = "2.20"  # major.minor this adapter was written against (TE 2.20.2's source; see module docstring)
ROW_MULTIPLE = 32  # token padding of every TE GEMM (module docstring)
EXPERT_PATHS = ("per-expert", "grouped")

_FP32_HEAD = PROFILES["bf16"].replace(name="bf16+fp32-router-head", router_dtype="float32", lm_head_dtype="float32")
# NVFP4QuantizerRef rounds gradients to nearest (no SR option); its qgemm's order of operations (w4a4_gemm)
_GRAD_RNE = {"grad.rounding": "rne", "w4a4_gemm": "te-ref"}
# row_scaled_nvfp4 scales TE's column-wise xᵀ per row of xᵀ (per input channel); minite's xᵀ is per tensor
_TE_ROW_SCALED = {**_GRAD_RNE, "fused_weight_scale": False, "wgrad_input_scale_mode": "row"}


@dataclass(frozen=True)
class TEMode:
    """One way of running the decoder GEMMs through TE. `host`: the profile of the ops that stay ours;
    `emulated_by`: our profile with the same numerics (for the comparisons), None when we have none (FP8)."""

    name: str
    recipe: str  # "none" | "fp8-current" | "fp8-block" | "nvfp4-ref"
    host: Profile = PROFILES["bf16"]
    emulated_by: Profile | None = None
    weight_tile: tuple[int, int] = (16, 16)  # NVFP4QuantizerRef quant_tile_shape of weights
    rht: bool = True  # with_rht of inputs and grads (TE: column-wise copy only)
    row_scaled: bool = False  # row_scaled_nvfp4 of inputs
    four_over_six: str = "off"  # "mae" | "mse": nvfp4_use_4over6 on weights and inputs (E4M3 bound 256)

    @property
    def quantized(self) -> bool:
        return self.recipe != "none"


MODES: dict[str, TEMode] = {m.name: m for m in (
    TEMode("bf16", "none", emulated_by=PROFILES["bf16"]),
    TEMode("fp8-current", "fp8-current"),
    TEMode("fp8-block", "fp8-block"),
    TEMode("nvfp4", "nvfp4-ref", emulated_by=PROFILES["te-nvfp4"].replace(name="te-nvfp4-rne-teref", **_GRAD_RNE)),
    # miniTE's per-token activations; TE scales each Linear's weight alone, so our side drops the fused scales
    TEMode("nvfp4-rowscaled", "nvfp4-ref", host=_FP32_HEAD, weight_tile=(1, 16), rht=False, row_scaled=True,
           emulated_by=PROFILES["minite"].replace(name="minite-unfused-rne-rowxt-teref", **_TE_ROW_SCALED)),
    TEMode("nvfp4-4over6", "nvfp4-ref", host=_FP32_HEAD, weight_tile=(1, 16), rht=False, row_scaled=True,
           four_over_six="mae", emulated_by=PROFILES["minite-4over6"].replace(
               name="minite-4over6-unfused-rne-rowxt-teref", **_TE_ROW_SCALED)),
)}

LEARNER_PREFIX = "te:"  # a real-TE learner is named `te:<mode>`: the learner bench's rows, diagnostics pairs


def learner_mode(name: str) -> str | None:
    """The mode of a real-TE learner name `te:<mode>`, None for any other name (one of our profiles)."""
    return name[len(LEARNER_PREFIX):] if name.startswith(LEARNER_PREFIX) else None


def get_mode(mode: str | TEMode) -> TEMode:
    if isinstance(mode, TEMode):
        return mode
    try:
        return MODES[mode]
    except KeyError:
        raise ValueError(f"unknown TE mode {mode!r}; one of {sorted(MODES)}") from None


def available() -> tuple[bool, str]:
    """(True, "transformer_engine <version>") when TE's PyTorch side imports on a CUDA GPU, else (False, reason).
    TE's own `import transformer_engine` swallows an ImportError of its torch extension (transformer_engine/
    __init__.py), so `transformer_engine.pytorch` is imported explicitly here to surface the real reason."""
    if importlib.util.find_spec("transformer_engine") is None:
        return False, ("transformer_engine is not installed: on the H200 run workflow/scripts/te_fetch.sh here and "
                       "workflow/scripts/te_install_h200.sh there (docs/offline-gpu.md)")
    if not torch.cuda.is_available():
        return False, "Transformer Engine needs a CUDA GPU (none visible)"
    why = te_cudnn.conflict()  # before this process imports TE: the import cannot be undone
    if why:
        return False, why
    try:
        import transformer_engine
        import transformer_engine.pytorch  # noqa: F401  (loads the torch extension)
    except (ImportError, OSError, RuntimeError, AssertionError) as e:  # TE raises all of these on a bad install
        return False, f"import transformer_engine.pytorch failed: {type(e).__name__}: {e}"
    version = transformer_engine.__version__
    if not version.startswith(TE_VERSION + "."):
        return False, f"this adapter is written against Transformer Engine {TE_VERSION}.x, found {version}"
    return True, f"transformer_engine {version}"


def require() -> None:
    ok, reason = available()
    if not ok:
        raise RuntimeError(f"TELearner unavailable: {reason}")


def mode_available(mode: str | TEMode) -> tuple[bool, str]:
    """Whether this GPU runs `mode` (FP8 recipes: pytorch/quantization.py is_fp8[_block_scaling]_available)."""
    ok, reason = available()
    if not ok:
        return ok, reason
    import transformer_engine.pytorch as te

    mode = get_mode(mode)
    check = {"fp8-current": te.is_fp8_available, "fp8-block": te.is_fp8_block_scaling_available}.get(mode.recipe)
    if check is None:
        return True, ""
    ok, why = check(return_reason=True)
    return ok, f"TE mode {mode.name!r} is not supported here: {why}" if not ok else ""


# ---- recipes ------------------------------------------------------------------------------------------------
def nvfp4_ref_factory(mode: TEMode, ref_module=None):
    """CustomRecipe qfactory: one NVFP4QuantizerRef per slot (custom_recipes/reference_nvfp4.py), configured per
    role as quantizer_factories.py `nvfp4_factory` configures NVFP4Quantizer (module docstring). Roles come from
    module/linear.py `get_quantizer_roles`: "input", "weight", "grad_output"; other slots get None and, as in
    nvfp4_factory, the input configuration. `ref_module`: the reference_nvfp4 module to take the class from
    (default: TE's; the CPU tests pass the same file loaded without TE's extension)."""
    if ref_module is None:
        from transformer_engine.pytorch.custom_recipes import reference_nvfp4 as ref_module
    NVFP4QuantizerRef, Fp4Formats = ref_module.NVFP4QuantizerRef, ref_module.reference_utils.Fp4Formats

    four = {}
    if mode.four_over_six != "off":  # as NVFP4BlockScalingRecipeState: 4over6 slots use the 256 E4M3 bound
        four = dict(nvfp4_use_4over6=True, nvfp4_e4m3_max=256, nvfp4_4over6_err_mode=mode.four_over_six.upper())

    def qfactory(role):
        linear = role is not None and role.module_type in ("linear", "grouped_linear")
        kind = role.tensor_type if linear else "input"
        if kind == "weight":
            return NVFP4QuantizerRef(dtype=Fp4Formats.E2M1, quant_tile_shape=mode.weight_tile, with_rht=False, **four)
        if kind == "grad_output":
            return NVFP4QuantizerRef(dtype=Fp4Formats.E2M1, quant_tile_shape=(1, 16), with_rht=mode.rht)
        return NVFP4QuantizerRef(dtype=Fp4Formats.E2M1, quant_tile_shape=(1, 16), with_rht=mode.rht,
                                 row_scaled_nvfp4=mode.row_scaled, **four)

    return qfactory


_RECIPES: dict[str, object] = {}  # one recipe object per mode: TE keys quantizer state on the recipe in use


def te_recipe(mode: str | TEMode):
    """The TE recipe of a quantized mode (common/recipe/__init__.py), None for bf16."""
    mode = get_mode(mode)
    if not mode.quantized:
        return None
    if mode.name not in _RECIPES:
        from transformer_engine.common import recipe as r

        make = {"fp8-current": r.Float8CurrentScaling, "fp8-block": r.Float8BlockScaling,
                "nvfp4-ref": lambda: r.CustomRecipe(qfactory=nvfp4_ref_factory(mode))}[mode.recipe]
        _RECIPES[mode.name] = make()
    return _RECIPES[mode.name]


@contextlib.contextmanager
def te_autocast(mode: str | TEMode):
    """torch.autocast(bf16) + te.autocast(recipe) for a quantized mode: the context every TE GEMM runs in."""
    mode = get_mode(mode)
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.autocast("cuda", dtype=torch.bfloat16))
        if mode.quantized:
            import transformer_engine.pytorch as te

            stack.enter_context(te.autocast(enabled=True, recipe=te_recipe(mode)))
        yield


def _pad_rows(x: torch.Tensor, multiple: int = ROW_MULTIPLE) -> torch.Tensor:
    pad = (-x.shape[0]) % multiple
    return F.pad(x, (0, 0, 0, pad)) if pad else x


# ---- modules --------------------------------------------------------------------------------------------------
class TELinear(nn.Module):
    """y = x Wᵀ through one te.Linear (bias-free, params in the weight's dtype). x (..., K) -> (..., N) bf16.
    `profile` is the host profile (Attention reads o_proj.profile for its attention dtype)."""

    def __init__(self, weight: torch.Tensor, mode: TEMode, *, share: bool = False, name: str = "",
                 profile: Profile | None = None):
        super().__init__()
        import transformer_engine.pytorch as te

        n, k = weight.shape
        self.mode, self.in_features, self.out_features, self.role = mode, k, n, "linear"
        self.profile = profile or mode.host
        self.linear = te.Linear(k, n, bias=False, params_dtype=weight.dtype, device=weight.device, name=name or None)
        if share:  # the same storage: an update by either model is seen by both
            param = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight)
            self.linear.register_parameter("weight", param)
        else:
            with torch.no_grad():
                self.linear.weight.copy_(weight)

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead, m = x.shape[:-1], x.numel() // self.in_features
        x2 = _pad_rows(x.reshape(m, self.in_features).to(torch.bfloat16))
        with te_autocast(self.mode):
            y = self.linear(x2)  # (M', N) bf16
        return y[:m].reshape(*lead, self.out_features)


class TEExperts(nn.Module):
    """A GroupedLinear's forward(x_pad, layout) through TE: one TELinear per expert segment (empty segments are
    skipped), or one te.GroupedLinear (experts="grouped"; every group padded to a multiple of 32 rows, and
    to at least 32 when the recipe quantizes: a zero-row split is the suspected cause of TE's
    `create_2D_tensor_map: invalid argument`, see peers/te_compare.py `grouped_probe`)."""

    def __init__(self, src: GroupedLinear, mode: TEMode, *, share: bool = False, experts: str = "per-expert",
                 name: str = "", profile: Profile | None = None):
        super().__init__()
        if experts not in EXPERT_PATHS:
            raise ValueError(f"experts must be one of {list(EXPERT_PATHS)}, got {experts!r}")
        if experts == "grouped" and mode.recipe == "nvfp4-ref":
            raise ValueError("experts='grouped' runs bf16 / FP8 only: TE's general_grouped_gemm (cpp_extensions/"
                             "gemm.py) has no dispatch for custom NVFP4QuantizerRef tensors, unlike general_gemm; "
                             "use experts='per-expert'")
        self.mode, self.path, self.profile = mode, experts, profile or mode.host
        self.num_experts, self.out_features, self.in_features = src.weight.shape
        w = src.weight  # (E, N, K)
        if experts == "per-expert":
            views = [nn.Parameter(w.data[e]) if share else w.detach()[e] for e in range(self.num_experts)]
            self.experts = nn.ModuleList(TELinear(v, mode, share=share, name=f"{name}.{e}", profile=self.profile)
                                         for e, v in enumerate(views))
        else:
            import transformer_engine.pytorch as te

            self.grouped = te.GroupedLinear(self.num_experts, self.in_features, self.out_features, bias=False,
                                            params_dtype=w.dtype, device=w.device, name=name or None,
                                            use_grouped_tensor=False)  # the split path: per-expert quantizers
            for e in range(self.num_experts):
                if share:
                    self.grouped.register_parameter(f"weight{e}", nn.Parameter(w.data[e]))
                else:
                    with torch.no_grad():
                        getattr(self.grouped, f"weight{e}").copy_(w[e])

    def forward(self, x: torch.Tensor, layout: MoELayout) -> torch.Tensor:
        # x: (Tp, K) in the padded sorted layout (nn.moe_layout: 16-aligned expert segments, zero pad rows, which
        # change no amax and no real row) -> (Tp, N) bf16
        bounds = layout.bounds()  # one host sync per grouped GEMM, as nn.GroupedLinear's reference path
        sizes = [t - s for s, t in zip(bounds[:-1], bounds[1:])]
        chunks = x.to(torch.bfloat16).split(sizes)
        if self.path == "per-expert":  # empty segments skipped (they own no row)
            return torch.cat([self.experts[e](c) for e, c in enumerate(chunks) if c.shape[0]])
        floor = ROW_MULTIPLE if self.mode.quantized else 0
        padded = [max(floor, s + (-s) % ROW_MULTIPLE) for s in sizes]
        xp = torch.cat([F.pad(c, (0, 0, 0, p - s)) for c, s, p in zip(chunks, sizes, padded)])
        with te_autocast(self.mode):
            yp = self.grouped(xp, torch.tensor(padded, dtype=torch.int64))  # m_splits on the host (legacy path)
        return torch.cat([y[:s] for y, s in zip(yp.split(padded), sizes)])


def _require_cuda_model(model: CausalLM) -> None:
    if not next(model.parameters()).is_cuda:
        raise ValueError("build_te_model needs the model on a CUDA device (TE modules are CUDA-only): model.cuda()")


def build_te_model(model: CausalLM, mode: str | TEMode, *, share_weights: bool = False,
                   experts: str = "per-expert") -> CausalLM:
    """A copy of `model` whose decoder GEMMs run through TE under `mode` (module docstring). share_weights=True:
    the copy's parameters are the model's own tensors (dense: the same Parameters; experts: per-expert views of
    the [E, N, K] storage), so no weight memory is duplicated and updates through either model are seen by both;
    default: independent copies of the same values."""
    require()
    mode = get_mode(mode)
    _require_cuda_model(model)
    memo = {id(p): p for p in model.parameters()} if share_weights else {}
    te_model = copy.deepcopy(model, memo)
    clear_weight_caches(te_model)
    set_profile(te_model, mode.host)  # the copy is built for this mode: its host profile is part of what it is
    for parent_name, parent in list(te_model.named_modules()):
        for child_name, child in list(parent.named_children()):
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            if isinstance(child, QuantLinear) and child.role == "linear":
                setattr(parent, child_name, TELinear(child.weight, mode, share=share_weights, name=name))
            elif isinstance(child, GroupedLinear):
                setattr(parent, child_name, TEExperts(child, mode, share=share_weights, experts=experts, name=name))
    return te_model


class TELearner(Learner):
    """`Learner` API (logprobs, response_logits, set_step) on `build_te_model(model, mode)`; `self.model` is the
    TE copy (build an optimizer over its parameters to train it). Raises with the reason when TE is unavailable."""

    def __init__(self, model, mode: str | TEMode = "nvfp4", *, seed: int = 0, batch_size: int | None = None,
                 share_weights: bool = False, experts: str = "per-expert"):
        require()
        self.mode = get_mode(mode)
        te_model = build_te_model(model, self.mode, share_weights=share_weights, experts=experts)
        super().__init__(te_model, self.mode.host, seed=seed, batch_size=batch_size)


def te_train_step(model, optimizer: torch.optim.Optimizer, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """One complete learner update of a TE model (as bench.learner's `learner_step`): logits (B, T, V), token-mean
    next-token cross-entropy, backward, optimizer step, zero_grad. Returns the loss (detached, no host sync)."""
    logits = model(input_ids)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()
