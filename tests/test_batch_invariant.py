"""minite-onpolicy: batch-invariant kernels, and learner log-probs bitwise equal to the sampler's.

CPU: the Triton kernels run in the interpreter (conftest), on tiny shapes. The invariance contract tested here:
a row's output bits do not depend on the other rows of the call (GEMMs), nor on where its keys sit in the cache,
how many slots the cache has or how many queries share the call (attention). The kernels agree with their plain
references to fp32 rounding (the summation orders differ). GPU tests (`-m gpu`, the H200): the same per-op
checks at learner / decode sizes, and the end-to-end bitwise check on a random model of the RL shape with
64 prompts x 128 tokens through the CUDA-graph sampler.
"""
from __future__ import annotations

import pytest
import torch

from minite_core.engines import Learner, make_sampler
from minite_core.engines.mismatch import mismatch_metrics
from minite_core.kernels import dispatch
from minite_core.kernels.reference import attention_reference
from minite_core.model import PRESETS, CausalLM, ModelConfig, set_profile
from minite_core.nn import linear
from minite_core.formats.bf16x3 import split3
from minite_core.nn.fp32_split import mm_split
from minite_core.profiles import get_profile

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
ACT = get_profile("minite-onpolicy").activation


def _randn(*shape, seed=0, dtype=torch.float32, device=DEV):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device, dtype)


# ---- kernels (interpreter on CPU, compiled on the GPU) -------------------------------------------------------
def _w4a4_rows(x, w, rows):
    _, wd = dispatch.quantize_dq(w, ACT, backend="triton")
    _, xd = dispatch.quantize_dq(x[rows], ACT, backend="triton")
    return dispatch.gemm(xd, wd, torch.bfloat16, invariant=True, backend="triton")


def test_invariant_w4a4_gemm_rows_do_not_depend_on_batch_mates():
    x, w = _randn(40, 64, seed=1), _randn(48, 64, seed=2)
    full = _w4a4_rows(x, w, slice(None))
    for rows in (slice(3, 7), slice(5, 6), slice(1, 40)):
        assert torch.equal(_w4a4_rows(x, w, rows), full[rows]), rows
    ref = dispatch.gemm(*(dispatch.quantize(t, ACT, backend="reference") for t in (x, w)), torch.float32,
                        backend="reference")
    assert torch.allclose(full.float(), ref, rtol=1e-2, atol=1e-2)  # bf16 output vs the fp32 reference


def test_invariant_fp32_split_rows_do_not_depend_on_batch_mates():
    """The fp32 LM head / router pieces through the fixed-tile GEMM: rows bitwise across M, and equal to the fp32
    GEMM to fp32 rounding (the pieces are exact; only the summation order differs)."""
    x, w = _randn(40, 48, seed=3), _randn(32, 48, seed=4)
    wp = split3(w)
    with dispatch.using_backend("triton"):
        full = mm_split(split3(x), wp, invariant=True)
        for rows in (slice(3, 7), slice(5, 6), slice(1, 40)):
            assert torch.equal(mm_split(split3(x[rows]), wp, invariant=True), full[rows]), rows
    ref = x.double() @ w.double().t()
    assert (full.double() - ref).abs().max() <= 1e-5 * ref.abs().max()


def _layouts(B=2, H=2, Hkv=1, T=37, Dh=16, pad=5, S=64, seed=5):
    """The same sequences as the learner sees them (causal, from slot 0) and as the sampler's cache holds them
    (left pad `pad`, S slots, stale junk in the unused slots)."""
    q, k, v = (_randn(B, h, T, Dh, seed=seed + i, dtype=torch.bfloat16) for i, h in enumerate((H, Hkv, Hkv)))
    kc, vc = (_randn(B, Hkv, S, Dh, seed=seed + 9 + i, dtype=torch.bfloat16) for i in range(2))  # junk slots
    kc[:, :, pad:pad + T], vc[:, :, pad:pad + T] = k, v
    t_idx, s_idx = torch.arange(T)[:, None], torch.arange(S)[None, :]
    prefill = ((s_idx >= pad) & (s_idx <= pad + t_idx))[None, None].expand(B, 1, T, S).to(q.device)
    return q, k, v, kc, vc, prefill


