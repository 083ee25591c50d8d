"""`vllm-nvfp4-emulation`: vLLM 0.26's GPU software W4A4 (linear / MoE backend "emulation") as profile knobs — the
CPU build's emulation GEMM (w4a4_gemm="vllm-cpu") without its CPU kernels. CPU checks of the registration only;
the comparison with real vLLM is `vllm_measure compare` on a GPU (a default learner)."""
from __future__ import annotations

import torch

from minite_core.formats.nvfp4 import global_encode_scale
from minite_core.kernels import vllm_cpu
from minite_core.model import PRESETS, CausalLM, set_profile
from minite_core.model.calibrate import calibrate
from minite_core.nn.arithmetic import VllmCpu, linear_gemm
from minite_core.nn.operands import fused_weight_amax, quantize
from minite_core.profiles import PROFILES, get_profile


def test_emulation_profile_is_vllm_nvfp4_with_the_folded_bf16_gemm():
    emu, gpu, cpu = (get_profile(n) for n in ("vllm-nvfp4-emulation", "vllm-nvfp4", "vllm-nvfp4-cpu"))
    assert emu.w4a4_gemm == "vllm-cpu"
    assert emu.replace(name="vllm-nvfp4", w4a4_gemm="reference") == gpu  # nothing else differs from vllm-nvfp4
    # the GPU's non-GEMM kernels, not the CPU build's
    assert (emu.rope_dtype, emu.attention_dtype, emu.kernel_rounding, emu.fused_add_norm) == (None, None, "rne", False)
    assert emu.replace(name="vllm-nvfp4-cpu", rope_dtype="float32", attention_dtype="float32", kernel_rounding="rtz",
                       fused_add_norm=True) == cpu
    # static per-tensor activation scale (input_global_scale), fast quantizer order, one q/k/v and gate/up scale
    assert emu.activation.static and emu.activation.scale_mode == "tensor" and emu.activation.math == "fast"
    assert emu.weight.math == "fast" and emu.fused_weight_scale and emu.decode_gemm == "cached-bf16"
    assert not emu.can_learn and emu.needs_calibration
    gemm = linear_gemm(emu)
    assert type(gemm) is VllmCpu and not gemm.grouped  # experts: the per-expert loop of the same arithmetic


def test_emulation_profile_linear_is_the_folded_bf16_gemm_and_moves_logits():
    torch.manual_seed(0)
    model = CausalLM(PRESETS["tiny-moe"]).init_weights(0, std=0.3)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16))
    ids = torch.randint(3, 64, (2, 24), generator=torch.Generator().manual_seed(0))
    set_profile(model, PROFILES["bf16"])
    calibrate(model, [ids])
    q = model.model.layers[0].self_attn.q_proj
    x = torch.randn(5, q.weight.shape[1], generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with torch.no_grad():
        set_profile(model, "vllm-nvfp4-emulation")
        y = q(x)
        emu = model(ids)
        set_profile(model, "vllm-nvfp4")
        ref = model(ids)
    spec = PROFILES["vllm-nvfp4-emulation"]
    assert q.fused_group  # q/k/v share one weight global scale (QKVParallelLinear)
    w_q = quantize(q.weight.detach().float(), spec.weight, amax=fused_weight_amax(q.fused_group)[0])
    expect = vllm_cpu.gemm(quantize(x, spec.activation, amax=q.input_amax), global_encode_scale(q.input_amax), w_q,
                           torch.bfloat16)
    assert y.dtype == torch.bfloat16 and torch.equal(y, expect)
    assert emu.isfinite().all() and not torch.equal(emu, ref)  # the knob changes the numbers


def test_emulation_profile_fast_path_reads_the_packed_weight(one_thread):
    """On the Triton backend (the interpreter here) the emulation GEMM reads the packed weight — it folds the
    global scale into the block scales, which the cached bf16 operand no longer has — and the logits equal the
    reference backend's bit for bit."""
    from minite_core.kernels import dispatch
    from minite_core.nn.operands import clear_weight_caches

    torch.manual_seed(0)
    model = CausalLM(PRESETS["tiny-moe"]).init_weights(0, std=0.3)
    ids = torch.randint(3, 64, (2, 24), generator=torch.Generator().manual_seed(0))
    set_profile(model, PROFILES["bf16"])
    calibrate(model, [ids])
    set_profile(model, "vllm-nvfp4-emulation")
    logits = {}
    for be in ("reference", "triton"):  # conftest restores the session's backend after the test
        dispatch.set_backend(be)
        clear_weight_caches(model)
        with torch.no_grad():
            logits[be] = model(ids)
    assert torch.equal(logits["triton"], logits["reference"])
