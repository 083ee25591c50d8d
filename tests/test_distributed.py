"""The data-parallel FSDP2 learner (engines.distributed) on CPU with gloo, against one process.

One policy-gradient learner step (`pg_step`) on the same global batch, R ranks (torch.multiprocessing spawn) vs.
the single-process reference, for bf16, te-nvfp4 and minite:
- per-token log-probs of every row: bitwise (the forward runs the same rows, and every NVFP4 operand's codes and
  scales equal the single-process ones thanks to the all-reduced amaxes);
- the loss (a sum of R partial sums): within fp32 rounding;
- gradients and AdamW's first moments: within GRAD_TOL of the dW dtype (a weight gradient is the sum of R
  partial GEMMs); the updated weights: bitwise those of one-process AdamW on the gathered gradients.
A control shows the amax reduction is what makes te-nvfp4 equal: without it the log-probs differ.
At world size 1 (bench.learner_dist's 1-GPU overhead check) the distributed step IS the plain step: bitwise
(log-probs, loss, gradients, weights over two steps) and with the plain step's host syncs, no more.
"""
from __future__ import annotations

import collections
import functools
import hashlib
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from minite_core.engines import distributed as D
from minite_core.engines import expert_parallel as EP
from minite_core.engines.expert_parallel import expert_params
from minite_core.engines.host_sync import HostSyncDetector
from minite_core.engines.learner import Learner
from minite_core.model import CausalLM, PRESETS
from minite_core.profiles import get_profile

WORLD = 2
ROOT = Path(__file__).resolve().parents[1]
# max |g_dp - g_ref| / max |g_ref| per tensor, vs. one process, by the dtype the parameter's dW is emitted in.
# A rank's dW is a GEMM (or reduction) over its tokens; the sum of R of them differs from one over all tokens by
# reassociation. fp32-emitted dW (the NVFP4 GEMMs, an fp32 LM head): fp32 rounding. bf16-emitted dW (every GEMM
# of the bf16 profile, the norm weights and a bf16 LM head / its tied embedding under every profile: DESIGN.md
# keeps them bf16): each partial is rounded to bf16 before the sum, a 2^-8 relative error of the partials, which
# can exceed their (cancelling) sum — measured up to 5.1e-3 of the max, bound 2^-6.
GRAD_TOL = {"float32": 1e-6, "bfloat16": 2 ** -6}


def _dw_dtype(name: str, profile: str) -> str:
    p = get_profile(profile)
    if "norm" in name or p.weight is None:
        return "bfloat16"
    if name.endswith("mlp.gate.weight"):  # the MoE router
        return p.router_dtype
    if name in ("lm_head.weight", "model.embed_tokens.weight"):  # tied in tiny-dense
        return p.lm_head_dtype
    return "float32"


LR = 1e-3


def _batch(N: int = 4, L: int = 24):
    """N rows of prompt + response, the longest exactly L tokens (N/R·L a multiple of 16), lengths varied."""
    g = torch.Generator().manual_seed(7)
    prompts, responses = [], []
    for i in range(N):
        p, r = 6 + i % 3, (L - 6 - i % 3) - 3 * (i % 2)
        ids = torch.randint(3, 64, (p + r,), generator=g).tolist()
        prompts.append(ids[:p])
        responses.append(ids[p:])
    adv = torch.tensor([1.0, -0.5, 0.25, -1.0][:N])
    return prompts, responses, adv


def _model(preset: str = "tiny-dense"):
    torch.manual_seed(0)
    return CausalLM(PRESETS[preset]).init_weights(seed=3)


def _snapshot(model, opt) -> dict:
    """Full (gathered) weights, grads and AdamW moments by parameter name (a collective on a sharded model)."""
    experts = expert_params(model)

    def whole(t, p):  # an expert-parallel rank's expert slice: gathered along the expert dim
        if p not in experts:
            return D.full(t).clone()
        parts = [torch.empty_like(t) for _ in range(torch.distributed.get_world_size())]
        torch.distributed.all_gather(parts, t.contiguous())
        return torch.cat(parts)

    out = {}
    for name, p in model.named_parameters():
        out[f"w/{name}"] = whole(p.detach(), p)
        out[f"g/{name}"] = whole(p.grad, p)
        out[f"m/{name}"] = whole(opt.state[p]["exp_avg"], p)
    return out