@pytest.mark.parametrize("kernel", ["row", "tile"])
def test_attention_same_bits_for_learner_prefill_and_decode(kernel):
    from functools import partial

    from minite_core.kernels.attention import attention_triton

    attention_triton = partial(attention_triton, kernel=kernel)
    q, k, v, kc, vc, prefill = _layouts()
    learner = attention_triton(q, k, v, None)  # causal, keys from slot 0
    assert torch.equal(attention_triton(q, kc, vc, prefill), learner)  # left-padded prefill, longer cache
    for t in (0, 31, 32, 36):  # decode: one query over the cache, block edges included
        dec = attention_triton(q[:, :, t:t + 1], kc, vc, prefill[:, :, t:t + 1])
        assert torch.equal(dec[:, :, 0], learner[:, :, t]), t
    assert torch.equal(attention_triton(q[:1], k[:1], v[:1], None), learner[:1])  # batch-mates
    ref = attention_reference(q, k, v, None)
    assert (learner.float() - ref).abs().max() <= 2 ** -7 * ref.abs().max()  # one bf16 rounding of the output


# the kernels' fp32 result (out_dtype=float32) vs the fp64 reference, relative to the row's largest output: fp32
# accumulation order (measured on CPU: 3e-7 at max |ref| 2.4, i.e. 2^-23), plus on the GPU ex2.approx (~2^-22
# relative) and div.full (2 ulp); bound 2^-18 (a real bug is ~2^-8 or worse)
ATTN_TOL_FP32 = 2 ** -18


def _check_attention_rows(kernel, B=3, H=4, Hkv=2, T=64, Dh=16, S=96, lens=(37, 64, 1), decode=None, seed=11):
    """The model's own masks (CausalLM._mask / _cached_mask): a learner call (T queries, right padding: mask None
    and the padded key mask), a left-padded prefill into an S-slot cache whose unwritten slots hold NaN, decode
    calls (T = 1) at every cache length in `decode` (None: all) in the full and in a tight cache, one batch row
    alone, a prefill chunk that shifts every row's place in its tile, and a fully masked query row. Each real
    query row has the same fp32 bits in all of them (so the same bf16 bits: the output is their one RNE rounding);
    the learner agrees with the fp64 reference within ATTN_TOL_FP32."""
    from minite_core.kernels.attention import attention_triton

    def att(*a):  # fp32 before the output rounding: every change of a row's reduction order shows
        return attention_triton(*a, kernel=kernel, out_dtype=torch.float32)

    q, k, v = (_randn(B, h, T, Dh, seed=seed + i, dtype=torch.bfloat16) for i, h in enumerate((H, Hkv, Hkv)))
    real = torch.arange(T, device=DEV)[None] < torch.tensor(lens, device=DEV)[:, None]  # (B, T) right padding
    learner = att(q, k, v, None)  # (B, H, T, Dh)
    padded = att(q, k, v, CausalLM._mask(real, B, T, DEV))
    assert torch.equal(attention_triton(q, k, v, None, kernel=kernel), learner.bfloat16())  # one RNE rounding
    ref = attention_reference(q.double(), k.double(), v.double(), None)
    for b, n in enumerate(lens):
        assert torch.equal(padded[b, :, :n], learner[b, :, :n]), b
        err = (learner[b, :, :n].double() - ref[b, :, :n]).abs().amax(-1)  # (H, n)
        assert (err <= ATTN_TOL_FP32 * ref[b, :, :n].abs().amax(-1)).all(), (b, float(err.max()))
    # the sampler's cache: row b's token j at slot pad_b + j (left padding), pads before, NaN in unwritten slots
    pads = [T - n for n in lens]
    qc, kc, vc = (_randn(B, h, S, Dh, seed=seed + 5 + i, dtype=torch.bfloat16) for i, h in enumerate((H, Hkv, Hkv)))
    kc[:, :, T:], vc[:, :, T:] = float("nan"), float("nan")
    for b, p in enumerate(pads):
        for dst, src in ((qc, q), (kc, k), (vc, v)):
            dst[b, :, p:T] = src[b, :, :T - p]
    slot = torch.arange(S, device=DEV)
    valid = (slot[None] >= torch.tensor(pads, device=DEV)[:, None]) & (slot[None] < T)  # (B, S)
    mask = CausalLM._cached_mask(valid, slot[:T])  # (B, 1, T, S)
    prefill = att(qc[:, :, :T], kc, vc, mask)

    def same(out, t_lo, what):  # out (B, H, T', Dh) holds queries t_lo.. of the prefill
        for b, p in enumerate(pads):
            lo = max(p, t_lo)
            got, want = out[b, :, lo - t_lo:T - t_lo], learner[b, :, lo - p:T - p]
            assert torch.equal(got, want), (what, b, float((got.float() - want.float()).abs().max()))

    same(prefill, 0, "prefill")
    alone = att(qc[1:2, :, :T], kc[1:2], vc[1:2], mask[1:2])
    assert torch.equal(alone, prefill[1:2]), "batch of one"
    same(att(qc[:, :, 5:T], kc, vc, mask[:, :, 5:]), 5, "prefill chunk from query 5")
    holed = mask.clone()
    holed[0, 0, T - 3] = False  # a fully masked query row among real ones
    out = att(qc[:, :, :T], kc, vc, holed)
    assert out[0, :, T - 3].isnan().all()  # as the reference's (softmax over no keys)
    assert attention_reference(qc[:, :, :T], kc, vc, holed)[0, :, T - 3].isnan().all()
    out[0, :, T - 3] = prefill[0, :, T - 3]
    assert torch.equal(out, prefill), "a fully masked tile-mate"
    for t in range(T) if decode is None else decode:  # decode: one query at slot t over the cache so far
        vt = valid & (slot[None] <= t)
        dec = att(qc[:, :, t:t + 1], kc, vc, CausalLM._cached_mask(vt, slot[t:t + 1]))
        tight = att(qc[:, :, t:t + 1], kc[:, :, :t + 1], vc[:, :, :t + 1],
                    CausalLM._cached_mask(vt[:, :t + 1], slot[t:t + 1]))
        for b, p in enumerate(pads):
            if t >= p:
                assert torch.equal(dec[b, :, 0], prefill[b, :, t]) and torch.equal(tight[b, :, 0], dec[b, :, 0]), (b, t)


