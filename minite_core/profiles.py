"""Execution profiles: every numeric choice one engine makes, as data.

The paper's thesis is that "same weights, same format" is not "same policy": the learner and the sampler
execute NVFP4 differently. A `Profile` names each of those choices (block shape, scale granularity, quantizer
arithmetic, static vs dynamic scales, stochastic rounding, RHT, router / LM-head precision, BF16 boundary
layers), so that an engine pair is just two profiles and an ablation is `profile.replace(knob=value)`.

The five registered profiles follow DESIGN.md's table; each default says where it comes from. Attention,
norms and embeddings stay in `dtype` (bf16) under every profile.
"""
from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from dataclasses import dataclass

BLOCKS = ((1, 16), (16, 16))
SCALE_MODES = ("tensor", "row")
MATHS = ("exact", "fast")
ROUNDINGS = ("rne", "sr")
FOUR_OVER_SIX = ("off", "mae", "mse")
DTYPES = ("float32", "bfloat16")
W4A4_GEMMS = ("reference", "vllm-cpu", "te-ref")
KERNEL_ROUNDINGS = ("rne", "rtz")
DECODE_GEMMS = ("cached-bf16", "packed")
# the batch-invariant attention kernels (kernels/attention.py): per query | tiled, fp32 FMA p·v | tiled, three bf16
# tensor-core p·v. Each is invariant on its own; they differ from each other in their sums' order.
ATTENTION_KERNELS = ("row", "tile", "tile-bf16x3")
# Profile fields that change no number (what is kept for backward, not how it is computed): the attribution's
# knobs and the diagnostics' "same numerics" keys leave them out.
NON_NUMERIC = ("recompute_elementwise",)


@dataclass(frozen=True)
class Quant:
    """How one GEMM operand is quantized to NVFP4 (arguments of `formats.nvfp4.quantize`)."""

    block: tuple[int, int] = (1, 16)  # (1, 16) along K; (16, 16) = TE's 2D weight tiles
    scale_mode: str = "tensor"  # global scale per tensor, or per row ("per-token" for activations)
    math: str = "exact"  # "exact" = TE / FlashInfer without fast-math; "fast" = vLLM's order of operations
    rounding: str = "rne"  # "sr" = stochastic rounding (gradients in TE's recipe)
    static: bool = False  # global scale from a calibrated amax (vLLM's input_global_scale), not this tensor's
    # TE 2.20's "4over6" block-scale choice (formats/four_over_six.py) with its error measure, "mae" (TE's
    # default) or "mse". Off by default: every block maps its amax to 6, as NVFP4 and every other engine do.
    four_over_six: str = "off"

    def __post_init__(self):
        object.__setattr__(self, "block", tuple(self.block))  # from JSON a list: a tuple keeps profiles hashable
        _check("block", self.block, BLOCKS)
        _check("scale_mode", self.scale_mode, SCALE_MODES)
        _check("math", self.math, MATHS)
        _check("rounding", self.rounding, ROUNDINGS)
        _check("four_over_six", self.four_over_six, FOUR_OVER_SIX)
        if self.static and self.scale_mode != "tensor":
            raise ValueError("Quant.static=True needs scale_mode='tensor' (a calibrated scale is per tensor)")
        if self.four_over_six != "off":
            if self.rounding != "rne" or self.math != "exact":
                raise ValueError(f"Quant.four_over_six={self.four_over_six!r} needs rounding='rne' and math='exact' "
                                 "(4over6 has its own arithmetic; TE refuses it with stochastic rounding)")
            if self.scale_mode == "row" and tuple(self.block) != (1, 16):
                raise ValueError("Quant.four_over_six with scale_mode='row' needs block=(1, 16) (as TE's row_scaled_nvfp4)")


