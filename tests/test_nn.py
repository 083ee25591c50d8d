"""Profile-driven GEMM layers: forward/backward numerics, knob-by-knob equivalence, saved bytes, calibration."""
import pytest
import torch
import torch.nn.functional as F

from minite_core.formats.nvfp4 import dequantize, quantize
from minite_core.formats.rht import rht
from minite_core.model import PRESETS, CausalLM, set_profile
from minite_core.model.calibrate import calibrate
from minite_core.nn import GroupedLinear, QuantLinear, linear
from minite_core.nn.moe_layout import moe_layout, padded_rows, permute
from minite_core.profiles import PROFILES, get_profile

FP32 = get_profile("bf16").replace(dtype="float32", router_dtype="float32", lm_head_dtype="float32")


def _layer(n=32, k=64, seed=0):
    torch.manual_seed(seed)
    layer = QuantLinear(k, n)
    torch.nn.init.normal_(layer.weight, std=0.5)
    return layer


def test_bf16_profile_is_plain_torch():
    layer = _layer()
    x = torch.randn(5, 64)
    torch.testing.assert_close(layer(x), F.linear(x.bfloat16(), layer.weight.bfloat16()), atol=0, rtol=0)


def test_fp32_gradients_match_finite_differences():
    layer = _layer(8, 16).double()
    layer.profile = FP32.replace(dtype="float32")
    x = torch.randn(3, 16, dtype=torch.float64, requires_grad=True)
    f = lambda x_, w_: linear(x_.float(), w_.float(), layer.profile).double()  # noqa: E731
    y = f(x, layer.weight)
    (g_y,) = torch.randn_like(y)[None]
    y.backward(g_y)
    eps = 1e-3
    for idx in [(0, 0), (2, 5), (1, 15)]:
        xp, xm = x.detach().clone(), x.detach().clone()
        xp[idx] += eps
        xm[idx] -= eps
        fd = ((f(xp, layer.weight) - f(xm, layer.weight)) * g_y).sum() / (2 * eps)
        assert x.grad[idx].item() == pytest.approx(fd.item(), rel=1e-2, abs=1e-3)


@pytest.mark.parametrize("name", ["te-nvfp4", "minite"])
def test_nvfp4_forward_backward_equal_dequantized_reference(name):
    """Forward/backward equal the spelled-out NVFP4 recipe (SR replaced by RNE so both sides are deterministic)."""
    p = get_profile(name)
    p = p.replace(grad=p.grad.__class__(**{**p.grad.__dict__, "rounding": "rne"}), dtype="float32")
    layer = _layer(32, 64)
    x = torch.randn(40, 64, requires_grad=True)  # 40 tokens: not a multiple of 16 (wgrad pads)
    y = linear(x, layer.weight, p)
    dy = torch.randn_like(y)
    y.backward(dy)

    w, a = p.weight, p.activation
    q = lambda t, spec, **kw: dequantize(quantize(t, block=spec.block, scale_mode=kw.get("scale_mode", spec.scale_mode), math=spec.math))  # noqa: E731
    y_ref = q(x.detach(), a) @ q(layer.weight.detach(), w).t()
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    dx_ref = q(dy, p.grad) @ q(layer.weight.detach().t().contiguous(), w).t()
    torch.testing.assert_close(x.grad, dx_ref, atol=1e-5, rtol=1e-5)
    pad = lambda t: F.pad(t, (0, 0, 0, 8))  # noqa: E731  40 -> 48 tokens
    t_fn = (lambda t: rht(t, p.wgrad_rht_dtype)) if p.wgrad_rht else (lambda t: t)
    dw_ref = (q(t_fn(pad(dy).t().contiguous()), p.grad, scale_mode="tensor")
              @ q(t_fn(pad(x.detach()).t().contiguous()), a, scale_mode=p.wgrad_input_scale_mode).t())
    torch.testing.assert_close(layer.weight.grad, dw_ref, atol=1e-4, rtol=1e-5)


def test_sampler_profiles_have_no_backward():
    layer = _layer()
    layer.profile = get_profile("vllm-marlin-w4a16")
    x = torch.randn(4, 64, requires_grad=True)
    with pytest.raises(RuntimeError, match="no backward"):
        layer(x).sum().backward()


def test_saved_activation_bytes_packed():
    """An NVFP4 layer saves only the packed x^T: <= 0.3x the bytes bf16 saves for x."""
    def saved_activation_bytes(profile):
        layer = _layer(64, 256)
        layer.profile = profile
        x = torch.randn(512, 256).requires_grad_()
        total = 0

        def pack(t):
            nonlocal total
            if t.numel() != layer.weight.numel():  # skip the weight and its casts/transposes
                total += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            layer(x.bfloat16())
        return total

    bf16, nvfp4 = saved_activation_bytes(PROFILES["bf16"]), saved_activation_bytes(PROFILES["minite"])
    assert bf16 == 512 * 256 * 2
    assert nvfp4 <= 0.3 * bf16