@pytest.mark.parametrize("kernel", ["tile", "tile-bf16x3"])
def test_attention_rows_same_bits_across_calls_tiled(kernel):
    """Two tiles of 64 queries; pads 63, 5, 99, so tiles hold padded and real queries together (pad 5: 59 real
    rows whose blocks start at slot 5, not 0); decode at block and tile edges and at each row's first real slot."""
    _check_attention_rows(kernel, T=100, S=140, lens=(37, 95, 1), decode=(0, 4, 5, 36, 37, 63, 64, 68, 69, 98, 99))


def test_attention_rows_same_bits_across_calls_per_query():
    """The same checks hold for the per-query kernel (verified bitwise on the H200), smaller: its interpreter
    run costs a program per query."""
    _check_attention_rows("row", B=2, H=2, Hkv=1, T=40, S=56, lens=(37, 40), decode=(0, 2, 3, 34, 35, 39))


def test_attention_kernel_choice_is_checked():
    from minite_core.kernels.attention import DEFAULT_KERNEL, attention_kernel, attention_triton

    q = _randn(1, 1, 2, 16)
    assert attention_kernel() == DEFAULT_KERNEL == "tile-bf16x3" == get_profile("minite-onpolicy").attention_kernel
    with pytest.raises(ValueError, match=r"unknown attention kernel 'tiled'"):
        attention_triton(q, q, q, None, kernel="tiled")
    with pytest.raises(ValueError, match=r"attention_kernel='tiled' is not one of"):
        get_profile("minite-onpolicy").replace(attention_kernel="tiled")
    with pytest.raises(ValueError, match="tile attention takes"):  # fp32: its q·kᵀ would be TF32
        attention_triton(q, q, q, None, kernel="tile")


def test_attention_backward_is_the_reference_gradient():
    q, k, v, *_ = _layouts(T=9)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    dispatch.attention(*leaves, None, backend="triton").float().pow(2).sum().backward()
    ref_leaves = [t.float().clone().requires_grad_() for t in (q, k, v)]
    attention_reference(*ref_leaves, None).pow(2).sum().backward()
    for a, b in zip(leaves, ref_leaves):
        assert torch.allclose(a.grad.float(), b.grad, rtol=2e-2, atol=2e-2)