@dataclass(frozen=True)
class Profile:
    """One engine's execution numerics. `None` for an operand = it stays in high precision (`dtype`)."""

    name: str
    weight: Quant | None = None
    activation: Quant | None = None
    grad: Quant | None = None  # dgrad/wgrad operands in backward; None = high-precision backward
    wgrad_rht: bool = False  # random Hadamard transform on both wgrad operands (along tokens)
    # the RHT'd wgrad operands' precision before amax and quantization: "float32" (the butterfly's fp32 result) or
    # "bfloat16" (rounded once, RNE: TE's reference rotates in the input dtype, reference_nvfp4.py `_apply_rht`;
    # found by peers.te_compare, results/h200/te). Read only when wgrad_rht.
    wgrad_rht_dtype: str = "float32"
    # global scale of the saved column-wise xᵀ (the wgrad's input operand): "tensor" (one amax) or "row" (one
    # amax per row of xᵀ = per input channel, over all tokens: TE's `row_scaled_nvfp4` quantizes its column-wise
    # copy so, reference_nvfp4.py; found by peers.te_compare). "row" runs the plain reference quantizer (no
    # Triton kernel for per-channel global scales yet) on one process (a shard's channel amax would need an
    # all-reduce per channel).
    wgrad_input_scale_mode: str = "tensor"
    router_dtype: str = "bfloat16"  # MoE router logits/softmax precision
    lm_head_dtype: str = "bfloat16"  # LM-head GEMM + log-softmax precision
    boundary_layers: tuple[int, int] = (0, 0)  # first / last N decoder layers kept in `dtype`
    # q/k/v and gate/up quantized as one fused weight (one global scale), as vLLM's fused layers load them
    fused_weight_scale: bool = False
    dtype: str = "bfloat16"  # non-GEMM ops and the high-precision GEMMs
    # softmax(QKᵀ)V precision. bf16 attention rounds differently in cached decode than in the learner's
    # full-sequence prefill, and the next GEMM's NVFP4 re-quantization amplifies that (diagnostics trace).
    attention_dtype: str | None = None  # None = `dtype`
    # W4A4 GEMM arithmetic after the codes. "reference": fp32 operands and accumulation, global scales in the
    # epilogue (an NVFP4 tensor core; vLLM's CUTLASS/FlashInfer path on sm_100). "vllm-cpu": vLLM's CPU
    # emulation kernel (kernels.vllm_cpu): global scale folded into the block scale, both operands rounded to
    # `dtype`, matmul in `dtype`; found by the trace against real vLLM (results/vllm-cpu). Needs static inputs.
    # "te-ref": Transformer Engine 2.20's reference GEMM (NVFP4QuantizerRef.qgemm, what te.Linear runs on Hopper)
    # in fprop, dgrad and wgrad (kernels.reference.gemm_te_reference): exact 16-element block dots of the codes
    # times both block scales, summed in fp32 in K order, times amax_a·amax_b / (36·448²) — bitwise TE's
    # (tests/test_te_gemm.py). Dynamic activation scales, per-matrix weight scales; for the TE comparisons only.
    w4a4_gemm: str = "reference"
    # RoPE rotation precision. None = `dtype`: x·cos, y·sin and their sum each rounded (transformers; vLLM's
    # CUDA kernel computes in scalar_t). "float32": products and sum in fp32 from the bf16 q/k and bf16 cos/sin
    # cache, one rounding (vLLM's CPU kernel, csrc/cpu/pos_encoding.cpp; bitwise, tests/test_vllm_peer.py).
    rope_dtype: str | None = None
    # fp32 -> `dtype` rounding where a kernel computes in fp32 and writes `dtype` (RoPE / attention with
    # rope_dtype / attention_dtype "float32"). "rne": round to nearest even (torch's cast). "rtz": truncation,
    # as vLLM's x86 CPU kernels convert on AVX2 / AVX-512F without AVX512-BF16 (FP32Vec8_to_BF16Vec8_avx2 shifts
    # the low 16 bits out, csrc/cpu/cpu_types_x86.hpp); ISA-dependent (AVX512-BF16, ARM: RNE).
    kernel_rounding: str = "rne"
    # RMSNorm after a residual add normalises the fp32 sum before it is rounded (the stream keeps the rounded
    # sum): vLLM's native `fused_add_rms_norm` (vllm/ir/ops/layernorm.py), the op its CPU build runs. False = the
    # rounded sum, as transformers and vLLM's CUDA kernel (the sum is taken in scalar_t).
    fused_add_norm: bool = False
    # Rollout routing replay (R3, arXiv 2510.11370), learner side only (a sampler ignores it): each token's MoE
    # layers execute the top-k expert SET the sampler recorded for it instead of this router's own top-k; the
    # gate weights still come from this router's softmax over those experts, so the router keeps its gradient.
    # Off by default: engines route independently, and the routing diagnostics measure how often they disagree.
    routing_replay: bool = False
    # Forward NVFP4 GEMMs on the fast (Triton) path — a sampler's prefill and decode steps. "cached-bf16": the
    # weight's exact bf16 copy e2m1(q)·sf is cached once per optimizer step and read by the bf16 tensor-core GEMM
    # (cuBLAS dense, kernels.grouped for experts): the learner's GEMMs. "packed": the GEMM reads the packed codes +
    # E4M3 scales and dequantizes in its main loop (0.5625 B per weight instead of 2; W4A4 with the activation
    # quantizer fused; experts in one grouped launch; q|k|v in one launch, nn.linear.group_decode): up to 16 rows
    # the tensor-core kernel on weights stored in the MMA's fragment order (kernels/decode_mma.py, sm_80+), above
    # that kernels/decode.py. Same values, another fp32 accumulation order (K chunks and slices fixed by the
    # shape; not cuBLAS's), so it is a knob of its own whose effect on k3 the diagnostics measure (pair a profile
    # with its "-packed" variant). On the CPU reference path both read the packed weight and are one computation;
    # without NVFP4 weights (bf16, boundary layers) the knob has no effect.
    # Default "cached-bf16": every registered profile keeps its numerics.
    decode_gemm: str = "cached-bf16"
    # Batch-invariant forward kernels (minite-onpolicy): a row's bits do not depend on the other rows of the call
    # nor on the cache length, so the learner's full-sequence forward, the sampler's prefill and its cached decode
    # agree bitwise. On the fast path (Triton): every W4A4 GEMM and the fp32-split router / LM-head GEMMs through
    # one fixed-tile Triton GEMM (kernels.gemm.INVARIANT_CONFIG, no cuBLAS), attention through
    # kernels/attention.py (fixed key blocks aligned to each query's first key, fp32 online softmax). Needs W4A4
    # with per-token activation scales (a per-tensor amax would couple a row to its batch-mates), fp32 attention
    # and router / LM head, no bf16 boundary layers (their bf16 F.linear is cuBLAS). On the reference backend
    # (plain torch, CPU) those GEMMs and attention sum in fp64 and round once (CPU BLAS / SDPA block by shape; in
    # fp64 the order could only show at a rounding tie). The backward is not batch-invariant (not needed).
    batch_invariant: bool = False
    # The batch-invariant attention kernel (read only under batch_invariant, on the fast path; the reference backend
    # runs fp64 attention): learner and sampler must run the same one, which a profile field guarantees. Default
    # "tile-bf16x3", the fastest (47x "row" on the H200, results/notes/h200-tiled-attention-1f4f47b.log); "row" is
    # the plain per-query kernel. Environment override: MINITE_ATTENTION (runs.execution, recorded in env).
    attention_kernel: str = "tile-bf16x3"
    # Not a numeric knob: in a learner's forward, RMSNorm and SwiGLU save only their inputs and run their
    # elementwise ops again in backward (nn.recompute; outputs and gradients bitwise the plain graph's). On for the
    # NVFP4 learners, whose recipe keeps packed GEMM inputs and recomputes the cheap ops; off for bf16, as BF16
    # users run it (H200, 6 layers: bf16's step 247.4 ms without it, 259.8 ms with it, ~5% — two runs on two
    # machines, results/h200/bench/NOTES.md, row 15).
    recompute_elementwise: bool = False

    def __post_init__(self):
        object.__setattr__(self, "boundary_layers", tuple(self.boundary_layers))  # hashable, as Quant.block
        _check("router_dtype", self.router_dtype, DTYPES)
        _check("lm_head_dtype", self.lm_head_dtype, DTYPES)
        _check("dtype", self.dtype, DTYPES)
        for key in ("attention_dtype", "rope_dtype"):
            if getattr(self, key) is not None:
                _check(key, getattr(self, key), DTYPES)
        _check("w4a4_gemm", self.w4a4_gemm, W4A4_GEMMS)
        _check("wgrad_rht_dtype", self.wgrad_rht_dtype, DTYPES)
        _check("wgrad_input_scale_mode", self.wgrad_input_scale_mode, SCALE_MODES)
        _check("kernel_rounding", self.kernel_rounding, KERNEL_ROUNDINGS)
        _check("attention_kernel", self.attention_kernel, ATTENTION_KERNELS)
        if self.w4a4_gemm == "vllm-cpu" and self.weight is not None and not (
                self.activation is not None and self.activation.static and self.weight.scale_mode == "tensor"):
            raise ValueError(f"profile {self.name!r}: w4a4_gemm='vllm-cpu' needs static per-tensor activation "
                             "scales and per-tensor weight scales (vLLM's W4A4 checkpoint layout)")
        if self.w4a4_gemm == "te-ref" and self.weight is not None and (
                self.activation is None or self.activation.static or self.fused_weight_scale
                or self.decode_gemm != "cached-bf16" or self.batch_invariant):
            raise ValueError(f"profile {self.name!r}: w4a4_gemm='te-ref' needs W4A4 with dynamic activation scales, "
                             "per-matrix weight scales (fused_weight_scale=False), decode_gemm='cached-bf16' and "
                             "batch_invariant=False (TE's te.Linear under a CustomRecipe)")
        _check("decode_gemm", self.decode_gemm, DECODE_GEMMS)
        if self.decode_gemm == "packed":
            act = self.activation
            if self.weight is not None and self.w4a4_gemm != "reference":
                raise ValueError(f"profile {self.name!r}: decode_gemm='packed' needs w4a4_gemm='reference' (the "
                                 "packed kernel computes the reference arithmetic)")
            if act is not None and (act.rounding != "rne" or act.four_over_six != "off" or tuple(act.block) != (1, 16)):
                raise ValueError(f"profile {self.name!r}: decode_gemm='packed' fuses a 1x16 RNE activation "
                                 f"quantizer without 4over6, got activation={act}")
        if self.batch_invariant:
            self._check_batch_invariant()
        first, last = self.boundary_layers
        if first < 0 or last < 0:
            raise ValueError(f"Profile.boundary_layers must be >= 0, got {self.boundary_layers}")
        if self.grad is not None and self.weight is None:
            raise ValueError(f"profile {self.name!r}: a quantized backward needs quantized weights")
        if self.wgrad_rht and any(q is not None and q.four_over_six != "off" for q in (self.activation, self.grad)):
            raise ValueError(f"profile {self.name!r}: 4over6 with wgrad_rht=True is not supported (TE 2.20 refuses "
                             "4over6 with RHT: no fused RHT + 4over6 quantizer)")

    def _check_batch_invariant(self) -> None:
        a = self.activation
        problems = [why for bad, why in (
            (self.weight is None or a is None, "W4A4 (weight and activation quantized)"),
            (a is not None and (a.scale_mode != "row" or a.static), "per-token dynamic activation scales "
                                                                    "(activation.scale_mode='row', static=False)"),
            (self.w4a4_gemm != "reference", "w4a4_gemm='reference'"),
            (self.attention_dtype != "float32", "attention_dtype='float32'"),
            ((self.router_dtype, self.lm_head_dtype) != ("float32", "float32"), "fp32 router and LM head"),
            (tuple(self.boundary_layers) != (0, 0), "boundary_layers=(0, 0)"),
            (self.decode_gemm != "cached-bf16", "decode_gemm='cached-bf16' (the packed decode kernel has its own "
                                                "K order, not the invariant GEMM's)"),
        ) if bad]
        if problems:
            raise ValueError(f"profile {self.name!r}: batch_invariant=True needs {'; '.join(problems)}")

    @property
    def quantized(self) -> bool:
        return self.weight is not None

    @property
    def can_learn(self) -> bool:
        """Whether a learner can run it: a backward for every GEMM (high precision, or NVFP4 with a grad spec)."""
        return self.weight is None or self.grad is not None

    @property
    def needs_calibration(self) -> bool:
        return self.activation is not None and self.activation.static

    def replace(self, **knobs) -> "Profile":
        """Knob-by-knob variant; dotted knobs reach into operands: `replace(**{"activation.scale_mode": "row"})`."""
        top, nested = {}, {}
        for key, value in knobs.items():
            if "." in key:
                operand, field = key.split(".", 1)
                nested.setdefault(operand, {})[field] = value
            else:
                top[key] = value
        for operand, fields in nested.items():
            base = top.get(operand, getattr(self, operand))
            if base is None:
                raise ValueError(f"profile {self.name!r}: operand {operand!r} is not quantized, cannot set {fields}")
            top[operand] = dataclasses.replace(base, **fields)
        return dataclasses.replace(self, **top)

    def for_layer(self, layer_idx: int, num_layers: int) -> "Profile":
        """The profile a decoder layer runs: boundary layers drop to high precision, keeping router precision."""
        first, last = self.boundary_layers
        if layer_idx < first or layer_idx >= num_layers - last:
            return dataclasses.replace(self, weight=None, activation=None, grad=None, wgrad_rht=False)
        return self


