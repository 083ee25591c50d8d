"""Packed-weight GEMMs (kernels/decode.py) and the `decode_gemm` profile knob: the kernel == its plain-torch
block-order reference (kernels.reference.packed_gemm_reference), dense and grouped; the packed sampler == the
reference sampler of the same profile bitwise (same kernels) and within a measured |Δ| of the cached-bf16 one.

Bitwise where it can hold in any order: with an NVFP4 activation (or a few-bit bf16 one) every product has
<= 10 significant bits and every partial sum of a K chunk is exact in fp32, so the accumulation order cannot
change a bit and a mismatch is a bug (indexing, nibble order, scales, the fused quantizer). Random bf16 W4A16
activations make inexact sums: there the kernel and the reference agree to fp32 accumulation order only.
CPU tests run Triton's interpreter on tiny shapes; `-m gpu` runs the same checks compiled on the GPU."""
from __future__ import annotations

import os

import pytest
import torch

from minite_core.engines import FastSampler, Sampler
from minite_core.formats import nvfp4 as ref
from minite_core.kernels import dispatch
from minite_core.kernels.operands import PackedExperts
from minite_core.kernels.reference import decode_gemm_reference, packed_gemm_reference
from minite_core.model import PRESETS, CausalLM, set_profile
from minite_core.model.calibrate import calibrate
from minite_core.profiles import PROFILES, Quant, get_profile

CUDA = torch.cuda.is_available()
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
cpu_kernels = pytest.mark.skipif(not (INTERPRETED or CUDA), reason="needs TRITON_INTERPRET=1 (conftest) or a GPU")
gpu = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")]
DEV = "cuda" if CUDA else "cpu"
ACTS = {"w4a16": None, "row-exact": Quant(scale_mode="row"), "static-fast": Quant(math="fast", static=True),
        "tensor-exact": Quant()}
REL_TOL = 1e-5  # fp32 accumulation order, K <= 4096 (tests/test_kernels.py's TOL["gemm_rel"] scale)


def _few_bits(x: torch.Tensor) -> torch.Tensor:
    """bf16 values with 3 significant bits in a narrow range: exact products and chunk sums (module docstring)."""
    return (torch.round(x.float().clamp(-4, 4) * 2) / 2).to(torch.bfloat16)


