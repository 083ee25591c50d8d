"""The profile knobs that describe vLLM's CPU path (w4a4_gemm, rope_dtype, kernel_rounding, fused_add_norm) and
`Sampler.score`, in the project venv. Bitwise agreement with vLLM's own kernels: tests/test_vllm_peer.py."""
from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch

from minite_core.engines.sampler import Sampler
from minite_core.formats.e2m1 import e2m1_decode, unpack_fp4
from minite_core.formats.nvfp4 import global_encode_scale, quantize
from minite_core.kernels import vllm_cpu
from minite_core.model import PRESETS, CausalLM
from minite_core.model.qwen3_moe import RMSNorm, apply_rope, cast, rope_cos_sin
from minite_core.model.calibrate import calibrate
from minite_core.profiles import PROFILES, get_profile


def test_cast_rtz_truncates_and_rne_rounds():
    one_plus = torch.tensor([1.0 + 2 ** -8 + 2 ** -12, -(1.0 + 2 ** -8 + 2 ** -12), 1.0 + 2 ** -9, 3.0])
    rtz = cast(one_plus, torch.bfloat16, "rtz").float()
    assert rtz.tolist() == [1.0, -1.0, 1.0, 3.0]  # toward zero: the low bits dropped
    rne = cast(one_plus, torch.bfloat16, "rne").float()
    assert rne.tolist() == [1.0 + 2 ** -7, -(1.0 + 2 ** -7), 1.0, 3.0]  # above / below half an ulp
    x = torch.randn(1000).to(torch.bfloat16)
    assert torch.equal(cast(x.float(), torch.bfloat16, "rtz"), x)  # exact values pass unchanged


def test_rope_fp32_is_one_rounding_of_the_exact_rotation():
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(1, 2, 9, 32, generator=gen) * 3).to(torch.bfloat16)
    cos, sin = rope_cos_sin(torch.arange(9)[None], 32, 10000.0, torch.bfloat16)
    exact = x.double() * cos.double() + torch.cat([-x[..., 16:], x[..., :16]], -1).double() * sin.double()
    assert torch.equal(apply_rope(x, cos, sin, torch.float32, "rtz"), cast(exact.float(), torch.bfloat16, "rtz"))
    assert torch.equal(apply_rope(x, cos, sin, torch.float32), exact.float().to(torch.bfloat16))
    assert torch.equal(apply_rope(x, cos, sin), x * cos + torch.cat([-x[..., 16:], x[..., :16]], -1) * sin)


def test_fused_add_norm_normalises_the_unrounded_sum():
    gen = torch.Generator().manual_seed(1)
    x, r = ((torch.randn(7, 64, generator=gen) * 4).to(torch.bfloat16) for _ in range(2))
    norm = RMSNorm(64, 1e-6)
    s = x.float() + r.float()
    ref = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(norm(x, r), ref)
        assert not torch.equal(norm(x, r), norm(x + r))  # the rounded sum is a different input


def test_vllm_cpu_gemm_folds_the_global_scale_before_rounding():
    gen = torch.Generator().manual_seed(2)
    x, w = torch.randn(5, 64, generator=gen).to(torch.bfloat16), torch.randn(24, 64, generator=gen)
    amax = torch.tensor(2.5)
    x_q, w_q = quantize(x, amax=amax, math="fast"), quantize(w, math="fast")
    s_enc = global_encode_scale(amax)

    def folded(t, f):  # e2m1 · fl(f(sf)) rounded to bf16, written out element-wise
        v = e2m1_decode(unpack_fp4(t.data)).view(t.shape[0], -1, 16)
        return (v * f(t.scale.float()).unsqueeze(-1)).reshape(t.shape).to(torch.bfloat16)

    ref = folded(x_q, lambda sf: sf / s_enc) @ folded(w_q, lambda sf: sf * w_q.global_scale).t()
    assert torch.equal(vllm_cpu.gemm(x_q, s_enc, w_q, torch.bfloat16), ref)
    with pytest.raises(ValueError, match="per-tensor"):
        vllm_cpu.gemm(quantize(x, scale_mode="row"), s_enc, w_q, torch.bfloat16)


def test_vllm_cpu_profiles_validate_and_keep_the_gpu_profile():
    gpu, cpu = get_profile("vllm-nvfp4"), get_profile("vllm-nvfp4-cpu")
    assert (gpu.w4a4_gemm, gpu.rope_dtype, gpu.kernel_rounding, gpu.fused_add_norm) == ("reference", None, "rne", False)
    assert (cpu.w4a4_gemm, cpu.rope_dtype, cpu.attention_dtype, cpu.kernel_rounding, cpu.fused_add_norm) == (
        "vllm-cpu", "float32", "float32", "rtz", True)
    assert cpu.replace(w4a4_gemm="reference", rope_dtype=None, attention_dtype=None, kernel_rounding="rne",
                       fused_add_norm=False, name="vllm-nvfp4") == gpu  # nothing else differs
    with pytest.raises(ValueError, match="static"):
        PROFILES["minite"].replace(w4a4_gemm="vllm-cpu")
    with pytest.raises(ValueError, match="kernel_rounding"):
        gpu.replace(kernel_rounding="up")
    assert cpu.replace(boundary_layers=(1, 0)).for_layer(0, 2).weight is None  # boundary layers still allowed


@pytest.mark.parametrize("profile", ["vllm-nvfp4-cpu", "vllm-bf16-cpu", "bf16"])
def test_sampler_score_reproduces_generate(profile, one_thread):
    cfg = PRESETS["tiny-dense"].replace(hidden_size=64, head_dim=32, intermediate_size=128)
    model = CausalLM(cfg).init_weights(0, std=0.3)
    prompts = [[3, 5, 7, 9], [4, 6], [8, 10, 12]]
    calibrate(model, [torch.tensor([p + [1] * (4 - len(p)) for p in prompts])])
    own = Sampler(model, profile).generate(prompts, max_new_tokens=7, seed=0)
    logp, mask, amx = Sampler(model, profile).score(own.prompt_ids, own.response_ids)
    pad = own.padded()
    assert torch.equal(mask, pad["mask"])
    assert torch.equal(logp[mask], pad["logprobs"][mask])
    assert torch.equal(amx[mask], pad["argmax_ids"][mask])


@pytest.mark.parametrize("python", ["/nonexistent/python", sys.executable])
def test_vllm_peer_dag_rule_skips_with_the_reason(python, tmp_path):
    if python == sys.executable and importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is importable here: the rule would run the whole comparison")
    from minite_core.peers.vllm_compare import main

    status = tmp_path / "status.json"
    assert main(["dag", "--python", python, "--out", str(tmp_path / "out"), "--work", str(tmp_path / "w"),
                 "--status", str(status)]) == 0
    s = json.loads(status.read_text())
    assert s["status"] == "skipped" and python in s["reason"] and not (tmp_path / "out").exists()