def _check(key, value, allowed):
    if value not in allowed:
        raise ValueError(f"{key}={value!r} is not one of {list(allowed)}")


# TE NVFP4BlockScaling defaults (TE docs): weights 2D 16x16, inputs/grads 1x16, per-tensor amax, exact
# quantizer, stochastic rounding on gradients, RHT on wgrad operands. Router/LM head left to the model (bf16).
_TE_GRAD = Quant(block=(1, 16), scale_mode="tensor", math="exact", rounding="sr")
# vLLM compressed-tensors / ModelOpt W4A4: weights 1x16 per-tensor, activation global scale static from the
# checkpoint's calibrated input_global_scale, FlashInfer fast-math quantizer order of operations.
_VLLM_WEIGHT = Quant(block=(1, 16), scale_mode="tensor", math="fast")

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(name="bf16"),
        # TE as a plain per-Linear drop-in (te.Linear for q, k, v, gate, up separately): one amax per matrix.
        Profile(
            name="te-nvfp4",
            weight=Quant(block=(16, 16)),
            activation=Quant(),
            grad=_TE_GRAD,
            wgrad_rht=True,
            wgrad_rht_dtype="bfloat16",  # TE rotates bf16 activations / gradients in bf16
            recompute_elementwise=True,  # as minite: the recipe comparison keeps every non-recipe choice equal
        ),
        Profile(
            name="vllm-nvfp4",
            weight=_VLLM_WEIGHT,
            activation=Quant(math="fast", static=True),
            fused_weight_scale=True,  # QKVParallelLinear / MergedColumnParallelLinear: one weight_global_scale
        ),
        # Hopper has no FP4 tensor cores: vLLM falls back to Marlin W4A16 (weights dequantized in the kernel,
        # activations stay bf16). Same checkpoint codes as vllm-nvfp4.
        Profile(name="vllm-marlin-w4a16", weight=_VLLM_WEIGHT, fused_weight_scale=True),
        # miniTE / public NVFP4 RL recipes (NeMo-RL, verl, miles): 1x16 weights, per-token dynamic activation
        # scales, exact quantizer on both sides, SR gradients without RHT, fp32 router and LM head.
        Profile(
            name="minite",
            weight=Quant(),
            activation=Quant(scale_mode="row"),
            grad=_TE_GRAD,
            router_dtype="float32",
            lm_head_dtype="float32",
            fused_weight_scale=True,  # same weight codes as the sampler's fused q/k/v and gate/up
            recompute_elementwise=True,  # packed GEMM inputs + recomputed norms / SwiGLU (saved activations)
        ),
    )
}