def test_profile_checks_what_batch_invariance_needs():
    base = get_profile("minite-onpolicy")
    assert base.batch_invariant and base.activation.scale_mode == "row" and base.attention_dtype == "float32"
    with pytest.raises(ValueError, match="per-token"):
        base.replace(name="x", **{"activation.scale_mode": "tensor"})
    with pytest.raises(ValueError, match="boundary_layers"):
        base.replace(name="x", boundary_layers=(1, 0))
    with pytest.raises(ValueError, match="attention_dtype"):
        base.replace(name="x", attention_dtype=None)


# ---- end to end: learner == sampler, bitwise -----------------------------------------------------------------
def _onpolicy_rollout(model, prompts, max_new, engine, profile="minite-onpolicy"):
    roll = make_sampler(model, profile, engine=engine).generate(prompts, max_new_tokens=max_new, temperature=1.0,
                                                                stop_ids=(), seed=3)
    with torch.no_grad():
        logp, _, mask = Learner(model, profile).logprobs(roll.prompt_ids, roll.response_ids)
    return logp, roll.padded(device=logp.device)["logprobs"], mask


def _assert_bitwise(logp, sampler_logp, mask):
    m = mismatch_metrics(logp, sampler_logp, mask)
    assert m["mismatch/k3"] == 0.0 and m["mismatch/max_abs_delta"] == 0.0, m
    assert torch.equal(logp[mask], sampler_logp[mask])


@pytest.mark.parametrize("kernel", ["row", "tile", "tile-bf16x3"])
def test_onpolicy_learner_equals_fast_sampler_triton(kernel):
    """Triton kernels (interpreter): fast sampler (left-padded prefill + cached decode) vs the learner's
    right-padded full-sequence forward, an MoE and a dense layer, prompts of different lengths; then one
    backward through the same kernels. Each attention kernel (Profile.attention_kernel), shared by both engines."""
    profile = get_profile("minite-onpolicy").replace(attention_kernel=kernel)
    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                      num_experts=4, num_experts_per_tok=2, mlp_only_layers=(1,), rope_theta=10000.0,
                      max_position_embeddings=64, bos_token_id=None, eos_token_id=None)
    model = CausalLM(cfg).init_weights(0, std=0.3)
    with dispatch.using_backend("triton"):
        logp, sampler_logp, mask = _onpolicy_rollout(model, [[1, 5, 6, 7, 9], [1, 8]], 3, "fast-eager", profile)
        _assert_bitwise(logp, sampler_logp, mask)
        # training still works: the backward runs through the recomputed references (attention, RMSNorm)
        ids = [[1, 5, 6, 7, 9], [1, 8]]
        logp_new, _, m = Learner(model, profile).logprobs(ids, [[3, 4], [5]], grad=True)
        (-(logp_new * m).sum()).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("engine", ["reference", "fast-eager"])
def test_onpolicy_learner_equals_sampler_reference_kernels(one_thread, engine):
    """Reference backend (plain torch on CPU, the smoke path): its GEMMs and attention sum in fp64 under the
    profile, because CPU BLAS / SDPA block by shape (minite-fp32attn's fp32 ops differ by ~5e-7 for some padded
    lengths). Several response lengths, so the learner's padded length L and the cache size vary."""
    model = CausalLM(PRESETS["tiny-moe"]).init_weights(0, std=0.3)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 64, (int(n),), generator=g).tolist() for n in torch.randint(2, 9, (8,), generator=g)]
    with dispatch.using_backend("reference"):
        for max_new in (2, 3, 7, 16):
            _assert_bitwise(*_onpolicy_rollout(model, prompts, max_new, engine))


# ---- GPU (the H200) ------------------------------------------------------------------------------------------
M_DECODE, M_LEARNER = 64, 4096
# the 13 M RL model (model/config.py qwen3-moe-13m): 4 layers of 256, 8 heads / 2 kv heads of 32, 32 experts top-4
RL_SHAPE = ModelConfig(vocab_size=64, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                       num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                       num_experts=32, num_experts_per_tok=4, rope_theta=10000.0, max_position_embeddings=512,
                       bos_token_id=None, eos_token_id=None)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("role", ["linear", "lm_head", "router"])
