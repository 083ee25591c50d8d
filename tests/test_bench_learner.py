"""Learner-update throughput bench: the tiny CPU run end to end (through `minite bench learner`), the
saved-activation counting rule, and the timing helpers."""
from __future__ import annotations

import csv
import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minite_core.bench import learner
from minite_core.bench.saved_activations import saved_activation_bytes
from minite_core.bench.cli import main as bench_main
from minite_core.bench.timing import Stats, Timer, bench, percentile, round_robin, timed_rounds
from minite_core.report.tables import throughput_table

PROFILES = ("bf16", "te-nvfp4", "minite")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("throughput")
    rc = bench_main(["learner", "--config", "tiny", "--device", "cpu", "--warmup", "1", "--iters", "2",
                     "--experiment", "test", "--out", str(out / "learner.json"), "--csv", str(out / "learner.csv")])
    assert rc == 0
    return out


def test_tiny_bench_writes_valid_json(tiny_run):
    res = json.loads((tiny_run / "learner.json").read_text())
    assert res["schema"] == "throughput/v1" and res["experiment"] == "test"
    assert {"gpu", "torch", "commit"} <= set(res["env"])
    assert res["config"]["iters_run"] == 2 and res["config"]["tokens_per_step"] == 2 * 32
    assert [r["profile"] for r in res["rows"]] == list(PROFILES)
    for r in res["rows"]:
        for key in ("tokens_per_s", "p20_tokens_per_s", "p80_tokens_per_s", "step_ms", "peak_mem_gb", "saved_act_gb",
                    "saved_act_ratio_vs_bf16", "speedup_vs_bf16", "speedup_vs_te_nvfp4"):
            assert key in r, key
        assert r["p20_tokens_per_s"] <= r["tokens_per_s"] <= r["p80_tokens_per_s"]
        assert r["tokens_per_s"] == pytest.approx(64 / (r["step_ms"] / 1e3))
        assert r["peak_mem_gb"] is None  # CPU: no CUDA allocator statistics
        assert r["saved_act_gb"] > 0
    rows = {r["profile"]: r for r in res["rows"]}
    assert rows["bf16"]["speedup_vs_bf16"] == 1.0 and rows["te-nvfp4"]["speedup_vs_te_nvfp4"] == 1.0
    assert rows["minite"]["speedup_vs_bf16"] == pytest.approx(
        rows["minite"]["tokens_per_s"] / rows["bf16"]["tokens_per_s"])


def test_minite_saves_fewer_activation_bytes_than_bf16(tiny_run):
    rows = {r["profile"]: r for r in json.loads((tiny_run / "learner.json").read_text())["rows"]}
    assert rows["bf16"]["saved_act_ratio_vs_bf16"] == 1.0
    assert rows["minite"]["saved_act_ratio_vs_bf16"] < 1.0  # packed x^T (uint8 + e4m3) instead of bf16 x
    assert rows["minite"]["saved_act_by_dtype_gb"].get("uint8", 0) > 0
    assert rows["bf16"]["saved_act_by_dtype_gb"].get("uint8", 0) == 0


def test_paper_block_is_separate_from_measured_rows(tiny_run):
    res = json.loads((tiny_run / "learner.json").read_text())
    assert res["paper"]["minite_tokens_per_s"] == 33540
    assert res["paper"]["speedup_vs_bf16"] == 1.39 and res["paper"]["speedup_vs_te_nvfp4"] == 1.47
    assert "B300" in res["paper"]["hardware"]
    assert all(r["profile"] in PROFILES for r in res["rows"])
    assert all(33540 not in r.values() for r in res["rows"])
    md = throughput_table(tiny_run / "learner.json")
    assert "not measured here" in md and all(f"| {p} |" in md for p in PROFILES)


