"""Fast sampler == reference sampler (bitwise on CPU), counter-based noise, static KV cache, host-sync checks;
GPU tests (`-m gpu`) for the CUDA-graph path."""
from __future__ import annotations

import math

import pytest
import torch

from minite_core.engines import FastSampler, Sampler, make_sampler
from minite_core.engines import sampler as ref_sampler
from minite_core.engines.host_sync import find_host_syncs
from minite_core.formats import philox
from minite_core.model import PRESETS, CausalLM, KVCache, set_profile
from minite_core.model.calibrate import calibrate
from minite_core.nn import clear_weight_caches
from minite_core.profiles import get_profile

CUDA = torch.cuda.is_available()
gpu = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")]
PROFILES = ["bf16", "minite", "vllm-nvfp4", "vllm-marlin-w4a16"]
# all-fp32 execution: CPU fp32 GEMM bits depend on M, so this one fails unless both samplers bucket-pad alike
FP32 = get_profile("bf16").replace(name="fp32", dtype="float32", router_dtype="float32", lm_head_dtype="float32")
# ragged lengths; 5 prompts run as a bucket of 8 rows (3 dummy rows), 3 as a bucket of 4
PROMPTS = [[1, 5, 6, 7], [1, 8, 9], [1, 10, 11, 12, 13, 14], [1, 20], [1, 33, 34, 35, 36]]
STOP = tuple(range(0, 64, 9))  # one token in nine stops a row: many rows stop early, some never
# (temperature, top_p)
SAMPLING = [(1.0, 1.0), (0.0, 1.0), (0.7, 0.8)]
# Python-level host syncs the decode step still performs on CPU (engines.host_sync), by (op, file): the
# reference grouped-expert path reads the MoE layout's segment bounds to the host (nn/experts.py: "reference:
# host loop over experts"); the GPU path (kernels: auto) has none. Dense decode steps have none.
KNOWN_STEP_SYNCS = {"tiny-dense": set(), "tiny-moe": {("tolist", "nn/moe_layout.py")}}


def _model(name: str) -> CausalLM:
    model = CausalLM(PRESETS[name]).init_weights(0 if name == "tiny-moe" else 1, std=0.3)
    set_profile(model, "vllm-nvfp4")  # static activation scales, from data that is not sampled
    calibrate(model, [torch.randint(4, 64, (4, 12), generator=torch.Generator().manual_seed(9))])
    return model


@pytest.fixture(scope="module")
def models(one_thread):
    return {name: _model(name) for name in ("tiny-moe", "tiny-dense")}


def _assert_same(r_ref, r_sut):
    assert r_sut.response_ids == r_ref.response_ids
    assert r_sut.logprobs == r_ref.logprobs  # Python floats of the fp32 values: bitwise
    assert r_sut.argmax_ids == r_ref.argmax_ids
    assert r_sut.finished == r_ref.finished


@pytest.mark.parametrize("profile", PROFILES + [FP32], ids=PROFILES + ["fp32"])
@pytest.mark.parametrize("model_name", ["tiny-moe", "tiny-dense"])
def test_fast_equals_reference_bitwise(models, model_name, profile):
    model, finished = models[model_name], []
    for temperature, top_p in SAMPLING:
        kw = dict(max_new_tokens=10, temperature=temperature, top_p=top_p, stop_ids=STOP, seed=11)
        r_ref = Sampler(model, profile).generate(PROMPTS, **kw)
        r_sut = FastSampler(model, profile, graph=False).generate(PROMPTS, **kw)
        _assert_same(r_ref, r_sut)
        finished += r_ref.finished
        chunked = dict(kw, batch_size=3)  # chunks of 3 (bucket 4) and 2 (bucket 2)
        _assert_same(Sampler(model, profile).generate(PROMPTS, **chunked),
                     FastSampler(model, profile, graph=False).generate(PROMPTS, **chunked))
    assert any(finished) and not all(finished)  # early stops and full-length rows both covered