def _worker(rank, world, port, profile, reduce_amax, path, preset="tiny-dense"):
    torch.set_num_threads(1)
    dp = D.init(rank, world, init_method=f"tcp://127.0.0.1:{port}")
    if not reduce_amax:  # the control: every rank quantizes with its own amaxes
        dp = D.DataParallel(rank=dp.rank, world=dp.world, amax_group=dp.amax_group)
        object.__setattr__(dp, "reduce_max", lambda t: t)
    model = _model(preset)
    EP.install(model, rank, world)  # a no-op without MoE layers
    model = D.shard_model(model)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    learner = Learner(model, profile, seed=11)
    learner.set_step(0)
    prompts, responses, adv = _batch()
    with HostSyncDetector() as detector:
        out = D.pg_step(learner, opt, prompts, responses, adv, dp=dp)
    ep_syncs = [(s.op, s.where) for s in detector.syncs if "expert_parallel" in s.where]
    snap = _snapshot(model, opt)
    torch.save({"loss": out.loss, "logp": out.logp, "mask": out.mask, "ep_syncs": ep_syncs,
                **(snap if rank == 0 else {})}, f"{path}.{rank}")
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(tmp_path, profile, reduce_amax=True, preset="tiny-dense") -> list[dict]:
    path = str(tmp_path / "rank")
    mp.spawn(_worker, args=(WORLD, _free_port(), profile, reduce_amax, path, preset), nprocs=WORLD, join=True)
    return [torch.load(f"{path}.{r}") for r in range(WORLD)]


def _reference(profile, preset="tiny-dense", L=24):
    model = _model(preset)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    learner = Learner(model, profile, seed=11)
    learner.set_step(0)
    prompts, responses, adv = _batch(L=L)
    out = D.pg_step(learner, opt, prompts, responses, adv)
    return out, _snapshot(model, opt)


def _masked(logp, mask):
    return torch.where(mask, logp, torch.zeros_like(logp))


@pytest.mark.parametrize("preset, profile", [("tiny-dense", "bf16"), ("tiny-dense", "te-nvfp4"),
                                             ("tiny-dense", "minite"), ("tiny-moe", "bf16"),
                                             ("tiny-moe", "te-nvfp4"), ("tiny-moe", "minite")])
def test_data_parallel_step_equals_one_process(tmp_path, one_thread, preset, profile):
    """tiny-moe runs its experts expert-parallel (engines.expert_parallel): 4 experts, 2 a rank."""
    ranks = _run_ranks(tmp_path, profile, preset=preset)
    _check_equal(ranks, *_reference(profile, preset), profile, preset)
    n_moe = sum(PRESETS[preset].is_moe_layer(i) for i in range(PRESETS[preset].num_hidden_layers))
    for got in ranks:  # expert parallelism's one deliberate host sync a MoE layer: the split sizes
        assert [op for op, _ in got["ep_syncs"]] == ["tolist"] * n_moe


def _check_equal(ranks, ref, snap_ref, profile, preset):
    """The rank outputs (rank 0 with the gathered snapshot) against the single-process step (module docstring)."""
    n = ref.logp.shape[0] // len(ranks)
    for r, got in enumerate(ranks):  # per-token log-probs: bitwise, row for row
        T = got["logp"].shape[1]
        rows = slice(r * n, (r + 1) * n)
        assert torch.equal(got["mask"], ref.mask[rows, :T]) and not ref.mask[rows, T:].any()
        torch.testing.assert_close(_masked(got["logp"], got["mask"]), _masked(ref.logp[rows, :T], got["mask"]),
                                   rtol=0, atol=0)
    torch.testing.assert_close(sum(g["loss"] for g in ranks), ref.loss, rtol=1e-6, atol=1e-7)
    snap = ranks[0]
    assert set(k for k in snap if "/" in k) == set(snap_ref)
    worst = {}
    for key in (k for k in snap_ref if not k.startswith("w/")):  # gradients, and exp_avg = (1 - beta1)·g
        scale = snap_ref[key].abs().amax().clamp(min=1e-30)
        worst[key] = float((snap[key] - snap_ref[key]).abs().amax() / scale)
    bad = {k: v for k, v in worst.items() if v > GRAD_TOL[_dw_dtype(k[2:], profile)]}
    assert not bad, f"max |g_dp - g_ref| / max |g_ref| above GRAD_TOL: {bad}"
    # an expert's gradient is one GEMM on its owner over the same rows as in one process: bitwise
    experts = [k for k in snap_ref if k.startswith("g/") and ".experts." in k]
    assert bool(experts) == (preset == "tiny-moe")
    for key in experts:
        torch.testing.assert_close(snap[key], snap_ref[key], rtol=0, atol=0, msg=lambda m: f"{key}: {m}")
    # the sharded AdamW is the single-process AdamW on the (gathered) gradients, bit for bit. (The updated
    # weights are not compared to the reference's within a tolerance: at step 1 Adam's update is
    # lr·g/(|g| + eps), which turns an fp32-level gradient difference into up to lr where |g| is near eps.)
    model = _model(preset)
    for name, p in model.named_parameters():
        p.grad = snap[f"g/{name}"].clone()
    torch.optim.AdamW(model.parameters(), lr=LR).step()
    for name, p in model.named_parameters():
        torch.testing.assert_close(snap[f"w/{name}"], p.detach(), rtol=0, atol=0, msg=lambda m: f"w/{name}: {m}")