def test_targets_are_checks_on_the_measured_rows(tiny_run):
    """Each target a check {target, value, met}: minite against BF16 and TE-NVFP4, its quantize passes' share of
    its kernel time (from the op profile; — without one), the lowest saved-activation ratio of the minite rows
    (a TE row's name does not confuse it); the report lists them. The tiny CPU run has no op profile."""
    row = {"mfu": 0.36, "speedup_vs_bf16": 0.6, "speedup_vs_te_nvfp4": 0.95, "saved_act_ratio_vs_bf16": 0.78}
    by_name = {"bf16": {**row, "speedup_vs_bf16": 1.0}, "minite": row,
               "minite+lowmem": {**row, "speedup_vs_bf16": 0.56, "saved_act_ratio_vs_bf16": 0.42},
               "te:bf16+grouped": {**row, "saved_act_ratio_vs_bf16": 0.1}}
    by_name = {name: {**r, "profile": name} for name, r in by_name.items()}
    ops = {"minite": {"kernel_ms_per_step": 294.0, "group_ms_per_step": {"quantize": 72.0}}}
    checks = learner._check_targets(by_name, ops, cuda=True)["checks"]
    assert [(c["value"], c["met"]) for c in checks] == [(0.36, True), (0.6, False), (0.95, False),
                                                        (72.0 / 294.0, False), (0.42, True)]
    assert "minite+lowmem" in checks[-1]["target"] and "10%" in checks[3]["target"]
    assert learner._check_targets(by_name, {}, cuda=True)["checks"][3]["met"] is None
    md = throughput_table(tiny_run / "learner.json")
    assert "Targets (CPU" in md and "- miniTE ≥ 0.80× BF16 tokens/s (aim 0.90×): " in md
    assert "- miniTE's separate quantize passes ≤ 10% of its kernel time: — (—)" in md


def test_csv_is_long_format(tiny_run):
    with (tiny_run / "learner.csv").open() as f:
        lines = list(csv.DictReader(f))
    assert len(lines) == len(PROFILES) * len(learner.CSV_METRICS)
    assert {line["profile"] for line in lines} == set(PROFILES)
    assert all(line["experiment"] == "test" and line["gpu"] and line["commit"] for line in lines)