def test_gpu_onpolicy_dense_gemm_rows_batch_invariant(role):
    """W4A4 (fixed-tile Triton GEMM, not cuBLAS) and the fp32-split LM head / router: a decode-sized call's rows
    equal the same rows of a learner-sized call."""
    w = _randn(512, 256, seed=4)
    x = _randn(M_LEARNER, 256, seed=3, dtype=torch.float32 if role != "linear" else torch.bfloat16)
    fn = lambda v: linear(v, w, get_profile("minite-onpolicy"), role=role)  # noqa: E731
    with torch.no_grad():
        small, big = fn(x[:M_DECODE]), fn(x)[:M_DECODE]
    assert torch.equal(small, big), f"max |diff| {float((small.float() - big.float()).abs().max()):.3e}"


# every attention kernel (Profile.attention_kernel); the tiled ones failed these at 1f4f47b (a constexpr mask: two binaries)
GPU_KERNELS = ["row", "tile", "tile-bf16x3"]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("kernel", GPU_KERNELS)
def test_gpu_onpolicy_attention_learner_prefill_decode(kernel):
    """RL sizes: 64 rows x 8 heads, 160 positions, left pad 23 in a 320-slot cache."""
    from functools import partial

    from minite_core.kernels.attention import attention_triton

    attention_triton = partial(attention_triton, kernel=kernel)
    q, k, v, kc, vc, prefill = _layouts(B=64, H=8, Hkv=2, T=160, Dh=32, pad=23, S=320)
    learner = attention_triton(q, k, v, None)
    assert torch.equal(attention_triton(q, kc, vc, prefill), learner)
    for t in (0, 31, 32, 100, 159):
        assert torch.equal(attention_triton(q[:, :, t:t + 1], kc, vc, prefill[:, :, t:t + 1])[:, :, 0],
                           learner[:, :, t]), t


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("kernel", GPU_KERNELS)
def test_gpu_attention_rows_same_bits_across_calls(kernel):
    """The CPU test's checks, compiled, at Qwen3-30B-A3B's attention shape (32 / 4 heads of 128): 300 queries
    (5 tiles), pads 163, 0, 299, 37; decode at every cache length."""
    _check_attention_rows(kernel, B=4, H=32, Hkv=4, T=300, Dh=128, S=384, lens=(137, 300, 1, 263))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("kernel", ["tile", "tile-bf16x3"])
def test_gpu_attention_tiled_one_binary_for_every_call(kernel):
    """The invariance argument needs the learner's unmasked call, a masked prefill and a decode call (T = 1) to
    run one compiled binary: after the first call, none of the others compiles another."""
    from minite_core.kernels.attention import _attention_tile_kernel, attention_triton

    q, k, v, kc, vc, prefill = _layouts(B=2, H=4, Hkv=2, T=70, Dh=32, pad=9, S=128, seed=21)
    attention_triton(q, k, v, None, kernel=kernel)
    cache = _attention_tile_kernel.device_caches[torch.cuda.current_device()][0]
    n = len(cache)
    attention_triton(q, kc, vc, prefill, kernel=kernel)
    attention_triton(q[:, :, 5:6], kc, vc, prefill[:, :, 5:6], kernel=kernel)
    attention_triton(q[:1, :, :3], k[:1, :, :3], v[:1, :, :3], None, kernel=kernel)
    odd = torch.empty(q.numel() + 1, dtype=q.dtype, device=q.device)[1:].view_as(q).copy_(q)  # 2-byte offset
    assert torch.equal(attention_triton(odd, k, v, None, kernel=kernel), attention_triton(q, k, v, None, kernel=kernel))
    assert len(cache) == n, "a masked, decode, shorter or unaligned call compiled its own binary"


