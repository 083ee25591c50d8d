"""The fast learner path (grouped Triton NVFP4 kernels / torch._grouped_mm in autograd) against the reference path
(per-expert loop of plain-torch `linear`), one full learner step: loss and every parameter gradient.

CPU: the fast path runs under Triton's interpreter (`kernels: triton` with TRITON_INTERPRET=1) on a tiny MoE;
GPU (`-m gpu`): compiled, at a larger shape. Tolerances (TOL) are named once: the bf16 profile is bitwise on CPU
(torch._grouped_mm's CPU path multiplies each group as the reference does); NVFP4 gradients differ only through
fp32 accumulation order, which can flip a bf16 rounding and then one re-quantized NVFP4 code, so a gradient
tensor may move by a few 1e-3 relative to its norm.
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from minite_core.kernels import dispatch
from minite_core.model import PRESETS, CausalLM, set_profile
from minite_core.nn import GroupedLinear, QuantLinear
from minite_core.nn.moe_layout import moe_layout, padded_rows, permute
from minite_core.profiles import get_profile

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
CUDA = torch.cuda.is_available()
triton_ok = pytest.mark.skipif(not (INTERPRETED or CUDA), reason="needs a CUDA GPU or TRITON_INTERPRET=1")
TOL = {"loss_rel": 1e-5, "grad_rel_nvfp4": 5e-3,
       # GPU: the reference's fp32 GEMMs and the fast bf16 tensor-core GEMMs accumulate in different orders, which
       # flips bf16 outputs; every NVFP4 (re-)quantization downstream turns a perturbation d into an error of
       # ~sqrt(d * grid step) (a value near a rounding threshold — or an SR draw near p_up — changes by a whole
       # step), so through a backward pass the full-step gradients agree in direction, not to the last bits
       # (H200: loss 1.3e-4 relative, worst gradient 0.23-0.37 relative for minite / te-nvfp4). Exactness is what
       # the per-op checks assert (same inputs -> codes bitwise, outputs to accumulation order).
       "loss_rel_gpu": 1e-3, "grad_cos_gpu": 0.9, "grad_rel_bf16_gpu": 2e-2}
PROFILES = ["bf16", "minite", "te-nvfp4"]


@pytest.fixture
def backend():
    """Switches the run's kernel backend (conftest restores it after every test)."""
    return dispatch.set_backend


def _model(device, **over):
    cfg = PRESETS["tiny-moe"].replace(num_hidden_layers=2, mlp_only_layers=(), **over)
    return CausalLM(cfg).init_weights(0).to(device)


