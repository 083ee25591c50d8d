"""What executes is decided once: the command's Execution (runs.execution), the profile scoped to each engine call
(model.use_profile), and the GEMM arithmetic resolved once per profile (nn.arithmetic)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from minite_core import profiles, results
from minite_core.engines import Learner, Sampler
from minite_core.kernels import dispatch
from minite_core.model import PRESETS, CausalLM, set_profile, use_profile
from minite_core.model.qwen3_moe import RMSNorm
from minite_core.nn import GroupedLinear, QuantLinear
from minite_core.nn.arithmetic import Packed, Reference, TeReference, VllmCpu, W4A16, linear_gemm
from minite_core.profiles import PROFILES, get_profile
from minite_core.runs.execution import ATTENTION_VAR, KERNELS_VAR, SAMPLER_VAR, Execution

NN = Path(__file__).resolve().parents[1] / "minite_core" / "nn"


# ---- the execution ---------------------------------------------------------------------------------------------
def test_resolve_precedence_option_over_environment_over_auto():
    auto = Execution.resolve(environ={})
    assert (auto.kernels, auto.sampler_engine, auto.attention_kernel, auto.overrides) == (
        dispatch.auto_backend(), "reference", None, ())
    env = {KERNELS_VAR: "reference", SAMPLER_VAR: "fast-eager", ATTENTION_VAR: "row"}
    ex = Execution.resolve(environ=env)
    assert (ex.kernels, ex.sampler_engine, ex.attention_kernel) == ("reference", "fast-eager", "row")
    assert dict(ex.overrides) == env  # every variable that decided is recorded
    assert ex.record() == {"kernels": "reference", "sampler_engine": "fast-eager", "overrides": env}
    opt = Execution.resolve(kernels="reference", sampler_engine="reference", environ=env)
    assert (opt.kernels, opt.sampler_engine) == ("reference", "reference")  # an explicit option wins
    assert dict(opt.overrides) == {ATTENTION_VAR: "row"}  # the variables it overrode decided nothing
    assert Execution.resolve(device="cuda", environ={}).sampler_engine == "fast"  # auto on a GPU


@pytest.mark.parametrize("env, message", [
    ({KERNELS_VAR: "tritonn"}, r"\$MINITE_KERNELS='tritonn' is not one of"),
    ({SAMPLER_VAR: "graph"}, r"\$MINITE_SAMPLER='graph' is not one of"),
    ({ATTENTION_VAR: "tiled"}, r"\$MINITE_ATTENTION='tiled' is not one of"),
])
def test_a_bad_environment_value_fails_naming_the_variable(env, message):
    with pytest.raises(ValueError, match=message):
        Execution.resolve(environ=env)


@pytest.mark.skipif(dispatch.backend_available("native")[0], reason="native is usable here")
def test_an_unusable_backend_fails_naming_where_it_came_from():
    with pytest.raises(ValueError, match=r"^--kernels native: kernel backend 'native' is not usable here"):
        Execution.resolve(kernels="native", environ={})
    with pytest.raises(ValueError, match=r"^\$MINITE_KERNELS=native: kernel backend 'native' is not usable"):
        Execution.resolve(environ={KERNELS_VAR: "native"})


def test_install_records_the_execution_in_every_result(monkeypatch):
    monkeypatch.setattr(results, "_RUN_ENV", dict(results._RUN_ENV))
    ex = Execution.resolve(kernels="reference", environ={SAMPLER_VAR: "reference"})
    with ex.active():  # the backend for the block, restored after
        assert dispatch.current_backend() == "reference"
    ex.install()
    env = results.env_info()
    assert (env["kernels"], env["sampler_engine"], env["overrides"]) == ("reference", "reference",
                                                                         {SAMPLER_VAR: "reference"})


def test_attention_override_reaches_every_profile_put_on_a_model():
    """$MINITE_ATTENTION: every profile this process runs takes its kernel; outside the block, the profile's own."""
    model = CausalLM(PRESETS["tiny-dense"])
    ex = Execution.resolve(environ={ATTENTION_VAR: "row"})
    with ex.active():
        with use_profile(model, "minite-onpolicy"):
            assert model.profile.attention_kernel == "row"
            assert model.profile.replace(attention_kernel="tile-bf16x3") == PROFILES["minite-onpolicy"]
    with use_profile(model, "minite-onpolicy"):
        assert model.profile is PROFILES["minite-onpolicy"]
    with pytest.raises(ValueError, match="not overridable"):
        profiles.set_overrides(dtype="float32")


def test_the_profile_attention_kernel_is_the_one_that_runs(monkeypatch):
    """Profile.attention_kernel (and its environment override) reaches the Triton kernel on the fast path."""
    from minite_core.kernels import attention

    seen = []
    real = attention.attention_triton
    monkeypatch.setattr(attention, "attention_triton", lambda *a, kernel=None, **kw: seen.append(kernel) or
                        real(*a, kernel=kernel, **kw))
    model = CausalLM(PRESETS["tiny-dense"]).init_weights(0)
    ids = torch.tensor([[1, 5, 6, 7]])
    with dispatch.using_backend("triton"), torch.no_grad():
        with use_profile(model, PROFILES["minite-onpolicy"].replace(attention_kernel="row")):
            model(ids)
        assert set(seen) == {"row"}
        seen.clear()
        with Execution.resolve(kernels="triton", environ={ATTENTION_VAR: "tile"}).active(), \
                use_profile(model, "minite-onpolicy"):
            model(ids)
        assert set(seen) == {"tile"}