@pytest.mark.gpu
@pytest.mark.timing
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
def test_gpu_attention_tiled_faster_than_per_query(capsys):
    """The learner's attention forward at the bench shape (16,384 tokens as 8 x 2048, 32 / 4 heads of 128,
    causal): the tiled kernels must beat the per-query one; flash SDPA printed beside them (not invariant)."""
    import torch.nn.functional as F
    from triton.testing import do_bench

    from minite_core.kernels.attention import attention_triton

    q, k, v = (_randn(8, h, 2048, 128, seed=i, dtype=torch.bfloat16) for i, h in enumerate((32, 4, 4)))
    ms = {kern: do_bench(lambda kern=kern: attention_triton(q, k, v, None, kernel=kern), warmup=5, rep=50)
          for kern in ("row", "tile", "tile-bf16x3")}
    ms["sdpa"] = do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    flop = 4 * 8 * 32 * 2048 * 2048 / 2 * 128  # causal: half of q·kᵀ and p·v
    with capsys.disabled():
        print("\n[attention] " + " ".join(f"{n} {t:.2f} ms ({flop / t / 1e9:.0f} TFLOP/s)" for n, t in ms.items())
              + "; speedup over row: " + ", ".join(f"{n} {ms['row'] / ms[n]:.1f}x" for n in ("tile", "tile-bf16x3")))
    assert ms["tile"] < ms["row"] and ms["tile-bf16x3"] < ms["row"], ms


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
def test_gpu_onpolicy_rmsnorm_rows_batch_invariant():
    from minite_core.model.qwen3_moe import RMSNorm

    norm = RMSNorm(256, 1e-6).cuda()
    norm.batch_invariant = True
    x = _randn(M_LEARNER, 256, seed=3, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(norm(x[:M_DECODE]), norm(x)[:M_DECODE])


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
def test_gpu_onpolicy_moe_layer_rows_batch_invariant():
    model = CausalLM(RL_SHAPE).init_weights(0, std=0.3).cuda()
    set_profile(model, "minite-onpolicy")
    moe = model.model.layers[0].mlp
    x = _randn(1, M_LEARNER, RL_SHAPE.hidden_size, seed=3, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(moe(x[:, :M_DECODE]), moe(x)[:, :M_DECODE])


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("kernel", GPU_KERNELS)
def test_gpu_onpolicy_learner_equals_sampler_rl_shape(capsys, kernel):
    """The issue's measurement: 64 prompts x 128 sampled tokens (no stop), CUDA-graph sampler vs the learner's
    full-sequence forward: max |Δ| = 0 and k3 = 0 exactly. minite's numbers printed beside it. Both attention
    kernels (Profile.attention_kernel), each shared by the learner and the sampler."""
    model = CausalLM(RL_SHAPE).init_weights(0, std=0.1).cuda()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 64, (int(n),), generator=g).tolist() for n in torch.randint(8, 40, (64,), generator=g)]
    for profile in ("minite", "minite-onpolicy"):
        logp, s, mask = _onpolicy_rollout(model, prompts, 128, "fast",
                                          get_profile(profile).replace(attention_kernel=kernel))
        m = mismatch_metrics(logp, s, mask)
        with capsys.disabled():
            print(f"\n[onpolicy] {profile} ({kernel} attention): tokens {int(mask.sum())} k3 {m['mismatch/k3']:.3e} "
                  f"max|d| {m['mismatch/max_abs_delta']:.3e}")
    assert int(mask.sum()) >= 64 * 128
    _assert_bitwise(logp, s, mask)


def test_rmsnorm_rows_do_not_depend_on_batch_mates():
    from minite_core.model.qwen3_moe import RMSNorm

    norm = RMSNorm(48, 1e-6)
    norm.weight.data = _randn(48, seed=7)
    norm.batch_invariant = True
    x, res = _randn(40, 48, seed=8, dtype=torch.bfloat16), _randn(40, 48, seed=9, dtype=torch.bfloat16)
    with dispatch.using_backend("triton"):
        for r in (None, res):
            full = norm(x, r)
            for rows in (slice(3, 7), slice(5, 6)):
                assert torch.equal(norm(x[rows], None if r is None else r[rows]), full[rows])
            ref = norm.reference(x, norm.weight, r)
            assert (full.float() - ref.float()).abs().max() <= 2 ** -7 * ref.float().abs().max()
        xg = x.float().requires_grad_()
        norm(xg.bfloat16(), res).float().sum().backward()
        assert norm.weight.grad is not None and torch.isfinite(xg.grad).all()