def test_without_amax_reduction_te_nvfp4_differs(tmp_path, one_thread):
    """The control: each rank quantizing with its own per-tensor amaxes changes te-nvfp4's log-probs."""
    ranks = _run_ranks(tmp_path, "te-nvfp4", reduce_amax=False)
    ref, _ = _reference("te-nvfp4")
    n = ref.logp.shape[0] // WORLD
    diffs = [not torch.equal(_masked(g["logp"], g["mask"]),
                             _masked(ref.logp[r * n:(r + 1) * n, :g["logp"].shape[1]], g["mask"]))
             for r, g in enumerate(ranks)]
    assert any(diffs)


def test_rows_must_split_and_tokens_align():
    dp = D.DataParallel(rank=0, world=2, amax_group=None)
    with pytest.raises(ValueError, match="does not split over 2 ranks"):
        dp.rows(3)
    assert dp.rows(4) == slice(0, 2)


def _resume_worker(rank, world, port, profile, ckpt, mode, path):
    """mode "straight": steps 0 and 1, checkpoint after step 0; "resume": load that checkpoint, step 1."""
    from minite_core.runs.sharded_state import load_sharded, save_sharded

    torch.set_num_threads(1)
    dp = D.init(rank, world, init_method=f"tcp://127.0.0.1:{port}")
    model = D.shard_model(_model())
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    learner = Learner(model, profile, seed=11)
    prompts, responses, adv = _batch()
    if mode == "straight":
        learner.set_step(0)
        D.pg_step(learner, opt, prompts, responses, adv, dp=dp)
        save_sharded(ckpt, step=1, model=model, optimizer=opt, config={"profile": profile})
    else:
        assert load_sharded(ckpt, model=model, optimizer=opt, config={"profile": profile}) == 1
    learner.set_step(1)
    D.pg_step(learner, opt, prompts, responses, -adv, dp=dp)
    snap = _snapshot(model, opt)
    if rank == 0:
        torch.save(snap, path)
    torch.distributed.destroy_process_group()


_TORCHRUN_SCRIPT = """
import sys
import torch
from test_distributed import LR, _batch, _model, _snapshot
from minite_core.engines import distributed as D
from minite_core.engines.learner import Learner

torch.set_num_threads(1)
dp = D.init_from_env()
model = D.shard_model(_model())
opt = torch.optim.AdamW(model.parameters(), lr=LR)
learner = Learner(model, "minite", seed=11)
learner.set_step(0)
prompts, responses, adv = _batch(L=32)
out = D.pg_step(learner, opt, prompts, responses, adv, dp=dp)
snap = _snapshot(model, opt)
torch.save({"loss": out.loss, "logp": out.logp, "mask": out.mask, **(snap if dp.rank == 0 else {})},
           f"{sys.argv[1]}.{dp.rank}")
"""


def test_torchrun_four_ranks_equal_one_process(tmp_path, one_thread):
    """Launched as users launch it, `torchrun --nproc-per-node 4` (init_from_env), one row a rank: the same
    equality as the spawned 2-rank runs."""
    script = tmp_path / "step.py"
    script.write_text(_TORCHRUN_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), str(ROOT)]),
               OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                          str(script), str(tmp_path / "rank")], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    ranks = [torch.load(tmp_path / f"rank.{r}") for r in range(4)]
    _check_equal(ranks, *_reference("minite", L=32), "minite", "tiny-dense")


def test_init_from_env_outside_torchrun(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match="not launched by torchrun"):
        D.init_from_env()