# A baseline beyond DESIGN.md's five: miniTE plus fp32 attention on both sides, which closes the remaining
# decode-vs-prefill gap that the first-divergence trace finds in minite<->minite (bf16 SDPA in decode).
PROFILES["minite-fp32attn"] = PROFILES["minite"].replace(name="minite-fp32attn", attention_dtype="float32")
# minite with bitwise learner/sampler log-probs on the GPU too: minite-fp32attn plus batch-invariant
# forward kernels (Profile.batch_invariant). minite's activation scales are already per token (a row's global
# scale is its own amax / (6 * 448), DESIGN.md), so no batch-mate enters a row's codes; the GEMM's global scales
# are applied per row in the epilogue. Same weights, codes and arithmetic as minite up to fp32 summation order.
PROFILES["minite-onpolicy"] = PROFILES["minite"].replace(name="minite-onpolicy", attention_dtype="float32",
                                                         batch_invariant=True)
# The naive Blackwell learner with rollout routing replay (R3): how much of the naive pair's gap is routing flips.
PROFILES["te-nvfp4-r3"] = PROFILES["te-nvfp4"].replace(name="te-nvfp4-r3", routing_replay=True)

# vLLM as its x86 CPU build executes it (the real peer of results/vllm-cpu, an AVX2 machine): the CPU-kernel
# choices the first-divergence trace against real vLLM found (peers.vllm_trace), each bitwise on vLLM's own op
# inputs: the emulation GEMM (kernels.vllm_cpu), the fp32 RoPE kernel (csrc/cpu/pos_encoding.cpp), the fp32
# attention kernel (csrc/cpu/cpu_attn_vec.hpp: q·scale, QKᵀ, softmax and PV in fp32; one kernel for prefill and
# decode), the truncating fp32->bf16 store of both, and the fused add-RMSNorm. None of them is Blackwell's arithmetic, so `vllm-nvfp4`
# keeps its values; `vllm-bf16-cpu` is the same non-GEMM kernels around bf16 GEMMs (vLLM bf16 on CPU).
_VLLM_CPU = dict(rope_dtype="float32", attention_dtype="float32", kernel_rounding="rtz", fused_add_norm=True)
PROFILES["vllm-nvfp4-cpu"] = PROFILES["vllm-nvfp4"].replace(name="vllm-nvfp4-cpu", w4a4_gemm="vllm-cpu", **_VLLM_CPU)
PROFILES["vllm-bf16-cpu"] = PROFILES["bf16"].replace(name="vllm-bf16-cpu", **_VLLM_CPU)
# vLLM 0.26's software W4A4 on a GPU (linear_backend / moe_backend="emulation", e.g. Hopper): the CPU build's GEMM
# arithmetic and none of its CPU kernels (CUDA RoPE, FlashAttention, RNE stores, CUDA fused add-norm stay as in
# `vllm-nvfp4`). Linears, EmulationNvFp4LinearKernel -> run_nvfp4_emulations (quantization/utils/
# nvfp4_emulation_utils.py:469-495): x̂ = bf16(e2m1(q)·fl(sf / input_global_scale)) (Triton QDQ, :187-202),
# ŵ = bf16(e2m1(q)·fl(sf · 1/weight_global_scale)) (:89-116), torch.matmul in bf16. MoE experts,
# Nvfp4QuantizationEmulationTritonExperts (fused_moe/experts/nvfp4_emulation_moe.py:489-545): the same x̂ (static
# a13 / a2 scales, max over experts), ŵ rounded to bf16 (:226-235), tl.dot with fp32 accumulation, bf16 out.
# Not covered: the top-k weight applied to the fp32 w2 accumulator and moe_sum in bf16 (:243-248, :547), and
# a13 / a2 = 1/(1/input_global_scale) (oracle/nvfp4.py:445-446). Measured against real vLLM: not yet.
PROFILES["vllm-nvfp4-emulation"] = PROFILES["vllm-nvfp4"].replace(name="vllm-nvfp4-emulation", w4a4_gemm="vllm-cpu")

