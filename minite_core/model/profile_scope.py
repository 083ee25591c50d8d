"""How a profile is put on a model: for one block (`use_profile`, what every engine does), or for good on a model
one owns (`set_profile`).

A model executes the profile its modules carry: every QuantLinear / GroupedLinear of decoder layer i runs
`profile.for_layer(i, L)` (boundary layers drop to high precision), the LM head runs the profile itself (its role
picks lm_head_dtype), the RMSNorms take its batch-invariance and recompute knobs, and the model reads its compute
dtype and fused add-norm from `model.profile`.

The learner and the sampler share one module tree ("same weights, different execution"), so neither may leave
its profile behind: each runs its forward inside `use_profile(model, its profile)`, which restores on exit what
every module carried before — as Transformer Engine's `fp8_autocast` scopes its recipe. Nesting works; a block
that asks for the profile already in place costs one comparison. The autograd functions keep the profile of
their forward, so a backward after the block (the RL update) still runs the learner's numerics.

Both apply the process's knob overrides (`profiles.effective`: an environment override the run records).
"""
from __future__ import annotations

from contextlib import contextmanager

from minite_core.model.qwen3_moe import CausalLM, RMSNorm
from minite_core.nn import GroupedLinear, QuantLinear
from minite_core.profiles import Profile, effective, get_profile


def set_profile(model: CausalLM, profile: Profile | str) -> CausalLM:
    """Put `profile` on the model and every GEMM for good (module docstring): for a model the caller owns (tests,
    a freshly built copy); engines on a shared model use `use_profile`."""
    profile = effective(get_profile(profile))
    model.profile = profile
    L = model.config.num_hidden_layers
    for i, layer in enumerate(model.model.layers):
        layer_profile = profile.for_layer(i, L)
        for module in layer.modules():
            if isinstance(module, (QuantLinear, GroupedLinear)):
                module.profile = layer_profile
    model.lm_head.profile = profile
    for module in model.modules():
        if isinstance(module, RMSNorm):
            module.batch_invariant = profile.batch_invariant
            module.recompute = profile.recompute_elementwise
    return model


@contextmanager
def use_profile(model: CausalLM, profile: Profile | str):
    """Run `model` under `profile` inside the block; every module gets back what it carried before on exit."""
    profile = effective(get_profile(profile))
    if model.profile == profile:  # already in place (set by an enclosing block): nothing to change or restore
        yield model
        return
    saved = [(m, m.profile) for m in model.modules() if isinstance(m, (QuantLinear, GroupedLinear))]
    norms = [(m, m.batch_invariant, m.recompute) for m in model.modules() if isinstance(m, RMSNorm)]
    before = model.profile
    set_profile(model, profile)
    try:
        yield model
    finally:
        model.profile = before
        for module, p in saved:
            module.profile = p
        for module, batch_invariant, recompute in norms:
            module.batch_invariant, module.recompute = batch_invariant, recompute