@pytest.mark.parametrize("sync_every", [1, 4])
def test_logprob_rows_and_routes_as_the_reference(models, sync_every):
    """keep_logprob_rows / record_routes: the same per-row tensors as the reference (sync_every 4 runs decode
    steps past the last stop, which must not leak into the routes)."""
    model = models["tiny-moe"]
    kw = dict(max_new_tokens=8, top_p=0.8, seed=2, stop_ids=STOP, keep_logprob_rows=True, record_routes=True)
    r_ref = Sampler(model, "minite").generate(PROMPTS, **kw)
    r_sut = FastSampler(model, "minite", graph=False, sync_every=sync_every).generate(PROMPTS, **kw)
    _assert_same(r_ref, r_sut)
    assert any(r_ref.finished) and len(r_sut.logprob_rows) == len(r_sut.routes) == len(PROMPTS)
    for rows_ref, rows_sut, routes_ref, routes_sut, prompt, resp, lps in zip(
            r_ref.logprob_rows, r_sut.logprob_rows, r_ref.routes, r_sut.routes, PROMPTS, r_sut.response_ids,
            r_sut.logprobs):
        assert rows_sut.shape == (len(resp), model.config.vocab_size) and torch.equal(rows_ref, rows_sut)
        assert rows_sut.gather(1, torch.tensor(resp)[:, None])[:, 0].tolist() == lps
        assert routes_sut.dtype == routes_ref.dtype and torch.equal(routes_ref, routes_sut)
        assert routes_sut.shape[0] == len(prompt) + len(resp) and bool((routes_sut[:len(prompt)] >= 0).all())
    plain = FastSampler(models["tiny-dense"], "bf16", graph=False).generate(PROMPTS, max_new_tokens=2, seed=0,
                                                                           record_routes=True)
    assert plain.routes is None and plain.logprob_rows is None  # dense: nothing to route; rows not asked


@pytest.mark.parametrize("profile", ["bf16", "minite"])
def test_row_tokens_do_not_depend_on_batch_mates(models, profile):
    model = models["tiny-moe"]
    a = [[1, 10, 11, 12, 13, 14], [1, 5, 6], [1, 8, 9, 9], [1, 20]]
    b = [[1, 10, 11, 12, 13, 14], [1, 40, 41, 42], [1, 30], [1, 7, 7, 7, 7]]  # same row 0, same P, new mates
    fast = FastSampler(model, profile, graph=False)
    ra, rb = fast.generate(a, max_new_tokens=12, seed=5), fast.generate(b, max_new_tokens=12, seed=5)
    alone = fast.generate(a[:1], max_new_tokens=12, seed=5)  # no mates, no dummy rows: other shapes
    assert ra.response_ids[0] == rb.response_ids[0] == alone.response_ids[0]
    if profile == "bf16":  # bf16 GEMMs are M-independent on CPU: with the same layout even the bits agree
        assert ra.logprobs[0] == rb.logprobs[0]
    assert ra.response_ids[1:] != rb.response_ids[1:]


def test_sync_every_and_state_reuse(models):
    model = models["tiny-dense"]
    kw = dict(max_new_tokens=12, stop_ids=STOP, seed=1)
    r_ref = Sampler(model, "bf16").generate(PROMPTS, **kw)
    lazy = FastSampler(model, "bf16", graph=False, sync_every=5)  # runs up to 4 steps past the last stop
    _assert_same(r_ref, lazy.generate(PROMPTS, **kw))
    other = [[1, 2, 3], [1, 4], [1, 6, 7, 8, 9, 10], [1, 11], [1, 12, 13]]  # same state key: buffers reused
    _assert_same(Sampler(model, "bf16").generate(other, **kw), lazy.generate(other, **kw))
    _assert_same(r_ref, lazy.generate(PROMPTS, **kw))
    assert len(lazy._states) == 1


def test_bad_input_errors_as_the_reference(models):
    model = models["tiny-dense"]
    for sampler in (Sampler(model, "bf16"), FastSampler(model, "bf16", graph=False)):
        with pytest.raises(ValueError, match="max_new_tokens"):
            sampler.generate(PROMPTS, max_new_tokens=0, seed=0)
        with pytest.raises(ValueError, match="temperature"):
            sampler.generate(PROMPTS, max_new_tokens=2, temperature=-1.0, seed=0)
        with pytest.raises(ValueError, match="top_p"):
            sampler.generate(PROMPTS, max_new_tokens=2, top_p=0.0, seed=0)
        with pytest.raises(ValueError, match="at least one token"):
            sampler.generate([[1], []], max_new_tokens=2, seed=0)
    if not CUDA:
        with pytest.raises(ValueError, match="CUDA"):
            FastSampler(model, "bf16", graph=True)
    with pytest.raises(ValueError, match="sync_every"):
        FastSampler(model, "bf16", sync_every=0)
    with pytest.raises(ValueError, match="unknown sampler engine"):
        make_sampler(model, "bf16", engine="vllm")
    assert type(make_sampler(model, "bf16", engine="fast-eager")) is FastSampler
    assert type(make_sampler(model, "bf16", device="cpu")) is Sampler  # CPU default: the reference


