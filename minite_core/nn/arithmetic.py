"""What a profile's NVFP4 GEMMs compute once their operands are quantized: one object per arithmetic, chosen once
per profile (`linear_gemm`), whose fprop / dgrad / wgrad the autograd functions call (nn.linear, nn.experts).

A profile names its GEMM arithmetic with two knobs, `w4a4_gemm` and `decode_gemm` (profiles.py says what each
value means), plus whether activations are quantized at all (W4A16). Like torchao's configs, which pick the GEMM
kernel when a layer is built rather than testing a string inside the matmul, `linear_gemm(profile)` turns those
knobs into one of the objects below; forward and backward then run what the profile says, with no comparison of
variant names in the autograd code.

| arithmetic     | fprop                                          | dgrad / wgrad  | grouped (MoE) fast path |
|----------------|------------------------------------------------|----------------|-------------------------|
| `Reference`    | x̂ ŵᵀ, fp32 accumulation, global scales after   | the same       | yes                     |
| `W4A16`        | bf16 x times ŵᵀ (Marlin), S_dec after          | `Reference`'s  | yes                     |
| `Packed`       | the packed-weight GEMM on the fast path; the   | `Reference`'s  | yes                     |
|                | cached-weight arithmetic elsewhere (same values)|               |                         |
| `VllmCpu`      | vLLM's CPU emulation (kernels.vllm_cpu)        | `Reference`'s  | no: the expert loop     |
| `TeReference`  | TE's reference qgemm (kernels.reference)       | TE's qgemm     | no: the expert loop     |

A profile whose wgrad input scale is per channel (`wgrad_input_scale_mode="row"`) has no grouped kernel either.
The objects hold no state of a call: its operands come in a `GemmCall` (the weight, its cache and fused-group
scale, the token shard, the SR seed).
"""
from __future__ import annotations

import dataclasses
import functools

import torch

from minite_core.formats.nvfp4 import NVFP4Tensor, global_encode_scale
from minite_core.formats.rht import rht as rht_fn
from minite_core.kernels import dispatch
from minite_core.nn import nonfinite
from minite_core.nn.operands import InputQuant, pad_tokens, quantize, shard_amax, weight_operand
from minite_core.nn.shard import TokenShard
from minite_core.profiles import Profile, Quant
from minite_core.seeds import dgrad_seed


def gemm_nt(a, b, out_dtype=torch.float32, invariant: bool = False) -> torch.Tensor:
    """â @ b̂ᵀ [M, N] with fp32 accumulation, rounded once to `out_dtype` (kernels.dispatch: reference on CPU,
    exact bf16-tensor-core GEMM on Hopper; invariant: the fixed-tile one, profile knob batch_invariant)."""
    return dispatch.gemm(a, b, out_dtype=out_dtype, invariant=invariant)


@dataclasses.dataclass
class GemmCall:
    """One NVFP4 linear call's operands besides the activations: the weight (N, K) with its module cache, cache
    key and fused-group amax; the token shard (nn.shard) or None; the SR seed; the input and weight dtypes."""

    weight: torch.Tensor
    profile: Profile
    cache: dict | None
    key: object
    fused: tuple | None
    shard: TokenShard | None
    seed: int
    x_dtype: torch.dtype

    def weight_op(self, orient: str, packed: bool = False):
        """The cached quantized weight along K ("n") or along N ("t": Wᵀ rows, dgrad)."""
        return weight_operand(self.weight, self.profile.weight, self.cache, (self.key, orient), self.fused,
                              packed=packed)