def _order(m: int, n: int, k: int, device, grouped_experts: int = 0, config: dict | None = None) -> dict:
    """The kernel's accumulation order for this call (decode.decode_config): block_k and split_k."""
    from minite_core.kernels import decode

    dev = torch.device(device)
    if grouped_experts:
        max_tiles = -(-m // decode.grouped_block_m(m, grouped_experts)) + grouped_experts
        cfg = decode.decode_config(max_tiles, n, k, dev, dict(config or {},
                                                              BLOCK_M=decode.grouped_block_m(m, grouped_experts)))
    else:
        cfg = decode.decode_config(-(-m // (16 if m <= 16 else 64)), n, k, dev,
                                   dict(config or {}, **({} if m <= 16 else {"BLOCK_M": 64})))
    return {"block_k": cfg["BLOCK_K"], "split_k": cfg["SPLIT_K"]}


def _weight(n, k, seed, device=DEV, scale_mode="tensor"):
    g = torch.Generator().manual_seed(seed)
    return ref.quantize(torch.randn(n, k, generator=g).to(device), scale_mode=scale_mode)


def _x(m, k, seed, device=DEV):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g).to(device, torch.bfloat16)


def _amax(act, device=DEV):
    return torch.tensor(2.5, device=device) if act is not None and act.static else None


def _check_dense(m, n, k, device, exact: bool = True):
    """exact: K small enough that every chunk sum is exact (bitwise); else (K = 4096 on the GPU: a chunk of 512
    products spans more than fp32's 24 bits) within fp32 accumulation order."""
    from minite_core.kernels.decode import packed_gemm_triton

    for scale_mode in ("tensor", "row"):
        w = _weight(n, k, 1, device, scale_mode)
        for name, act in ACTS.items():
            x = _x(m, k, 2, device)
            x = _few_bits(x) if act is None else x
            y = packed_gemm_triton(x, w, act=act, amax=_amax(act, device), out_dtype=torch.float32)
            y_ref = packed_gemm_reference(x, w, act=act, amax=_amax(act, device), **_order(m, n, k, device))
            if exact:
                assert torch.equal(y, y_ref), (m, scale_mode, name, (y - y_ref).abs().max().item())
            else:
                assert ((y - y_ref).norm() / y_ref.norm()).item() < REL_TOL, (m, scale_mode, name)
        x = _x(m, k, 3, device)  # random bf16 W4A16: inexact sums
        y = packed_gemm_triton(x, w, out_dtype=torch.float32)
        y_ref = packed_gemm_reference(x, w, **_order(m, n, k, device))
        assert ((y - y_ref).norm() / y_ref.norm()).item() < REL_TOL


def _check_grouped(k, device, exact: bool = True):
    from minite_core.kernels.decode import grouped_packed_gemm_triton

    E, N = 3, 24
    ws = [_weight(N, k, 10 + e, device) for e in range(E)]
    packed = PackedExperts(torch.stack([w.data for w in ws]), torch.stack([w.scale for w in ws]),
                           torch.stack([w.global_scale for w in ws]))
    offs = torch.tensor([0, 16, 16, 48], device=device)  # expert 1 empty
    bounds = offs.tolist()
    for name, act in ACTS.items():
        if act is not None and act.scale_mode == "tensor" and not act.static:
            continue  # per-expert dynamic amaxes come from nn.experts (tested through the model below)
        x = _x(48, k, 4, device)
        x = _few_bits(x) if act is None else x
        x[5:16] = 0  # pad rows of expert 0's segment
        y = grouped_packed_gemm_triton(x, packed, offs, act=act, amax=_amax(act, device), out_dtype=torch.float32)
        order = _order(48, N, k, device, grouped_experts=E)
        y_ref = torch.cat([packed_gemm_reference(x[s:t], ws[e], act=act, amax=_amax(act, device), **order)
                           for e, (s, t) in enumerate(zip(bounds[:-1], bounds[1:])) if t > s])
        if exact:
            assert torch.equal(y, y_ref), (name, (y - y_ref).abs().max().item())
        else:
            assert ((y - y_ref).norm() / y_ref.norm()).item() < REL_TOL, name


@cpu_kernels
@pytest.mark.parametrize("m", [1, 5, 20])
def test_packed_gemm_equals_block_order_reference(m, one_thread):
    _check_dense(m, 40, 96, DEV)


@cpu_kernels
@pytest.mark.parametrize("config", [{"SPLIT_K": 1}, {"SPLIT_K": 2}, {"SPLIT_K": 16}])
def test_packed_gemm_split_k_and_ragged_k(config, one_thread):
    """Split-K (the tickets, the slice-ordered sum; more slices than chunks clipped) and a K that is not a multiple
    of BLOCK_K (the masked loads), against the reference in the same order — bitwise (exact sums)."""
    from minite_core.kernels.decode import packed_gemm_triton

    w = _weight(24, 80, 7)
    for name, act in ACTS.items():
        x = _x(3, 80, 8)
        x = _few_bits(x) if act is None else x
        y = packed_gemm_triton(x, w, act=act, amax=_amax(act), out_dtype=torch.float32, config=config)
        y_ref = packed_gemm_reference(x, w, act=act, amax=_amax(act), **_order(3, 24, 80, DEV, config=config))
        assert torch.equal(y, y_ref), (config, name)


@cpu_kernels
def test_grouped_packed_gemm_equals_per_expert_reference(one_thread):
    _check_grouped(64, DEV)


def test_reference_decode_gemm_is_the_cached_reference_bitwise():
    """On the reference path decode_gemm computes exactly what gemm / gemm_w4a16 compute (both read packed)."""
    x, w = _x(4, 32, 5, "cpu").float(), _weight(8, 32, 6, "cpu")
    for act in (Quant(scale_mode="row"), Quant(math="fast", static=True)):
        amax = _amax(act, "cpu")
        y = dispatch.decode_gemm(x, w, act=act, amax=amax, out_dtype=torch.float32, backend="reference")
        xq = dispatch.quantize_dq(x, act, amax=amax, backend="reference", check=False)[1]
        assert torch.equal(y, dispatch.gemm(xq, w, torch.float32, backend="reference"))
    y = dispatch.decode_gemm(x, w, out_dtype=torch.float32, backend="reference")
    assert torch.equal(y, dispatch.gemm_w4a16(x, w, backend="reference"))
    assert torch.equal(y, decode_gemm_reference(x, w))


def test_decode_gemm_knob_validation():
    assert get_profile("minite").decode_gemm == "cached-bf16"  # registered profiles keep their numerics
    for base in ("vllm-nvfp4", "vllm-marlin-w4a16", "minite"):
        p = PROFILES[f"{base}-packed"]
        assert p.decode_gemm == "packed" and p.replace(name=base, decode_gemm="cached-bf16") == PROFILES[base]
    with pytest.raises(ValueError, match="decode_gemm"):
        get_profile("minite").replace(decode_gemm="marlin")
    bounded = PROFILES["minite-packed"].replace(boundary_layers=(1, 0))  # a bf16 boundary layer: no effect there
    assert bounded.for_layer(0, 2).weight is None and bounded.for_layer(1, 2).decode_gemm == "packed"
    with pytest.raises(ValueError, match="w4a4_gemm"):
        get_profile("vllm-nvfp4-cpu").replace(decode_gemm="packed")
    with pytest.raises(ValueError, match="4over6"):
        get_profile("minite-4over6").replace(decode_gemm="packed")


# ---- the model: packed sampler vs the reference sampler (same kernels) and vs cached-bf16 --------------------
PROMPTS = [[1, 5, 6, 7], [1, 10, 11, 12, 13, 14]]
PACKED = ["minite-packed", "vllm-nvfp4-packed", "vllm-marlin-w4a16-packed"]


def _model(name: str, device) -> CausalLM:
    model = CausalLM(PRESETS[name]).init_weights(0, std=0.3).to(device)
    set_profile(model, "vllm-nvfp4")
    calibrate(model, [torch.randint(4, 64, (4, 12), generator=torch.Generator().manual_seed(9)).to(device)])
    return model


def _max_delta(a, b) -> float:
    return max((abs(x - y) for ra, rb in zip(a.logprobs, b.logprobs) for x, y in zip(ra, rb)), default=0.0)


def _check_model(model, profile, graph, new_tokens):
    """Packed fast sampler == packed reference sampler: tokens and log-probs bitwise on CPU; on the GPU the graph
    == the eager fast path bitwise (same kernels) and the reference's tokens, as tests/test_fast_sampler.py's
    GPU test. vs the cached-bf16 fast sampler: rows with equal tokens counted, max |Δ log-prob| printed."""
    base = profile.removesuffix("-packed")
    kw = dict(max_new_tokens=new_tokens, temperature=1.0, seed=7)
    r_fast = FastSampler(model, profile, graph=graph).generate(PROMPTS, **kw)
    r_ref = Sampler(model, profile).generate(PROMPTS, **kw)
    assert r_fast.response_ids == r_ref.response_ids
    if graph:
        r_eager = FastSampler(model, profile, graph=False).generate(PROMPTS, **kw)
        assert r_eager.response_ids == r_fast.response_ids and r_eager.logprobs == r_fast.logprobs
    else:
        assert r_fast.logprobs == r_ref.logprobs
    r_cached = FastSampler(model, base, graph=graph).generate(PROMPTS, **kw)
    same = [a == b for a, b in zip(r_fast.response_ids, r_cached.response_ids)]
    delta = _max_delta(r_fast, r_cached) if all(same) else None
    print(f"{profile} vs {base}: same tokens {sum(same)}/{len(same)} rows, max |Δ logprob| {delta}")
    assert delta is None or delta < 1e-2
    return delta


def _spy(monkeypatch) -> dict:
    """Counts the packed GEMM calls (the knob must route the model's NVFP4 GEMMs to them)."""
    calls = {"dense": 0, "grouped": 0}
    for key, name in (("dense", "decode_gemm"), ("grouped", "grouped_decode_gemm")):
        fn = getattr(dispatch, name)

        def counted(*a, _fn=fn, _key=key, **kw):
            calls[_key] += 1
            return _fn(*a, **kw)

        monkeypatch.setattr(dispatch, name, counted)
    return calls


@cpu_kernels
@pytest.mark.parametrize("model_name,profile", [("tiny-moe", "minite-packed"), ("tiny-dense", "vllm-nvfp4-packed"),
                                                ("tiny-moe", "vllm-marlin-w4a16-packed")])
def test_packed_sampler_equals_reference_sampler(model_name, profile, one_thread, monkeypatch):
    dispatch.set_backend("triton")  # the interpreter (conftest restores the backend); tiny: it is slow
    calls, model = _spy(monkeypatch), _model(model_name, DEV)
    _check_model(model, profile, False, 2)
    assert calls["dense"] > 0 and (calls["grouped"] > 0) == (model_name == "tiny-moe"), calls
    assert not FastSampler(model, profile, graph=False).step_host_syncs(PROMPTS)  # capturable: no host sync


def _check_group_decode(device):
    """q|k|v as one packed GEMM (nn.linear.group_decode) == the three member GEMMs, bitwise on few-bit inputs
    (exact sums: the split of K, which follows N, cannot show); None where it must not apply."""
    from minite_core.nn.linear import group_decode

    model = _model("tiny-dense", device)
    x = _few_bits(torch.randn(3, 5, model.config.hidden_size, generator=torch.Generator().manual_seed(2))).to(device)
    for profile in PACKED:
        set_profile(model, profile)
        group = model.model.layers[0].self_attn.q_proj.fused_group
        with torch.no_grad():
            got, want = group_decode(group, x), [m(x) for m in group]
        assert got is not None, profile
        for g, w, m in zip(got, want, group):
            assert g.shape == w.shape == (3, 5, m.out_features) and torch.equal(g, w), profile
        handle = group[1].register_forward_hook(lambda *a: None)  # a hook sees its member's own call
        with torch.no_grad():
            assert group_decode(group, x) is None, profile
        handle.remove()
    assert group_decode(group, x) is None  # grad mode, trainable weights: the members' autograd path
    set_profile(model, "minite")
    with torch.no_grad():
        assert group_decode(group, x) is None  # cached-bf16 decode: no packed GEMM to fuse


@cpu_kernels
def test_group_decode_equals_member_gemms(one_thread):
    dispatch.set_backend("triton")  # the interpreter (conftest restores the backend)
    _check_group_decode(DEV)


# ---- GPU (the H200) --------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("m", [1, 16, 64, 256])
def test_gpu_packed_gemm_equals_block_order_reference(m):
    _check_dense(m, 40, 96, "cuda")  # bitwise (exact sums)
    _check_dense(m, 4096, 4096, "cuda", exact=False)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
def test_gpu_group_decode_equals_member_gemms():
    _check_group_decode("cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
def test_gpu_grouped_packed_gemm():
    _check_grouped(96, "cuda")
    _check_grouped(2048, "cuda", exact=False)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("model_name", ["tiny-dense", "tiny-moe"])
@pytest.mark.parametrize("profile", PACKED)
def test_gpu_packed_sampler_graph(model_name, profile, monkeypatch):
    """CUDA-graph packed decode == the packed reference sampler; its distance to cached-bf16 is printed."""
    calls = _spy(monkeypatch)
    _check_model(_model(model_name, "cuda"), profile, True, 24)
    assert calls["dense"] > 0 and (calls["grouped"] > 0) == (model_name == "tiny-moe"), calls