# A baseline from TE 2.20's reference options that no rollout engine offers yet: miniTE with 4over6 block-scale
# selection (MAE, global E4M3 bound 256) on weights and activations. It is miniTE rather than te-nvfp4 because it
# is a real TE configuration only without RHT — NVFP4BlockScaling(nvfp4_4over6="all", disable_rht=True,
# disable_2d_quantization=True, row_scaled_activation=True) — and because an aligned pair needs both sides to
# run it (this project's sampler can; vLLM cannot). Gradients keep plain NVFP4 + SR, as TE keeps its grad slots.
PROFILES["minite-4over6"] = PROFILES["minite"].replace(
    name="minite-4over6", **{"weight.four_over_six": "mae", "activation.four_over_six": "mae"})


# The sampler profiles with packed-weight GEMMs (`decode_gemm`): each differs from its base in accumulation order
# only, so `diagnostics` pairs (base:base-packed, learner:base-packed) measure what the knob costs in k3.
for _base in ("vllm-nvfp4", "vllm-marlin-w4a16", "minite"):
    PROFILES[f"{_base}-packed"] = PROFILES[_base].replace(name=f"{_base}-packed", decode_gemm="packed")


def experiment_profiles(config: dict) -> list[str]:
    """Every profile name the experiment config runs (sorted, unique)."""
    names = set(config.get("throughput", {}).get("profiles", [])) | set(config.get("eval", {}).get("profiles", []))
    for entry in config.get("rl", {}).get("runs", []):
        names |= {entry["learner"], entry["sampler"]} if isinstance(entry, dict) else set(entry.split(":")[:2])
    for pair in config.get("diagnostics", {}).get("pairs", []):
        names |= set(pair.split(":"))
    return sorted(n for n in names if n in PROFILES)