class _CastLinear(nn.Module):
    """fp32 master weight cast to bf16 per call, as the model does: the cast must not count as an activation."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(32, 16))
        self.experts = nn.Parameter(torch.randn(2, 32, 16))

    def forward(self, x):
        h = F.linear(x.to(torch.bfloat16), self.weight.to(torch.bfloat16))  # saves x_bf16, weight_bf16 (a cast)
        h = h + F.linear(x.to(torch.bfloat16), self.experts[1].to(torch.bfloat16))  # select + cast of a param
        return F.linear(h, self.weight.t().to(torch.bfloat16))  # saves h, a transposed cast


def test_saved_activation_rule_excludes_parameters_and_their_casts():
    x = torch.randn(8, 16)
    counted = saved_activation_bytes(_CastLinear(), x)
    x_bf16_bytes, h_bytes = 8 * 16 * 2, 8 * 32 * 2  # x.to(bf16) is made twice: two storages
    assert counted["total"] == 2 * x_bf16_bytes + h_bytes
    assert counted["by_dtype"] == {"bfloat16": counted["total"]}
    assert counted["decoder"] == 0  # no DecoderLayer in this module


def test_saved_activation_count_frees_its_graph():
    """The counted forward's graph is freed when the count returns. Before, pack returned each saved tensor
    itself: a saved op output then held its own grad_fn (a cycle through the C++ graph that gc cannot break) and
    the bench kept every counted graph on the GPU (~10 GB per layer and profile at Qwen3-30B-A3B shapes)."""
    import gc
    import weakref

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(32, 16))

        def forward(self, x):
            return torch.sigmoid(F.linear(x, self.weight)).exp()  # sigmoid and exp save their outputs

    refs = []
    pack_hooks = torch.autograd.graph.saved_tensors_hooks

    class Spy(pack_hooks):
        def __init__(self, pack, unpack):
            super().__init__(lambda t: (refs.append(weakref.ref(t)), pack(t))[1], unpack)

    torch.autograd.graph.saved_tensors_hooks = Spy
    try:
        net = Net()
        saved_activation_bytes(net, torch.randn(8, 16))
    finally:
        torch.autograd.graph.saved_tensors_hooks = pack_hooks
    gc.collect()
    alive = [r() for r in refs if r() is not None and r() is not net.weight]
    assert refs and not alive


def test_resolve_config_overrides_and_json():
    cpu = torch.device("cpu")
    assert learner.resolve_config(None, cpu).name == "tiny"
    cfg = learner.resolve_config('{"base": "h200", "layers": 2, "profiles": ["bf16", "minite"]}', cpu, batch=1,
                                 seq=None)
    assert (cfg.layers, cfg.batch, cfg.seq, cfg.profiles) == (2, 1, 4096, ("bf16", "minite"))
    mcfg = cfg.model_config()
    assert (mcfg.hidden_size, mcfg.num_experts, mcfg.num_experts_per_tok, mcfg.moe_intermediate_size) == (
        2048, 128, 8, 768)
    assert (mcfg.num_hidden_layers, mcfg.vocab_size) == (2, 32768)
    with pytest.raises(ValueError, match="unknown profile"):
        learner.run(learner.resolve_config("tiny", cpu, profiles=("bf16", "nope")), cpu)


def test_timing_helpers():
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 20) == 2.0
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 80) == 4.0
    s = Stats.of([3.0, 1.0, 2.0])
    assert (s.median_ms, s.p20_ms, s.p80_ms, s.n) == (2.0, 1.0, 3.0, 3)
    with Timer("cpu") as t:
        sum(range(1000))
    assert t.elapsed_ms >= 0
    calls = []
    stats = bench(lambda: calls.append(1), warmup=2, reps=3)
    assert len(calls) == 5 and stats.n == 3
    order, samples, peaks = [], {"a": [], "b": [], "c": []}, {}
    for r in range(4):  # the starting name rotates; prepare (untimed) before each step; samples only when given
        round_robin("abc", r, lambda n: lambda: order.append(n), "cpu", samples if r >= 2 else None, peaks)
    assert "".join(order) == "abc" "bca" "cab" "abc"
    assert [len(v) for v in samples.values()] == [2, 2, 2] and peaks == {}  # CPU: no allocator statistics
    assert (timed_rounds(10, 100.0, 0.0), timed_rounds(10, 100.0, 20.0), timed_rounds(10, 1.0, 20.0),
            timed_rounds(2, 1.0, 20.0)) == (10, 5, 3, 2)


def test_te_rows_skipped_with_the_reason_without_te():
    """`te:<mode>` rows run through peers.te_learner; where TE cannot run (here: CPU) they are skipped, the reason
    recorded, and no row is made up for them."""
    from minite_core.peers import te_learner

    cpu = torch.device("cpu")
    cfg = learner.resolve_config("tiny", cpu, profiles=("bf16", "te:bf16", "te:fp8-current"), warmup=1, iters=1)
    logs = []
    payload = learner.run(cfg, cpu, log=logs.append)
    ok, why = te_learner.mode_available("bf16")
    assert not ok and why
    assert [r["profile"] for r in payload["rows"]] == ["bf16"]
    assert payload["skipped"] == [{"profile": "te:bf16", "reason": why}, {"profile": "te:fp8-current", "reason": why}]
    assert any(line == f"skipping te:bf16: {why}" for line in logs)
    with pytest.raises(ValueError, match="unknown TE mode"):
        learner.run(learner.resolve_config("tiny", cpu, profiles=("bf16", "te:nope")), cpu)
    with pytest.raises(ValueError, match="no profile left"):
        learner.run(learner.resolve_config("tiny", cpu, profiles=("te:bf16",), warmup=1, iters=1), cpu)


def _rows_and_knobs(monkeypatch, knob: str, profiles: tuple[str, ...]) -> tuple[dict, list]:
    """The tiny bench's rows of `profiles` (1 warm-up, 1 timed round) and, per learner step, the set of values the
    GroupedLinears' `knob` had."""
    from minite_core.nn import GroupedLinear

    seen = []
    step = learner.learner_step

    def spy(model, *a, **kw):
        seen.append({getattr(m, knob) for m in model.modules() if isinstance(m, GroupedLinear)})
        return step(model, *a, **kw)

    monkeypatch.setattr(learner, "learner_step", spy)
    cpu = torch.device("cpu")
    cfg = learner.resolve_config("tiny", cpu, profiles=profiles, warmup=1, iters=1)
    return {r["profile"]: r for r in learner.run(cfg, cpu, log=lambda _: None)["rows"]}, seen