def test_engine_choice_resolved_once_and_recorded(models, monkeypatch):
    """--sampler-engine (runs.cli) resolves into the command's execution (args.execution), which the command passes
    to make_sampler; $MINITE_SAMPLER decides only an "auto" option, and is recorded; every result's env records the
    engine; make_sampler itself reads no environment; unknown names fail naming the choices."""
    import argparse

    from minite_core import results
    from minite_core.runs.cli import add_common_args, apply_common_args
    from minite_core.runs.execution import SAMPLER_VAR

    monkeypatch.setenv(SAMPLER_VAR, "reference")
    monkeypatch.setattr(results, "_RUN_ENV", dict(results._RUN_ENV))  # this process's other results unaffected
    parser = argparse.ArgumentParser()
    add_common_args(parser)
    args = apply_common_args(parser, parser.parse_args(["--sampler-engine", "fast-eager"]))  # the option wins
    model = models["tiny-dense"]
    assert args.execution.sampler_engine == "fast-eager" and results.env_info()["sampler_engine"] == "fast-eager"
    assert type(make_sampler(model, "bf16", engine=args.execution.sampler_engine)) is FastSampler
    args = apply_common_args(parser, parser.parse_args([]))  # auto: the variable decides, and is recorded
    assert args.execution.sampler_engine == "reference"
    assert results.env_info()["overrides"] == {SAMPLER_VAR: "reference"}
    monkeypatch.setenv(SAMPLER_VAR, "fast-eager")
    assert type(make_sampler(model, "bf16")) is Sampler  # auto on CPU: no environment read below the command
    monkeypatch.setenv(SAMPLER_VAR, "graph")
    with pytest.raises(SystemExit):
        apply_common_args(parser, parser.parse_args([]))
    with pytest.raises(ValueError, match="fast-eager"):
        make_sampler(model, "bf16", engine="graph")
    with pytest.raises(SystemExit):
        parser.parse_args(["--sampler-engine", "graph"])


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("model_name", ["tiny-dense", "tiny-moe"])
def test_decode_step_host_syncs(models, model_name, profile):
    """The decode step's Python-level host syncs are exactly the known ones (none for the dense model)."""
    syncs = FastSampler(models[model_name], profile, graph=False).step_host_syncs(PROMPTS)
    assert {(s.op, s.where.split(":")[0]) for s in syncs} == KNOWN_STEP_SYNCS[model_name], syncs


def test_host_sync_detector_sees_syncs():
    x = torch.arange(6.0)
    assert [s.op for s in find_host_syncs(lambda: (x * 2 + 1).softmax(0).argmax())] == []
    cases = {"item": lambda: x.sum().item(), "tolist": lambda: x.tolist(), "__bool__": lambda: bool(x.sum() > 0),
             "__int__": lambda: int(x[0]), "bincount": lambda: torch.bincount(x.long()),
             "nonzero": lambda: x.nonzero(), "__getitem__": lambda: x[x > 2], "tensor": lambda: torch.tensor([1.0])}
    for op, fn in cases.items():
        assert [s.op for s in find_host_syncs(fn)] == [op], op
    # placed on the host by a literal device="cpu" (foreach AdamW's step increment on CUDA): no copy, no sync
    assert find_host_syncs(lambda: torch.tensor(1.0, device="cpu")) == []
    assert [s.op for s in find_host_syncs(lambda: torch.tensor(1.0, device=x.device))] == ["tensor"]


def test_race_noise_is_counter_based():
    seeds = torch.tensor([ref_sampler.derive_seed(3, i) for i in range(4)])
    q = ref_sampler.race_noise(seeds, 7, 64)  # (4, 64)
    assert torch.equal(q[2:3], ref_sampler.race_noise(seeds[2:3], torch.tensor(7), 64))  # row alone, step tensor
    u = philox.uniform(int(seeds[1]), torch.arange(64) + (7 << 32))  # counter (vocab index, step)
    assert torch.equal(q[1], -torch.log(u))
    assert not torch.equal(q, ref_sampler.race_noise(seeds, 8, 64))
    big = ref_sampler.race_noise(seeds, 0, 1 << 14)
    assert abs(float(big.mean()) - 1.0) < 0.02 and bool((big > 0).all()) and bool(torch.isfinite(big).all())