# Knobs this process runs differently from every profile's own value: an environment override of the run
# (runs.execution: MINITE_ATTENTION -> attention_kernel), installed once and recorded in every result's env.
# Empty (the default): every profile runs as registered. Applied where a profile is put on a model (`effective`).
_OVERRIDES: dict = {}
OVERRIDABLE = ("attention_kernel",)


def effective(profile: Profile) -> Profile:
    """The profile as this process executes it: with the run's knob overrides (none by default)."""
    return profile.replace(**_OVERRIDES) if _OVERRIDES else profile


def set_overrides(**knobs) -> None:
    """The process's knob overrides (OVERRIDABLE fields; none = every profile as registered), checked now."""
    global _OVERRIDES
    unknown = sorted(set(knobs) - set(OVERRIDABLE))
    if unknown:
        raise ValueError(f"profile overrides {unknown} are not overridable; one of {list(OVERRIDABLE)}")
    PROFILES["bf16"].replace(**knobs)  # a bad value fails here, naming the knob
    _OVERRIDES = dict(knobs)


@contextmanager
def overriding(**knobs):
    """`set_overrides(**knobs)` for a block; the previous overrides are restored on exit."""
    before = dict(_OVERRIDES)
    set_overrides(**knobs)
    try:
        yield
    finally:
        set_overrides(**before)


def get_profile(name: str | Profile) -> Profile:
    if isinstance(name, Profile):
        return name
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; registered: {sorted(PROFILES)}") from None


def register(profile: Profile) -> Profile:
    """Add a baseline (e.g. from a user's rule); names are unique."""
    if profile.name in PROFILES:
        raise ValueError(f"profile {profile.name!r} is already registered")
    PROFILES[profile.name] = profile
    return profile