def test_fused_row_runs_the_profile_with_the_expert_quantizers_fused(monkeypatch):
    """`minite+fused` is minite's row with every GroupedLinear's fused_quant on for its steps and its counted
    forward (off again after), timed beside the plain row; unknown base profiles still fail first."""
    rows, seen = _rows_and_knobs(monkeypatch, "fused_quant", ("minite", "minite+fused"))
    cpu = torch.device("cpu")
    assert set(rows) == {"minite", "minite+fused"}
    assert sorted(map(tuple, seen)) == [(False,), (False,), (True,), (True,)]  # 2 rounds, one step per row
    assert rows["minite+fused"]["saved_act_gb"] == rows["minite"]["saved_act_gb"]  # the same tensors are saved
    with pytest.raises(ValueError, match="nope"):
        learner.run(learner.resolve_config("tiny", cpu, profiles=("nope+fused",)), cpu)


def test_row_suffixes_combine_and_unknown_ones_fail():
    """`<profile>+fused+lowmem`: the profile plus both GroupedLinear knobs, in any order; use_row turns on the named
    knobs, off the others, and puts back what the modules carried."""
    from minite_core.bench.learner_setup import CONFIGS, build
    from minite_core.nn import GroupedLinear

    assert learner.parse_row("minite") == ("minite", ())
    assert learner.parse_row("minite+fused") == ("minite", ("fused_quant",))
    assert learner.parse_row("te-nvfp4+lowmem") == ("te-nvfp4", ("remake_output",))
    assert learner.parse_row("minite+lowmem+fused") == ("minite", ("remake_output", "fused_quant"))
    with pytest.raises(ValueError, match=r"unknown suffix '\+nope'.*\+fused, \+lowmem"):
        learner.parse_row("minite+fused+nope")
    model = build(CONFIGS["tiny"], torch.device("cpu"))[0]
    experts = [m for m in model.modules() if isinstance(m, GroupedLinear)]
    experts[0].remake_output = True  # what a module carried before the row
    for row, want in (("minite+fused+lowmem", {(True, True)}), ("minite+lowmem", {(False, True)}),
                      ("minite", {(False, False)})):
        with learner.use_row(model, row):
            assert {(m.fused_quant, m.remake_output) for m in experts} == want
            assert all(m.profile.name == "minite" for m in experts)
        assert experts[0].remake_output and not any(m.fused_quant for m in experts)


def test_lowmem_row_saves_fewer_bytes(monkeypatch):
    """`minite+lowmem` times minite with the experts' outputs made again in backward (GroupedLinear.remake_output):
    its counted saved activations are fewer than minite's (the same run), bf16 ignores the suffix."""
    rows, seen = _rows_and_knobs(monkeypatch, "remake_output",
                                 ("bf16", "minite", "minite+lowmem", "minite+fused+lowmem"))
    assert sorted(map(tuple, seen)) == [(False,)] * 4 + [(True,)] * 4  # 2 rounds, one step per row
    assert rows["minite+lowmem"]["saved_act_gb"] < rows["minite"]["saved_act_gb"]
    assert rows["minite+fused+lowmem"]["saved_act_gb"] == rows["minite+lowmem"]["saved_act_gb"]
    assert rows["minite+lowmem"]["saved_act_ratio_vs_bf16"] < rows["minite"]["saved_act_ratio_vs_bf16"]


# ---- one AdamW state on the device at a time (OptimizerSwap) ----------------------------------------------
def _two_optimizers(device="cpu", fused=False):
    """As the bench: AdamW over (W (E, N, K), a dense d) and a second AdamW over W's per-expert views and d."""
    g = torch.Generator().manual_seed(0)
    w = nn.Parameter(torch.randn(3, 4, 5, generator=g).to(device))
    d = nn.Parameter(torch.randn(6, generator=g).to(device))
    views = [nn.Parameter(w.data[e]) for e in range(3)]
    kw = {"fused": True} if fused else {}
    return (torch.optim.AdamW([w, d], lr=1e-2, **kw), torch.optim.AdamW([*views, d], lr=1e-2, **kw))