# ---- the profile, scoped -----------------------------------------------------------------------------------------
def _state(model) -> list:
    out = [model.profile]
    for m in model.modules():
        if isinstance(m, (QuantLinear, GroupedLinear)):
            out.append(m.profile)
        elif isinstance(m, RMSNorm):
            out.append((m.batch_invariant, m.recompute))
    return out


def test_use_profile_restores_what_every_module_carried():
    model = set_profile(CausalLM(PRESETS["tiny-moe"]), "bf16")
    model.model.layers[0].self_attn.q_proj.profile = PROFILES["minite"]  # a hand-set module survives too
    before = _state(model)
    with use_profile(model, "minite-onpolicy"):
        assert model.profile is PROFILES["minite-onpolicy"]
        assert all(m.profile is PROFILES["minite-onpolicy"] for m in model.modules() if isinstance(m, QuantLinear))
        assert all(m.batch_invariant and m.recompute for m in model.modules() if isinstance(m, RMSNorm))
        with use_profile(model, "te-nvfp4"):  # nested
            assert model.lm_head.profile is PROFILES["te-nvfp4"]
        assert model.lm_head.profile is PROFILES["minite-onpolicy"]
    assert _state(model) == before
    with pytest.raises(RuntimeError, match="boom"), use_profile(model, "minite"):
        raise RuntimeError("boom")
    assert _state(model) == before


def test_engines_leave_no_profile_behind_and_backward_keeps_the_forward_profile():
    model = CausalLM(PRESETS["tiny-moe"]).init_weights(0)
    before = _state(model)
    prompts = [[1, 5, 6], [1, 7]]
    roll = Sampler(model, "minite").generate(prompts, max_new_tokens=3, seed=0, stop_ids=())
    assert _state(model) == before
    logp, _, mask = Learner(model, "te-nvfp4").logprobs(roll.prompt_ids, roll.response_ids, grad=True)
    assert _state(model) == before
    (logp * mask).sum().backward()  # after the block: the backward runs te-nvfp4's NVFP4 recipe regardless
    sut = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    with use_profile(model, "te-nvfp4"):
        logp, _, mask = Learner(model, "te-nvfp4").logprobs(roll.prompt_ids, roll.response_ids, grad=True)
        (logp * mask).sum().backward()
    for n, p in model.named_parameters():
        if p.grad is not None:
            assert torch.equal(p.grad, sut[n]), n


# ---- the arithmetic, resolved once per profile -----------------------------------------------------------------------
def test_can_learn():
    assert {n for n, p in PROFILES.items() if not p.can_learn} == {n for n, p in PROFILES.items()
                                                                  if p.weight is not None and p.grad is None}
    assert PROFILES["bf16"].can_learn and PROFILES["minite"].can_learn and not PROFILES["vllm-nvfp4"].can_learn


@pytest.mark.parametrize("name, kind, grouped", [
    ("minite", Reference, True), ("te-nvfp4", Reference, True), ("vllm-marlin-w4a16", W4A16, True),
    ("vllm-nvfp4-cpu", VllmCpu, False), ("minite-packed", Packed, True), ("vllm-marlin-w4a16-packed", Packed, True),
])
def test_linear_gemm_is_what_the_profile_names(name, kind, grouped):
    gemm = linear_gemm(get_profile(name))
    assert type(gemm) is kind and gemm.grouped == grouped
    assert linear_gemm(get_profile(name)) is gemm  # once per profile
    if kind is Packed:
        assert type(gemm.base) is (W4A16 if get_profile(name).activation is None else Reference)


def test_te_reference_and_per_channel_wgrad_scales_have_no_grouped_kernel():
    te = PROFILES["minite"].replace(name="x", fused_weight_scale=False, w4a4_gemm="te-ref")
    assert type(linear_gemm(te)) is TeReference and not linear_gemm(te).grouped and linear_gemm(te).unshardable
    row = PROFILES["minite"].replace(name="y", wgrad_input_scale_mode="row")
    assert not linear_gemm(row).grouped and "wgrad_input_scale_mode" in linear_gemm(row).unshardable
    assert linear_gemm(PROFILES["minite"]).grouped and linear_gemm(PROFILES["minite"]).unshardable is None


def _variant_reads(path: Path) -> list[str]:
    """Lines of `path` that read a profile's arithmetic-variant knob (w4a4_gemm, decode_gemm)."""
    tree = ast.parse(path.read_text())
    return [f"{path.name}:{n.lineno}" for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and n.attr in ("w4a4_gemm", "decode_gemm") and isinstance(n.ctx, ast.Load)]


def test_nn_runs_the_resolved_arithmetic_without_reading_the_variant_names():
    """Only nn.arithmetic turns the knobs into the objects; the autograd code runs what they say."""
    bad = [hit for p in sorted(NN.glob("*.py")) if p.name != "arithmetic.py" for hit in _variant_reads(p)]
    assert not bad, bad