class Reference:
    """fp32 operands and accumulation, global scales in the epilogue: what an NVFP4 tensor core computes (vLLM's
    CUTLASS / FlashInfer path on sm_100), up to accumulation order; the bf16 tensor-core GEMM on Hopper."""

    grouped = True  # the grouped (MoE) fast path computes this arithmetic
    packed = False  # the grouped forward reads the packed expert weights (decode_gemm="packed")
    unshardable: str | None = None  # why it cannot run on a data-parallel token shard (nn.shard); None: it can

    def fprop(self, call: GemmCall, x: torch.Tensor, input_amax, shared: InputQuant) -> torch.Tensor:
        act = call.profile.activation
        amax = input_amax if act.static else shard_amax(x, call.shard, act)
        x_op = shared.get(x, ("dq", act, id(amax)), lambda: quantize(x.detach(), act, amax=amax, dq=True))
        nonfinite.record(call.weight, x_op.global_scale, "activation")
        return self.fprop_dq(call, x_op)

    def fprop_dq(self, call: GemmCall, x_op: dispatch.DqOperand) -> torch.Tensor:
        """fprop's GEMM on x already quantized (its DqOperand) -> (M, N) in the input dtype (call.x_dtype); also
        what the MoE experts' `remake_output` runs again in backward (nn/experts.py)."""
        return gemm_nt(x_op, call.weight_op("n"), call.x_dtype, call.profile.batch_invariant)

    def wgrad_saved(self, call: GemmCall, x: torch.Tensor, rht: dict) -> tuple:
        """Tensors besides the quantized xᵀ that wgrad needs from the forward (none)."""
        return ()

    def dgrad(self, call: GemmCall, dy: torch.Tensor) -> torch.Tensor:
        """dx (M, K) = dy W: dy (fp32) quantized along N with the grad spec (SR from the dgrad seed), Wᵀ along N."""
        grad, shard = call.profile.grad, call.shard
        dy_q = quantize(dy, grad, seed=dgrad_seed(call.seed), dq=True, amax=shard_amax(dy, shard, grad),
                        sr_origin=None if shard is None else (shard.offset, 0))  # (M, N) along N
        nonfinite.record(call.weight, dy_q.global_scale, "gradient (dgrad operand)")
        return gemm_nt(dy_q, call.weight_op("t"), call.x_dtype)  # Wᵀ (K, N) along N

    def wgrad(self, call: GemmCall, dy_t: NVFP4Tensor, dy_t_bf16: torch.Tensor, dy_p: torch.Tensor,
              x_t: NVFP4Tensor, saved: tuple, rht: dict) -> torch.Tensor:
        """dW (N, K) = dyᵀ x from the along-token operands dyᵀ (N, M') and the saved xᵀ (K, M')."""
        dy_t_q = dispatch.DqOperand(dy_t_bf16, dy_t.global_scale)
        x_t_op = dispatch.DqOperand(dispatch.dequantize_bf16(x_t), x_t.global_scale)
        return gemm_nt(dy_t_q, x_t_op, call.weight.dtype)


class W4A16(Reference):
    """Marlin W4A16: activations stay in the compute dtype, y = x ŵᵀ in fp32, S_dec after the accumulation."""

    def fprop(self, call, x, input_amax, shared):
        return dispatch.gemm_w4a16(x.detach(), call.weight_op("n"))


class Packed(Reference):
    """decode_gemm="packed": on the fast path the GEMM reads the packed codes + E4M3 scales (activation quantizer
    fused; kernels/decode.py); elsewhere `base` (W4A16 or Reference), which computes the same values."""

    packed = True
    unshardable = "decode_gemm='packed' is a sampler knob (the packed kernel takes no all-reduced amax)"

    def __init__(self, base: Reference):
        self.base = base

    def fprop(self, call, x, input_amax, shared):
        if not dispatch.fast_path(x):
            return self.base.fprop(call, x, input_amax, shared)
        return self.fprop_packed(call.profile, x, call.weight_op("n", packed=True), input_amax)

    @staticmethod
    def fprop_packed(profile, x, w: NVFP4Tensor, input_amax) -> torch.Tensor:
        """The fast path's GEMM on a packed weight (also a fused group's stacked weights, nn.linear.group_decode)."""
        act = profile.activation
        amax = input_amax if act is not None and act.static else None
        return dispatch.decode_gemm(x.detach(), w, act=act, amax=amax, out_dtype=x.dtype)