def _step(opt, k):
    g = torch.Generator().manual_seed(k)
    for group in opt.param_groups:
        for p in group["params"]:
            p.grad = torch.randn(p.shape, generator=g).to(p.device)
    opt.step()
    opt.zero_grad(set_to_none=True)


def _state(opt):
    return [(k, v.clone()) for s in opt.state.values() for k, v in s.items()]


def _assert_same_state(ref, opt):
    sut = [(k, v) for s in opt.state.values() for k, v in s.items()]
    assert [k for k, _ in ref] == [k for k, _ in sut]
    for (_, r), (_, s) in zip(ref, sut):
        assert r.device == s.device and r.dtype == s.dtype
        torch.testing.assert_close(s, r, atol=0, rtol=0)


def _swap_round_trip(device, fused):
    a, b = _two_optimizers(device, fused)
    _step(a, 1), _step(b, 2)
    ref_a, ref_b = _state(a), _state(b)
    swap = learner.OptimizerSwap(a, b)
    exp_avg = next(iter(b.state.values()))["exp_avg"]
    swap.activate(a)  # b parked: its state tensors are new CPU copies, a's are where they were
    parked = next(iter(b.state.values()))["exp_avg"]
    assert parked is not exp_avg and parked.device.type == "cpu" and parked.is_pinned() == (device != "cpu")
    _assert_same_state(ref_a, a)
    swap.activate(b), swap.activate(a), swap.activate(b)
    _assert_same_state(ref_b, b)  # bitwise after the round trips, on its home devices while active
    swap.activate(a)  # (a was parked: on a GPU its state sat in CPU memory until now)
    _assert_same_state(ref_a, a)

    ref = _two_optimizers(device, fused)  # stepping after round trips == stepping without them
    _step(ref[0], 1), _step(ref[1], 2)
    for k, i in enumerate((0, 1, 1, 0, 1)):
        _step(ref[i], 3 + k)
        swap.activate((a, b)[i])
        _step((a, b)[i], 3 + k)
    for o_ref, o_sut in zip(ref, (a, b)):
        swap.activate(o_sut)
        _assert_same_state(_state(o_ref), o_sut)
        for p_ref, p_sut in zip(o_ref.param_groups[0]["params"], o_sut.param_groups[0]["params"]):
            torch.testing.assert_close(p_sut, p_ref, atol=0, rtol=0)
    return swap