def _step(model, ids, profile, backend_name, set_backend):
    set_backend(backend_name)
    set_profile(model, profile)
    for j, m in enumerate(m for m in model.modules() if isinstance(m, (QuantLinear, GroupedLinear))):
        m.seed = 1000 + j  # SR seeds as a learner sets them
        m.weight_cache.clear()
    model.zero_grad(set_to_none=True)
    logits = model(ids[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _worst(g_sut, g_ref):
    assert set(g_sut) == set(g_ref)
    rel = {n: ((g_sut[n] - g_ref[n]).norm() / g_ref[n].norm().clamp(min=1e-30)).item() for n in g_ref}
    print("worst gradients:", ", ".join(f"{n} {v:.2e}" for n, v in sorted(rel.items(), key=lambda kv: -kv[1])[:5]))
    return max(rel.values())


def _check_step(model, ids, profile, set_backend, loss_tol, grad_tol=None, cos_min=None):
    loss_ref, g_ref = _step(model, ids, profile, "reference", set_backend)
    loss_sut, g_sut = _step(model, ids, profile, "triton", set_backend)
    loss_rel = abs(loss_sut.item() - loss_ref.item()) / abs(loss_ref.item())
    worst = _worst(g_sut, g_ref)
    cos = min(F.cosine_similarity(g_sut[n].flatten().double(), g_ref[n].flatten().double(), dim=0).item()
              for n in g_ref)
    print(f"{profile}: loss rel {loss_rel:.2e}, worst gradient rel {worst:.2e}, min cosine {cos:.5f}")
    assert loss_rel <= loss_tol, f"{profile}: loss rel {loss_rel:.2e}"
    assert grad_tol is None or worst <= grad_tol, f"{profile}: worst gradient rel {worst:.2e}"
    assert cos_min is None or cos >= cos_min, f"{profile}: min gradient cosine {cos:.5f}"
    return worst


@triton_ok
@pytest.mark.parametrize("profile", PROFILES)
def test_fast_step_matches_reference_cpu(profile, backend, one_thread):
    if CUDA:
        pytest.skip("the CPU interpreter variant; the GPU variant is test_gpu_fast_step_matches_reference")
    model = _model("cpu")
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(1))  # 18 tokens: not % 16
    worst = _check_step(model, ids, profile, backend, TOL["loss_rel"],
                        0.0 if profile == "bf16" else TOL["grad_rel_nvfp4"])
    if profile == "bf16":
        assert worst == 0.0


def _odd_routings(dev, backend):
    """Empty experts, a single token, and every token on one expert: the fast grouped path matches the loop."""
    g = GroupedLinear(4, 32, 48)
    torch.nn.init.normal_(g.weight, std=0.1)
    g.to(dev)
    lin = QuantLinear(32, 48)
    torch.nn.init.normal_(lin.weight, std=0.1)
    lin.to(dev)
    for top in (torch.tensor([[2]]), torch.full((20, 1), 3), torch.tensor([[0, 3]] * 7)):
        layout = moe_layout(top.to(dev), 4)
        assert layout.num_rows == padded_rows(top.shape[0], top.shape[1], 4)
        x = permute(torch.randn(top.shape[0], 32, device=dev, dtype=torch.bfloat16), layout)
        for name in PROFILES:
            for mod, args in ((g, (layout,)), (lin, ())):
                mod.profile, mod.seed = get_profile(name), 77
                outs = {}
                for be in ("reference", "triton"):
                    backend(be)
                    mod.weight_cache.clear()
                    mod.weight.grad = None
                    xi = x.detach().requires_grad_(True)
                    y = mod(xi, *args)
                    (y.float() * torch.linspace(-1, 1, y.shape[1], device=dev)).sum().backward()
                    outs[be] = (y.detach().float(), xi.grad.float(), mod.weight.grad)
                for what, a, b in zip(("y", "dx", "dw"), outs["triton"], outs["reference"]):
                    rel = ((a - b).norm() / b.norm().clamp(min=1e-30)).item()
                    assert rel <= TOL["grad_rel_nvfp4"], f"{name} {type(mod).__name__} {what}: {rel:.2e}"


@triton_ok
def test_fast_path_odd_routings(backend, one_thread):
    if CUDA:
        pytest.skip("CPU interpreter variant; see test_gpu_fast_path_odd_routings")
    _odd_routings("cpu", backend)


@triton_ok
@pytest.mark.parametrize("name", PROFILES)
def test_fast_path_expert_offset_is_the_full_layers_slice(name, backend, one_thread):
    """An expert-parallel rank's slice (experts 2, 3 of 4: expert_offset 2) on the fast path computes exactly what
    the full layer computes for tokens routed to those experts: output, dx and the slice's dW, bitwise (the same
    kernels on the same rows, SR drawn from the global experts' streams); offset 0 draws other streams (SR)."""
    backend("triton")
    dev = "cuda" if CUDA else "cpu"
    full = GroupedLinear(4, 32, 48)
    torch.nn.init.normal_(full.weight, std=0.1)
    part = GroupedLinear(2, 32, 48)
    part.weight = torch.nn.Parameter(full.weight.detach()[2:].clone())
    top = torch.tensor([[2, 3], [3, 2], [2, 3]] * 6, device=dev)  # (18, 2): experts 0 and 1 empty
    x = torch.randn(18, 32, generator=torch.Generator().manual_seed(4)).to(dev, torch.bfloat16)
    outs = []
    for mod, ids, E, offset in ((full, top, 4, 0), (part, top - 2, 2, 2), (part, top - 2, 2, 0)):
        mod.to(dev)
        mod.profile, mod.seed, mod.expert_offset = get_profile(name), 77, offset
        mod.weight_cache.clear()
        mod.weight.grad = None
        layout = moe_layout(ids, E)
        xi = permute(x, layout).detach().requires_grad_(True)
        y = mod(xi, layout)
        (y.float() * torch.linspace(-1, 1, y.shape[1], device=dev)).sum().backward()
        rows = layout.dest  # (18, 2): each assignment's row in this layout's padding
        outs.append((y.detach()[rows], xi.grad[rows], mod.weight.grad[-2:]))
    for what, a, b in zip(("y", "dx", "dw"), outs[1], outs[0]):
        assert torch.equal(a, b), f"{name} {what}"
    if get_profile(name).grad is not None and get_profile(name).grad.rounding == "sr":
        assert not torch.equal(outs[2][1], outs[0][1]), "offset 0 should draw the wrong experts' SR streams"


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
def test_gpu_fast_path_odd_routings(backend):
    _odd_routings("cuda", backend)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("profile", PROFILES)
def test_gpu_fast_step_matches_reference(profile, backend):
    model = _model("cuda", hidden_size=256, moe_intermediate_size=128, intermediate_size=256, num_experts=8,
                   num_experts_per_tok=2, head_dim=32, num_attention_heads=8, num_key_value_heads=2, vocab_size=512)
    ids = torch.randint(0, 512, (4, 131), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    if profile == "bf16":
        _check_step(model, ids, profile, backend, TOL["loss_rel_gpu"], grad_tol=TOL["grad_rel_bf16_gpu"])
    else:
        _check_step(model, ids, profile, backend, TOL["loss_rel_gpu"], cos_min=TOL["grad_cos_gpu"])


@triton_ok
@pytest.mark.parametrize("math", ["exact", "fast"])
def test_expert_weight_t_in_place_equals_the_transposed_copy(math, backend):
    """Wᵀ quantized along N by the along-token quantizer on W in place (nn.expert_weights.weight_t_inplace, the strided
    (E, K, N) view) is the transposing path's operand bit for bit: values, per-expert S_dec, and the shared amax."""
    from minite_core.nn import expert_weights as ew

    backend("triton")
    g = torch.Generator().manual_seed(4)
    E, N, K = 3, 48, 32
    w = torch.randn(E, N, K, generator=g) * torch.tensor([0.02, 1.0, 300.0])[:, None, None]
    w[1, :16] = 0.0  # an all-zero block row
    w = w.to("cuda" if CUDA else "cpu")
    spec = get_profile("minite").weight
    spec = spec.__class__(**{**spec.__dict__, "math": math})
    assert torch.equal(ew.expert_amax(w, None), w.abs().amax(dim=(1, 2)))
    sut = ew.expert_weight(w, spec, None, "t")
    ref = ew.expert_weight_t_reference(w, spec)
    assert sut.values_bf16.shape == ref.values_bf16.shape == (E, K, N)
    assert torch.equal(sut.values_bf16.contiguous().cpu(), ref.values_bf16.cpu())
    assert torch.equal(sut.global_scale.cpu(), ref.global_scale.cpu())