def test_sharded_resume_is_exact(tmp_path, one_thread):
    """A sharded run checkpointed (DCP) after step 0 and resumed in fresh processes repeats step 1 bit for bit:
    weights, gradients and AdamW moments."""
    ckpt = tmp_path / "ckpt"
    snaps = []
    for mode in ("straight", "resume"):
        path = str(tmp_path / f"{mode}.pt")
        mp.spawn(_resume_worker, args=(WORLD, _free_port(), "minite", str(ckpt), mode, path), nprocs=WORLD)
        snaps.append(torch.load(path))
    straight, resumed = snaps
    assert set(straight) == set(resumed)
    for key in straight:
        torch.testing.assert_close(resumed[key], straight[key], rtol=0, atol=0, msg=lambda m: f"{key}: {m}")
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest", "step-1"]


def test_a_damaged_sharded_checkpoint_stops_every_rank_naming_the_file(tmp_path, one_thread):
    """One byte of one rank's shard changed after the save: the resume stops on every rank before loading, with
    DamagedState naming the file (the rank that hashed it) — no rank waits in DCP's collectives."""
    ckpt = tmp_path / "ckpt"
    mp.spawn(_resume_worker, args=(WORLD, _free_port(), "minite", str(ckpt), "straight", str(tmp_path / "s.pt")),
             nprocs=WORLD)
    shard = sorted((ckpt / "step-1").glob("*.distcp"))[-1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(Exception, match=rf"damaged: .*{shard.name} does not match the sha256"):
        mp.spawn(_resume_worker, args=(WORLD, _free_port(), "minite", str(ckpt), "resume", str(tmp_path / "r.pt")),
                 nprocs=WORLD)


def test_sharded_checkpoint_files_are_checked_before_loading(tmp_path):
    from minite_core.runs.sharded_state import verify_files
    from minite_core.runs.state import DamagedState

    (tmp_path / "a").write_bytes(b"weights")
    verify_files(tmp_path, {"a": hashlib.sha256(b"weights").hexdigest()})
    verify_files(tmp_path, None)  # a checkpoint written without checksums
    with pytest.raises(DamagedState, match=r"damaged: a does not match"):
        verify_files(tmp_path, {"a": hashlib.sha256(b"other").hexdigest()})
    with pytest.raises(DamagedState, match=r"damaged: b \(missing\)"):
        verify_files(tmp_path, {"b": "0" * 64})


def test_sharded_resume_refuses_a_missing_checkpoint(tmp_path):
    from minite_core.runs.sharded_state import load_sharded

    with pytest.raises(ValueError, match="no sharded checkpoint"):
        load_sharded(tmp_path, model=None, optimizer=None)


def test_sr_origin_draws_the_full_tensors_stream():
    """A shard quantized at its origin with the global amax has the full tensor's SR codes and scales (the
    property nn.shard relies on), and without the origin it does not."""
    from minite_core.formats.nvfp4 import quantize

    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(1))
    full_q = quantize(x, rounding="sr", seed=5)
    amax = x.abs().amax()
    part = quantize(x[32:], rounding="sr", seed=5, amax=amax, sr_origin=(32, 0))
    assert torch.equal(part.data, full_q.data[32:]) and torch.equal(part.scale.view(torch.uint8),
                                                                    full_q.scale[32:].view(torch.uint8))
    cols = quantize(x[:, 16:], rounding="sr", seed=5, amax=amax, sr_origin=(0, 16))
    assert torch.equal(cols.data, full_q.data[:, 8:])
    assert not torch.equal(quantize(x[32:], rounding="sr", seed=5, amax=amax).data, full_q.data[32:])


# ---- world size 1: the distributed step is the plain step (bench.learner_dist's 1-GPU overhead check) -----------
def _world_one_steps(dp, profile: str, steps: int = 2, device: str = "cpu") -> list[dict]:
    """`steps` pg_steps of tiny-moe (dp=None: the plain model; else EP.install + shard_model on a group of one),
    each with its host syncs (engines.host_sync), log-probs, loss, and the weights and gradients after it."""
    from minite_core.nn import track_optimizer

    model = _model("tiny-moe").to(device)
    if dp is not None:
        EP.install(model, dp.rank, dp.world)
        model = D.shard_model(model)
    opt = torch.optim.AdamW(D.param_groups(model), lr=LR)  # the GPU's foreach step needs the groups
    track_optimizer(opt, model)  # as the bench and the RL learner: FSDP2's copy-in keeps weight._version
    learner = Learner(model, profile, seed=11)
    prompts, responses, adv = _batch()
    out = []
    for step in range(steps):
        learner.set_step(step)
        with HostSyncDetector() as detector:
            res = D.pg_step(learner, opt, prompts, responses, adv if step % 2 == 0 else -adv, dp=dp)
        out.append({"syncs": [(s.op, s.where) for s in detector.syncs], "logp": res.logp, "loss": res.loss,
                    **{f"w/{n}": D.full(p.detach()).clone() for n, p in model.named_parameters()},
                    **{f"g/{n}": D.full(p.grad).clone() for n, p in model.named_parameters()}})
    return out