def test_optimizer_swap_round_trip_is_bitwise():
    _swap_round_trip("cpu", fused=False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_optimizer_swap_frees_the_idle_state():
    swap = _swap_round_trip("cuda", fused=True)  # fused AdamW: its `step` tensors live on the GPU too
    a, b = swap.optimizers
    assert swap.active is b and a in swap.homes
    before = torch.cuda.memory_allocated()
    swap.park(b)
    state_bytes = sum(v.numel() * v.element_size() for s in b.state.values() for v in s.values())
    assert before - torch.cuda.memory_allocated() >= state_bytes  # b's device copies freed (blocks round up)
    swap.activate(a)
    assert all(v.is_cuda for s in a.state.values() for v in s.values())


@pytest.fixture
def fake_te_bench(monkeypatch):
    """The TE stand-in (tests/fake_te.py, as tests/test_te_peer.py's `fake`), available for the bench on CPU."""
    import sys

    from minite_core.peers import te_learner
    from tests import fake_te

    for name, module in fake_te.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(te_learner, "available", lambda: (True, "stand-in"))
    monkeypatch.setattr(te_learner, "_require_cuda_model", lambda model: None)
    return te_learner


def test_te_rows_run_with_only_the_active_optimizer_state(fake_te_bench, monkeypatch):
    """Our rows and a TE row (stand-in) in one run: every step finds its own optimizer active and the other parked."""
    swaps, seen = [], []

    class Recording(learner.OptimizerSwap):
        def __init__(self, *opts):
            super().__init__(*opts)
            swaps.append(self)

    def checked(step):
        def run(model, opt, *args):
            (swap,) = swaps
            seen.append(swap.active is opt and all(o in swap.homes for o in swap.optimizers if o is not opt))
            return step(model, opt, *args)
        return run

    monkeypatch.setattr(learner, "OptimizerSwap", Recording)
    monkeypatch.setattr(learner, "learner_step", checked(learner.learner_step))
    monkeypatch.setattr(fake_te_bench, "te_train_step", checked(fake_te_bench.te_train_step))
    cpu = torch.device("cpu")
    cfg = learner.resolve_config("tiny", cpu, profiles=("bf16", "te:bf16", "minite", "te:fp8-current"), warmup=1,
                                 iters=2)
    payload = learner.run(cfg, cpu, log=lambda s: None)
    assert [r["profile"] for r in payload["rows"]] == ["bf16", "te:bf16", "minite"]
    assert [s["profile"] for s in payload["skipped"]] == ["te:fp8-current"]  # the stand-in has no FP8
    assert len(swaps[0].optimizers) == 2 and len(seen) == 3 * 3 and all(seen)


def test_te_grouped_rows_share_one_parameter_set(fake_te_bench):
    """`te:<mode>+grouped` builds its experts as one te.GroupedLinear (stand-in) beside the per-expert row's
    te.Linear each; both copies train the same Parameters through one AdamW, and both rows run and are timed.
    te:nvfp4+grouped (no grouped path for TE's NVFP4 reference quantizer) fails before any work."""
    from minite_core.bench.learner_setup import CONFIGS, build
    from minite_core.bench.learner_te import _weight_slots, te_models

    cpu = torch.device("cpu")
    cfg = learner.resolve_config("tiny", cpu, profiles=("te:bf16", "te:bf16+grouped"), warmup=1, iters=1)
    model = build(CONFIGS["tiny"], cpu)[0]
    copies, opt, skipped = te_models(cfg, model, log=lambda s: None)
    assert not skipped and set(copies) == {"te:bf16", "te:bf16+grouped"}
    per, grouped = (_weight_slots(copies[n]) for n in ("te:bf16", "te:bf16+grouped"))
    assert per.keys() == grouped.keys() and any(isinstance(k, tuple) for k in per)
    assert all(getattr(*per[k]) is getattr(*grouped[k]) for k in per)  # the same Parameter objects
    assert {id(p) for p in copies["te:bf16+grouped"].parameters()} == {id(p) for g in opt.param_groups
                                                                       for p in g["params"]}
    payload = learner.run(learner.resolve_config("tiny", cpu, profiles=("bf16", "te:bf16", "te:bf16+grouped"),
                                                 warmup=1, iters=1), cpu, log=lambda s: None)
    assert [r["profile"] for r in payload["rows"]] == ["bf16", "te:bf16", "te:bf16+grouped"]
    with pytest.raises(ValueError, match=r"te:nvfp4\+grouped.*no path for TE's NVFP4"):
        learner.run(learner.resolve_config("tiny", cpu, profiles=("bf16", "te:nvfp4+grouped")), cpu)


@pytest.mark.gpu
def test_gpu_bench_with_te_rows():
    """Our rows and real TE rows (te.Linear per expert, te.GroupedLinear) in one run on the GPU (tiny model): every
    row timed, peak memory recorded."""
    from minite_core.peers import te_learner

    ok, why = te_learner.available()
    if not ok:
        pytest.skip(why)
    cuda = torch.device("cuda")
    rows = ("bf16", "te:bf16", "te:bf16+grouped", "minite")
    payload = learner.run(learner.resolve_config("tiny", cuda, profiles=rows, warmup=1, iters=2), cuda,
                          log=lambda s: None)
    assert tuple(r["profile"] for r in payload["rows"]) == rows
    assert all(r["peak_mem_gb"] > 0 for r in payload["rows"])


def test_too_large_a_model_fails_before_any_work(monkeypatch):
    """4 h200 layers = 2.63B fp32 params: 42 GB of weights + grads + AdamW state, more than a 40 GB GPU holds."""
    import types

    cfg = learner.resolve_config("h200", torch.device("cpu"), layers=4)
    for total_gb, fits in ((40, False), (80, True)):
        props = types.SimpleNamespace(total_memory=total_gb * 10**9)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
        if fits:
            learner.check_fits(cfg, torch.device("cuda"))
        else:
            with pytest.raises(ValueError, match=r"needs 42\.0 GB .* has 40\.0 GB: use fewer --layers"):
                learner.check_fits(cfg, torch.device("cuda"))