def _tiny_model(seed=0):
    model = CausalLM(PRESETS["tiny-moe"]).init_weights(seed, std=0.2)
    ids = torch.randint(0, model.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(seed))
    return model, ids


def test_te_nvfp4_knob_by_knob_becomes_minite():
    """The forward of te-nvfp4, with each differing knob switched to minite's value, is bitwise minite."""
    model, ids = _tiny_model()
    te, mt = PROFILES["te-nvfp4"], PROFILES["minite"]
    steps = [
        ("weight.block", (1, 16)),
        ("activation.scale_mode", "row"),
        ("router_dtype", "float32"),
        ("lm_head_dtype", "float32"),
        ("fused_weight_scale", True),
    ]
    logits = {}
    p = te
    set_profile(model, p)
    with torch.no_grad():
        logits["te"] = model(ids)
        for knob, value in steps:
            p = p.replace(**{knob: value})
            set_profile(model, p)
            logits[knob] = model(ids)
        set_profile(model, mt)
        ref = model(ids)
    assert not torch.equal(logits["te"], ref)  # the knobs matter
    torch.testing.assert_close(logits[steps[-1][0]], ref, atol=0, rtol=0)
    # forward-only knobs left (grad RHT) do not touch the forward: p differs from minite only in backward knobs
    assert p.replace(wgrad_rht=False, wgrad_rht_dtype="float32", name="minite") == mt


def test_fused_weight_scale_shares_qkv_global_scale():
    """Under fused_weight_scale q/k/v quantize with the amax of q|k|v, as vLLM's fused QKV layer (and our export)."""
    from minite_core.model.nvfp4_io import shared_weight_amax
    from minite_core.kernels import dispatch

    model, ids = _tiny_model()
    attn = model.model.layers[0].self_attn
    with torch.no_grad():
        attn.k_proj.weight.mul_(3.0)  # k holds the group's amax
    p = PROFILES["minite"]
    set_profile(model, p)
    model(ids)
    amax = shared_weight_amax(model)["model.layers.0.self_attn.q_proj"]
    ref_q = dispatch.quantize(attn.q_proj.weight.detach().float(), p.weight, amax=amax)
    cached = attn.q_proj.weight_cache[(("w", "n", True), p.weight)][1]
    assert torch.equal(cached.data, ref_q.data) and torch.equal(cached.global_scale, ref_q.global_scale)
    with torch.no_grad():  # an optimizer-style in-place update of k invalidates q's cached operand
        attn.k_proj.weight.mul_(2.0)
    model(ids)
    assert attn.q_proj.weight_cache[(("w", "n", True), p.weight)][1].global_scale != cached.global_scale


def test_grouped_equals_per_expert_linear():
    """The padded sorted layout changes nothing: each expert's rows get exactly a dense `linear` on them."""
    g = GroupedLinear(3, 32, 16)
    torch.nn.init.normal_(g.weight)
    top_idx = torch.tensor([0] * 5 + [2] * 11)[torch.randperm(16, generator=torch.Generator().manual_seed(0))]
    layout = moe_layout(top_idx[:, None], 3)
    x = torch.randn(16, 32)
    x_pad = permute(x, layout)
    assert layout.num_rows == padded_rows(16, 1, 3) and torch.equal(x_pad[layout.dest[:, 0]], x)
    for name in ["bf16", "te-nvfp4", "minite"]:
        g.profile = PROFILES[name]
        y = g(x_pad, layout)[layout.dest[:, 0]]  # back to token order
        for e in (0, 2):
            rows = (top_idx == e).nonzero().flatten()
            torch.testing.assert_close(y[rows], linear(x[rows], g.weight[e], g.profile), atol=0, rtol=0)
    assert torch.equal(layout.offs, torch.tensor([0, 16, 16, padded_rows(16, 1, 3)]))


def test_calibrate_records_input_amax_and_static_profile_needs_it():
    model, ids = _tiny_model()
    set_profile(model, "vllm-nvfp4")
    with pytest.raises(RuntimeError, match="calibrate"):
        model(ids)
    seen = {}
    q_proj = model.model.layers[0].self_attn.q_proj
    def record(module, args):
        seen.setdefault("x", args[0].detach().abs().amax())  # first call = the calibration forward

    h = q_proj.register_forward_pre_hook(record)
    amax = calibrate(model, [ids])
    h.remove()
    assert q_proj.profile.name == "vllm-nvfp4"  # restored
    assert amax["model.layers.0.self_attn.q_proj"] == pytest.approx(seen["x"].item())
    assert model(ids).isfinite().all()