class VllmCpu(Reference):
    """w4a4_gemm="vllm-cpu": vLLM's CPU emulation kernel (kernels.vllm_cpu): the global scale folded into the block
    scale, both operands rounded to the compute dtype, matmul in it. Static activation scales only."""

    grouped = False

    def fprop(self, call, x, input_amax, shared):
        act = call.profile.activation
        amax = input_amax if act.static else shard_amax(x, call.shard, act)
        return dispatch.gemm_vllm_cpu(quantize(x.detach(), act, amax=amax), global_encode_scale(amax),
                                      call.weight_op("n", packed=True), x.dtype)  # it folds the block scales


def te_amax(t: torch.Tensor, scale_mode: str = "tensor", *, rht: bool = False, rht_dtype: str = "float32"):
    """The amax TE's NVFP4QuantizerRef keeps beside a quantized operand (global_amax_row / _col) for the epilogue of
    its GEMM: of the operand as quantized (RHT'd when it is), [] or per row [R, 1]."""
    a = (rht_fn(t.detach(), rht_dtype) if rht else t.detach()).float().abs()
    return a.amax(dim=1, keepdim=True) if scale_mode == "row" else a.amax()


def e4m3_bound(spec: Quant) -> float:
    return 256.0 if spec.four_over_six != "off" else 448.0  # the E4M3 global bound 4over6 quantizes with (TE's)


class TeReference(Reference):
    """w4a4_gemm="te-ref": Transformer Engine 2.20's reference GEMM (NVFP4QuantizerRef.qgemm, what te.Linear runs
    on Hopper) in fprop, dgrad and wgrad, on packed operands and their amaxes (kernels.reference)."""

    grouped = False
    unshardable = "w4a4_gemm='te-ref' (its amaxes would need an all-reduce)"

    def fprop(self, call, x, input_amax, shared):
        p = call.profile
        return dispatch.gemm_te_reference(quantize(x.detach(), p.activation), call.weight_op("n", packed=True),
                                          te_amax(x, p.activation.scale_mode), te_amax(call.weight),
                                          (e4m3_bound(p.activation), e4m3_bound(p.weight)), x.dtype)

    def wgrad_saved(self, call, x, rht):
        """The amax of xᵀ, for the wgrad epilogue."""
        return (te_amax(pad_tokens(x.detach()).t(), call.profile.wgrad_input_scale_mode, **rht),)

    def dgrad(self, call, dy):
        p = call.profile
        dy_q = quantize(dy, p.grad, seed=dgrad_seed(call.seed))  # (M, N) along N, packed
        nonfinite.record(call.weight, dy_q.global_scale, "gradient (dgrad operand)")
        return dispatch.gemm_te_reference(dy_q, call.weight_op("t", packed=True), te_amax(dy), te_amax(call.weight),
                                          (e4m3_bound(p.grad), e4m3_bound(p.weight)), call.x_dtype)

    def wgrad(self, call, dy_t, dy_t_bf16, dy_p, x_t, saved, rht):
        p = call.profile
        return dispatch.gemm_te_reference(dy_t, x_t, te_amax(dy_p.t(), **rht), saved[0],
                                          (e4m3_bound(p.grad), e4m3_bound(p.activation or p.grad)), call.weight.dtype)


_W4A4 = {"reference": Reference, "vllm-cpu": VllmCpu, "te-ref": TeReference}
_DECODE = {"cached-bf16": lambda gemm: gemm, "packed": Packed}  # profiles.py allows "packed" with "reference" only


@functools.cache
def linear_gemm(profile: Profile) -> Reference:
    """The arithmetic of `profile`'s NVFP4 GEMMs (module docstring); built once per profile (profiles are frozen)."""
    gemm = _DECODE[profile.decode_gemm](W4A16() if profile.activation is None else _W4A4[profile.w4a4_gemm]())
    if profile.wgrad_input_scale_mode != "tensor":  # per-channel xᵀ scales: no grouped kernel, the expert loop
        gemm.grouped = False
        if profile.grad is not None:
            gemm.unshardable = (f"wgrad_input_scale_mode={profile.wgrad_input_scale_mode!r} (a per-channel amax over "
                                "ranks is not implemented)")
    return gemm