@pytest.mark.parametrize("vocab", [64, 1500])
def test_uniform_rows_triton_equals_the_plain_philox(vocab):
    """kernels/noise.py (one launch; the interpreter on CPU) == formats.philox's plain torch Philox, bit for bit:
    every row key (0, 2^63 - 1, derived seeds), int and device steps, a vocabulary over more than one block."""
    from minite_core.kernels import dispatch

    seeds = torch.tensor([0, (1 << 63) - 1] + [ref_sampler.derive_seed(3, i) for i in range(3)])
    if CUDA:
        seeds = seeds.cuda()
    for step in (0, 7, torch.tensor(1 << 20, device=seeds.device)):
        ref = dispatch.uniform_rows(seeds, step, vocab, ref_sampler.U_ZERO_GUARD, backend="reference")
        fast = dispatch.uniform_rows(seeds, step, vocab, ref_sampler.U_ZERO_GUARD, backend="triton")
        assert torch.equal(fast, ref), step


def test_exponential_race_samples_the_processed_distribution():
    """argmax(p / q) with the counter-based q draws token v with probability p_v (fixed seeds: deterministic)."""
    logits = torch.randn(1, 16, generator=torch.Generator().manual_seed(0)) * 2
    rows, steps = 4000, 10
    seeds = torch.tensor([ref_sampler.derive_seed(1, i) for i in range(rows)])
    for top_p in (1.0, 0.8):
        p = ref_sampler.processed_logprobs(logits, top_p=top_p).exp()[0]
        counts = torch.zeros(16)
        for step in range(steps):
            tok = ref_sampler.sample_step(logits.expand(rows, 16), seeds, step, temperature=1.0, top_p=top_p)[0]
            counts += torch.bincount(tok, minlength=16)
        freq = counts / counts.sum()
        sd = (p * (1 - p) / (rows * steps)).sqrt()
        assert bool(((freq - p).abs() <= 4 * sd + 1e-6).all()), (freq, p)
        assert bool((freq[p == 0] == 0).all())  # top-p-filtered tokens are never drawn


def test_race_noise_zero_guard(monkeypatch):
    monkeypatch.setattr(philox, "uniform", lambda seed, offset: torch.zeros(torch.broadcast_shapes(seed.shape,
                                                                                                     offset.shape)))
    q = ref_sampler.race_noise(torch.tensor([1, 2]), 0, 8)
    assert torch.equal(q, torch.full((2, 8), -math.log(ref_sampler.U_ZERO_GUARD), dtype=torch.float32))


def test_philox_tensor_seeds_match_int_seeds():
    offsets = torch.arange(100, dtype=torch.long) * 977 + (5 << 32)
    seeds = [0, 1, ref_sampler.derive_seed(7), (1 << 48) - 1]
    rows = philox.uniform(torch.tensor(seeds)[:, None], offsets[None, :])  # (4, 100) one call
    for i, s in enumerate(seeds):
        assert torch.equal(rows[i], philox.uniform(s, offsets))
    with pytest.raises(ValueError, match="int64"):
        philox.uniform(torch.tensor([1], dtype=torch.int32), offsets)


def test_batch_bucket_and_cache_slots():
    assert [ref_sampler.batch_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 64, 65, 256)] == [1, 2, 4, 4, 8, 8, 16, 64,
                                                                                          72, 256]
    assert ref_sampler.cache_slots(10, 54) == 64 and ref_sampler.cache_slots(10, 55) == 128
    with pytest.raises(ValueError, match="at least one prompt"):
        ref_sampler.batch_bucket(0)