def test_every_profile_runs_forward_and_learner_profiles_backward():
    model, ids = _tiny_model()
    calibrate(model, [ids])
    for name, p in PROFILES.items():
        set_profile(model, p)
        out = model(ids)
        assert out.isfinite().all(), name
        sampler_emulation = p.kernel_rounding != "rne"  # vLLM CPU kernels' truncating casts: inference only
        if p.grad is not None or (p.weight is None and not sampler_emulation):
            out.logsumexp(-1).mean().backward()
            assert all(q.grad is not None and q.grad.isfinite().all() for q in model.parameters() if q.requires_grad), name
            model.zero_grad()


def test_weight_cache_follows_fused_optimizer_steps():
    """Fused AdamW updates weights without bumping weight._version; track_optimizer clears the caches."""
    from minite_core.nn import clear_weight_caches, track_optimizer

    model, ids = _tiny_model()
    set_profile(model, "minite")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    track_optimizer(opt, model)
    for _ in range(2):
        model(ids).logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        cached = model(ids)
        clear_weight_caches(model)
        fresh = model(ids)
    torch.testing.assert_close(cached, fresh, atol=0, rtol=0)


def test_expert_weights_quantized_once_per_weight_version(monkeypatch):
    from minite_core.kernels import dispatch

    model, ids = _tiny_model()
    set_profile(model, "minite")
    calls = []
    real = dispatch.prepare_weight
    monkeypatch.setattr(dispatch, "prepare_weight", lambda t, **kw: calls.append(1) or real(t, **kw))
    with torch.no_grad():
        model(ids)
        first = len(calls)
        model(ids)
    assert first > 0 and len(calls) == first  # the second forward reuses every quantized weight, experts included


@pytest.mark.parametrize("name", ["minite", "te-nvfp4"])
def test_fused_group_quantizes_its_input_once(name, monkeypatch):
    """q/k/v (and gate/up) quantize their shared input once (nn.operands.InputQuant): the forward operand and the
    saved xᵀ are reused by every member, and the loss and every gradient equal the per-member quantization's."""
    import importlib

    from minite_core.kernels import dispatch

    linear_mod = importlib.import_module("minite_core.nn.linear")  # the package exports the function `linear`

    cfg = PRESETS["tiny-moe"].replace(num_hidden_layers=2)
    ids = torch.randint(0, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    counts = {}

    def step(share: bool):
        torch.manual_seed(0)
        model = set_profile(CausalLM(cfg).init_weights(seed=3), name)
        calls = {"quantize_dq": 0, "quantize_cols": 0}
        for fn in calls:
            orig = getattr(dispatch, fn)

            def counted(*a, _orig=orig, _fn=fn, **kw):
                calls[_fn] += 1
                return _orig(*a, **kw)
            monkeypatch.setattr(dispatch, fn, counted)
        if not share:
            monkeypatch.setattr(linear_mod, "input_quant", lambda group: None)
        loss = model(ids).logsumexp(-1).mean()
        loss.backward()
        monkeypatch.undo()
        counts[share] = calls
        groups = {id(m.fused_group): m.fused_group for m in model.modules() if getattr(m, "fused_group", ())}
        counts["saved"] = sum(len(g) - 1 for g in groups.values())  # quantizations a group saves
        return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    loss_sut, grads_sut = step(True)
    loss_ref, grads_ref = step(False)
    assert torch.equal(loss_sut, loss_ref)
    assert grads_sut.keys() == grads_ref.keys()
    for n in grads_ref:
        assert torch.equal(grads_sut[n], grads_ref[n]), n
    # q/k/v share one forward quantization and one saved xᵀ (2 fewer of each per layer), a dense MLP's gate/up 1
    assert counts["saved"] >= 2 * cfg.num_hidden_layers
    assert counts[False]["quantize_dq"] - counts[True]["quantize_dq"] == counts["saved"]
    assert counts[False]["quantize_cols"] - counts[True]["quantize_cols"] == counts["saved"]


def test_fused_group_shares_its_input_quantization_under_inference_mode():
    """A sampler's forward (torch.inference_mode: inference tensors keep no version counter) shares the q/k/v input
    quantization too, with the same logits as without sharing (static scales: vllm-nvfp4 after calibration)."""
    import importlib

    linear_mod = importlib.import_module("minite_core.nn.linear")
    cfg = PRESETS["tiny-moe"].replace(num_hidden_layers=2)
    ids = torch.randint(0, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    model = CausalLM(cfg).init_weights(seed=3)
    for name in ("minite", "vllm-nvfp4"):
        set_profile(model, name)
        if get_profile(name).needs_calibration:
            calibrate(model, [ids])
        with torch.inference_mode():
            shared = model(ids)
            input_quant = linear_mod.input_quant
            linear_mod.input_quant = lambda group: None
            try:
                plain = model(ids)
            finally:
                linear_mod.input_quant = input_quant
        assert torch.equal(shared, plain), name