def _world_one_worker(rank, world, port, profile, path, device):
    torch.set_num_threads(1)
    plain = _world_one_steps(None, profile, device=device)
    dp = D.init(rank, world, backend="nccl" if device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}")
    torch.save({"plain": plain, "dist": _world_one_steps(dp, profile, device=device)}, path)
    torch.distributed.destroy_process_group()


@functools.lru_cache(maxsize=None)
def _world_one(profile: str, device: str = "cpu") -> dict:
    """One spawned process (a group of one: gloo, or NCCL on a GPU) per profile, shared by the tests below."""
    path = os.path.join(tempfile.mkdtemp(prefix="world1-"), "steps.pt")
    mp.spawn(_world_one_worker, args=(1, _free_port(), profile, path, device), nprocs=1, join=True)
    return torch.load(path, map_location="cpu")


@pytest.mark.parametrize("profile", ["bf16", "te-nvfp4", "minite"])
def test_world_one_step_equals_plain_bitwise(one_thread, profile):
    """At world size 1 (FSDP2 on, experts "expert-parallel" over one rank) two learner steps equal the plain
    single-process steps bit for bit: log-probs, loss, every gradient and every updated weight."""
    run = _world_one(profile)
    for step, (ref, sut) in enumerate(zip(run["plain"], run["dist"])):
        assert set(ref) == set(sut)
        for key in (k for k in ref if k != "syncs"):
            torch.testing.assert_close(sut[key], ref[key], rtol=0, atol=0, msg=lambda m: f"step {step} {key}: {m}")


@pytest.mark.parametrize("profile", ["bf16", "minite"])
def test_world_one_step_has_the_plain_steps_host_syncs(one_thread, profile):
    """A world-size-1 step makes exactly the plain step's host syncs (same ops, same call sites): no split-size
    read, bincount or repeat_interleave of expert parallelism, nothing from the token shard or FSDP2. (On CPU the
    plain step's own are the foreach AdamW's step.item() — fused on CUDA — the batch's host-to-device copies and
    the reference grouped GEMM's segment bounds.) The process's very first step also builds process-wide tables
    (formats.e2m1's code values): the plain step runs first, so from step 1 on the two are equal, and before it the
    distributed step makes no sync that the plain one does not."""
    run = _world_one(profile)
    for step, (ref, sut) in enumerate(zip(run["plain"], run["dist"])):
        extra = collections.Counter(sut["syncs"]) - collections.Counter(ref["syncs"])
        assert not extra, f"step {step}: host syncs the plain step does not make: {dict(extra)}"
        if step:
            assert sorted(sut["syncs"]) == sorted(ref["syncs"])
        assert not [s for s in sut["syncs"] if "expert_parallel" in s[1] or "shard" in s[1]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("profile", ["bf16", "te-nvfp4", "minite"])
def test_world_one_step_on_gpu_equals_plain(profile):
    """The same on the GPU fast path (Triton quantizers and grouped GEMMs, NCCL group of one): the first step's
    log-probs and loss bit for bit (a forward is deterministic; later steps inherit the backward's kernels, whose
    order may not be), and no host sync the plain step does not make, in any step."""
    run = _world_one(profile, "cuda")
    ref, sut = run["plain"][0], run["dist"][0]
    for key in ("logp", "loss"):
        torch.testing.assert_close(sut[key], ref[key], rtol=0, atol=0, msg=lambda m: f"{key}: {m}")
    for step, (ref, sut) in enumerate(zip(run["plain"], run["dist"])):
        extra = collections.Counter(sut["syncs"]) - collections.Counter(ref["syncs"])
        assert not extra, f"step {step}: host syncs the plain step does not make: {dict(extra)}"