def test_kv_cache_static_protocol(models):
    model = set_profile(models["tiny-dense"], "bf16").eval()
    cache = KVCache.for_model(model, 2, 8)
    k_buf = cache.k[0]
    with torch.inference_mode():
        ids = torch.tensor([[0, 1, 5, 6], [1, 7, 8, 9]])
        real = torch.tensor([[False, True, True, True], [True] * 4])
        first = model(ids, attention_mask=real, cache=cache)
        assert cache.length == 4 and int(cache.pos) == 4 and cache.n_real.tolist() == [3, 4]
        assert cache.valid[:, :4].tolist() == real.tolist() and not bool(cache.valid[:, 4:].any())
        model(torch.tensor([[2], [3]]), attention_mask=torch.tensor([[True], [False]]), cache=cache)
        assert cache.n_real.tolist() == [4, 4] and cache.valid[:, 4].tolist() == [True, False]
        cache.reset()
        again = model(ids, attention_mask=real, cache=cache)  # stale slots are never attended
        assert torch.equal(first, again) and cache.k[0] is k_buf
        with pytest.raises(ValueError, match="overflow"):
            model(torch.zeros(2, 5, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="attention_mask"):
            model(torch.zeros(2, 1, dtype=torch.long), attention_mask=real, cache=cache)


def test_graph_bookkeeping_with_a_stand_in_graph(models, monkeypatch):
    """The CUDA-graph bookkeeping on CPU — capture before the reset and prefill, one replay per step, the shared
    pool, re-capture exactly when the weights the graph read change — with a stand-in for the capture whose
    "graph" replays the captured step eagerly."""
    from minite_core.engines import fast_sampler as fs

    pools = []

    class StandIn:
        def __init__(self, fn):
            self.replay = fn

    def capture(fn, device, pool):
        for _ in range(fs.WARMUP_STEPS):  # the warm-up steps run on the live buffers, as on the GPU
            fn()
        pools.append(pool)
        return StandIn(fn)

    monkeypatch.setattr(fs, "capture_step", capture)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
    model = models["tiny-dense"]
    sampler = FastSampler(model, "minite", graph=False)
    sampler.graph = True  # graph path on CPU, through the stand-in
    kw = dict(max_new_tokens=10, stop_ids=STOP, seed=11)
    _assert_same(Sampler(model, "minite").generate(PROMPTS, **kw), sampler.generate(PROMPTS, **kw))
    _assert_same(Sampler(model, "minite").generate(PROMPTS[:3], **kw), sampler.generate(PROMPTS[:3], **kw))
    assert pools == ["pool", "pool"]  # buckets 8 and 4: one graph each, one pool
    sampler.generate(PROMPTS, **kw)  # same state, same weights: replayed as captured
    assert len(pools) == 2
    clear_weight_caches(model)  # what track_optimizer does after an optimizer step
    _assert_same(Sampler(model, "minite").generate(PROMPTS, **kw), sampler.generate(PROMPTS, **kw))
    assert len(pools) == 3


# ---- GPU (the H200): CUDA-graph replay vs the eager fast path vs the reference --------------------------------
@pytest.fixture(scope="module")
def cuda_models():
    return {name: _model(name).cuda() for name in ("tiny-dense", "tiny-moe")}


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("model_name", ["tiny-dense", "tiny-moe"])
@pytest.mark.parametrize("profile", PROFILES)
def test_gpu_graph_equals_eager_and_reference(cuda_models, model_name, profile):
    model = cuda_models[model_name]
    for temperature, top_p in SAMPLING:
        kw = dict(max_new_tokens=24, temperature=temperature, top_p=top_p, stop_ids=STOP, seed=3)
        r_graph = FastSampler(model, profile, graph=True).generate(PROMPTS, **kw)
        _assert_same(FastSampler(model, profile, graph=False).generate(PROMPTS, **kw), r_graph)  # same kernels
        r_ref = Sampler(model, profile).generate(PROMPTS, **kw)
        assert r_graph.response_ids == r_ref.response_ids and r_graph.finished == r_ref.finished


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("profile", ["bf16", "minite"])
def test_gpu_graph_follows_weight_updates(profile):
    """A captured graph reads weights by address: in-place bf16 updates are seen, cleared quantized-weight caches
    trigger a re-capture — either way the result equals a fresh sampler's on the new weights."""
    model = _model("tiny-dense").cuda()
    kw = dict(max_new_tokens=16, seed=4)
    fast = FastSampler(model, profile, graph=True)
    before = fast.generate(PROMPTS, **kw)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    clear_weight_caches(model)  # what track_optimizer does after an optimizer step
    after = fast.generate(PROMPTS, **kw)
    _assert_same(FastSampler(model, profile, graph=True).generate(PROMPTS, **kw), after)
    assert after.logprobs != before.logprobs


@pytest.mark.parametrize("engine", [Sampler, FastSampler])
def test_learner_trains_after_sampling(engine):
    """Sampling runs under no_grad, not inference_mode: nn caches weight copies (bf16 casts, quantized operands)
    during the rollout, and the learner's next forward with grad reuses and saves them for backward."""
    from minite_core.engines import Learner

    model = CausalLM(PRESETS["tiny-moe"]).init_weights(3, std=0.3)
    r = engine(model, "bf16").generate(PROMPTS, max_new_tokens=4, seed=0)
    logp, _, mask = Learner(model, "bf16").logprobs(r.prompt_ids, r.response_ids, grad=True)
    (-logp[mask].mean()).backward()
    assert model.lm_head.weight.grad is not None
