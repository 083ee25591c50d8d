"""The one-launch MoE layout kernel (kernels/moe_layout.py) vs the torch layout (`nn.moe_layout.moe_layout_reference`):
every field bitwise (torch.equal, same dtype and shape), random and hand-made routings.

CPU: the kernel runs under TRITON_INTERPRET=1 (set here before triton is first imported, as tests/kernel_cases.py
does). GPU (`-m gpu`): the same cases compiled for CUDA, and `moe_layout` captured in a CUDA graph and replayed on
new routings.
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
CUDA = torch.cuda.is_available()
cpu_kernels = pytest.mark.skipif(not (INTERPRETED or CUDA),
                                 reason="triton imported before this module without TRITON_INTERPRET=1 and no GPU")

from minite_core.kernels import dispatch  # noqa: E402
from minite_core.kernels import moe_layout as K  # noqa: E402
from minite_core.nn import moe_layout as L  # noqa: E402

FIELDS = ("offs", "dest", "src", "row_expert", "row_local")


def _random(n, k, e, seed, skew=0.0):
    """(N, k) distinct experts per token, as a router's topk; skew > 0 piles tokens onto low experts (empties)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, e, generator=g) - skew * torch.arange(e, dtype=torch.float32)
    return logits.topk(k, dim=1).indices


def _cases():
    """(name, top_idx (N, k), E)."""
    yield "decode", _random(64, 2, 8, 0), 8
    yield "n1", _random(1, 8, 128, 1), 128
    yield "mid", _random(256, 4, 32, 2), 32
    yield "skewed-empties", _random(96, 2, 16, 3, skew=1.5), 16
    yield "e1", torch.zeros(7, 1, dtype=torch.int64), 1
    yield "all-to-first", torch.zeros(50, 1, dtype=torch.int64), 8  # last expert empty: spare rows
    yield "all-to-last", torch.full((64, 1), 7), 8
    yield "exactly-16", torch.arange(4).repeat_interleave(16).view(32, 2), 4  # every expert 16 assignments
    yield "one-expert-16", torch.full((16, 1), 2), 4
    yield "17-and-15", torch.tensor([0] * 17 + [2] * 15).view(-1, 1), 3
    yield "sparse", torch.tensor([[3, 0], [0, 3], [5, 3]]), 6
    yield "bound", _random(1024, 4, 256, 4), 256  # N·k = MAX_ASSIGN, E = MAX_EXPERTS


def _check(lay_sut, lay_ref, name):
    assert lay_sut.num_experts == lay_ref.num_experts
    for f in FIELDS:
        a, b = getattr(lay_sut, f), getattr(lay_ref, f)
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f"{name} {f}: {a.dtype} {a.shape} vs {b.dtype} {b.shape}"
        assert torch.equal(a.cpu(), b.cpu()), f"{name} {f}: {(a.cpu() != b.cpu()).sum().item()} entries differ"


def _check_cases(device):
    for name, top, e in _cases():
        top = top.to(device)
        fields, (live, ends, filler) = K.moe_layout_triton(top, e, L.padded_rows(*top.shape, e))
        ref = L.moe_layout_reference(top, e)
        _check(L.MoELayout(*fields, num_experts=e), ref, name)
        want = ((ref.dest.amax() // 16 + 1).reshape(1) * 16).cpu()  # the live_rows formula
        assert torch.equal(live.cpu(), want), f"{name}: live"
        assert torch.equal(ends.cpu(), torch.cat([ref.offs[1:-1].cpu(), want]).to(torch.int32)), f"{name}: live ends"
        assert torch.equal(filler.cpu(), torch.arange(ref.num_rows)[:, None] >= want), f"{name}: filler"


def test_align_matches_nn():
    assert K.ALIGN.value == L.ALIGN


@cpu_kernels
def test_layout_kernel_equals_reference():
    if CUDA:
        pytest.skip("CPU interpreter variant; see test_gpu_layout_kernel_equals_reference")
    _check_cases("cpu")


@cpu_kernels
def test_moe_layout_dispatch(monkeypatch):
    """Backend triton: small routings go through the kernel, a routing past the bound and the reference backend
    through the torch ops — equal either way."""
    calls = []
    real = K.moe_layout_triton
    monkeypatch.setattr(K, "moe_layout_triton", lambda *a: calls.append(a) or real(*a))
    dev = "cuda" if CUDA else "cpu"
    small, big = _random(64, 2, 8, 5).to(dev), _random(K.MAX_ASSIGN // 2 + 1, 2, 8, 6).to(dev)
    with dispatch.using_backend("triton"):
        _check(L.moe_layout(small, 8), L.moe_layout_reference(small, 8), "small")
        assert len(calls) == 1
        _check(L.moe_layout(big, 8), L.moe_layout_reference(big, 8), "past the bound")
        _check(L.moe_layout(small, K.MAX_EXPERTS + 1), L.moe_layout_reference(small, K.MAX_EXPERTS + 1), "many E")
        assert len(calls) == 1
    with dispatch.using_backend("reference"):
        L.moe_layout(small, 8)
    assert len(calls) == 1


def test_kernel_rejects_out_of_bound():
    with pytest.raises(ValueError, match="N\\*k=4098"):
        K.moe_layout_triton(torch.zeros(2049, 2, dtype=torch.int64), 8, L.padded_rows(2049, 2, 8))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
def test_gpu_layout_kernel_equals_reference():
    _check_cases("cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
def test_gpu_layout_in_cuda_graph():
    """`moe_layout` captured once (static shapes, no host sync), replayed on new routings: still the reference."""
    top = _random(64, 2, 8, 7).cuda()
    with dispatch.using_backend("triton"):
        L.moe_layout(top, 8)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            lay = L.moe_layout(top, 8)
    for seed in (8, 9):
        top.copy_(_random(64, 2, 8, seed, skew=seed - 8.0))
        graph.replay()
        _check(lay, L.moe_layout_reference(top, 8), f"replay {seed}")
        live = (L.moe_layout_reference(top, 8).dest.amax() // 16 + 1).reshape(1) * 16
        assert torch.equal(lay.live_outputs[0], live), f"replay {seed}: live"


@pytest.mark.parametrize("path", ["reference", "kernel"])
def test_live_rows_are_the_routed_rows_with_their_padding(path):
    """`MoELayout.live_rows` = sum_e round16(count_e) where the last expert's filler is most of Tp (decode), else
    None; `filler` marks the rows past it. The layout kernel writes both in its launch (`live_outputs`)."""
    if path == "kernel" and not INTERPRETED:
        pytest.skip("the kernel path on CPU needs TRITON_INTERPRET=1 (the GPU runs it in test_gpu_layout_in_cuda_graph)")
    for name, top, e in _cases():
        if path == "kernel":
            with dispatch.using_backend("triton"):
                lay = L.moe_layout(top, e)
            assert lay.live_outputs is not None, name
        else:
            lay = L.moe_layout_reference(top, e)
        counts = torch.bincount(top.reshape(-1), minlength=e)
        live, n_k = lay.live_rows(), top.numel()
        if 2 * n_k >= lay.num_rows:
            assert live is None and lay.filler() is None, name
            continue
        assert live.tolist() == [int(((counts + 15) // 16 * 16).sum())], name
        assert torch.equal(lay.filler()[:, 0], torch.arange(lay.num_rows) >= live), name
        assert (lay.src[live.item():] == top.shape[0]).all(), f"{name}: a routed row past live_rows"
    assert L.moe_layout_reference(_random(1, 8, 128, 1), 128).live_rows().item() == 128  # 8 experts x 16
