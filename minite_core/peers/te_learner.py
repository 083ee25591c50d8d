"""TELearner: the te-nvfp4 learner through NVIDIA Transformer Engine itself (sm_100+ only; optional peer).

What it would do. Our `Learner(model, "te-nvfp4")` *emulates* TE's NVFP4 recipe with the bit-exact reference in
`formats.nvfp4`. This adapter runs the real thing for the same weights, so the emulation can be checked against
TE on a Blackwell GPU and TE can stand in as the learner of a learner<->sampler pair:
  1. For every decoder GEMM of our CausalLM, build a `transformer_engine.pytorch.Linear(in, out, bias=False,
     params_dtype=torch.bfloat16)` and copy the master weight into it (experts: one TE Linear per expert, or
     `te.pytorch.GroupedLinear(num_experts, ...)` fed with the per-expert token counts our router computes).
  2. Swap them in with forward hooks on our QuantLinear / GroupedLinear modules (module names unchanged, so
     traces and first-divergence hooks address both engines alike); attention, norms, router and LM head stay in
     our bf16 code, as TE's recipe leaves them in high precision too.
  3. Run the full-sequence forward under
        recipe = transformer_engine.common.recipe.NVFP4BlockScaling()   # TE defaults, see below
        with te.pytorch.fp8_autocast(enabled=True, fp8_recipe=recipe):  # TE >= 2.8: `te.pytorch.autocast`
            logits = model(input_ids, attention_mask=...)
     and take log-softmax of the response positions exactly as `engines.learner.Learner.logprobs` does.
  NVFP4BlockScaling defaults (TE 2.8+ docs), which our `te-nvfp4` profile mirrors knob for knob: weights 2D 16x16
  blocks, activations and gradients 1x16, per-tensor fp32 amax (dynamic), E4M3 block scales, the exact quantizer
  arithmetic (FlashInfer-without-fast-math order), stochastic rounding on gradients, random Hadamard transform on
  the wgrad operands, GEMMs through cuBLASLt's FP4 block-scaled kernels (`tcgen05`) with fp32 accumulation.
  Weights are re-quantized every forward from the bf16 masters (TE caches the quantized weight per micro-batch).
Why it cannot run here: TE's NVFP4 kernels need compute capability >= 10.0 (B200/B300/GB200); H200 is sm_90 and
this machine has no GPU. So `available()` returns (False, reason) and `TELearner(...)` raises with that reason;
nothing falls back to our emulation silently. The test skips with the same reason.
"""
from __future__ import annotations

import importlib.util

from minite_core.profiles import get_profile

MIN_CAPABILITY = (10, 0)  # NVFP4 block-scaled tensor cores: Blackwell (sm_100) and newer


def available() -> tuple[bool, str]:
    """(True, detail) only with transformer_engine importable, a CUDA GPU of sm_100+, and NVFP4BlockScaling."""
    if importlib.util.find_spec("transformer_engine") is None:
        return False, ("transformer_engine is not installed (optional extra `te`: transformer-engine[pytorch] "
                       "on a Blackwell sm_100+ machine; see README)")
    import torch

    if not torch.cuda.is_available():
        return False, "Transformer Engine NVFP4 needs a CUDA GPU (none visible)"
    cap = torch.cuda.get_device_capability()
    if cap < MIN_CAPABILITY:
        return False, (f"Transformer Engine NVFP4 needs compute capability >= {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}"
                       f" (Blackwell); this GPU ({torch.cuda.get_device_name()}) is sm_{cap[0]}{cap[1]}")
    try:
        from transformer_engine.common.recipe import NVFP4BlockScaling  # noqa: F401  (TE >= 2.8)
    except ImportError as e:
        return False, f"this transformer_engine has no NVFP4BlockScaling recipe (needs TE >= 2.8): {e}"
    return True, "transformer_engine with NVFP4BlockScaling on sm_100+"


class TELearner:
    """Learner interface (`logprobs(prompt_ids, response_ids, temperature=)`) backed by TE's NVFP4 recipe.
    Construction raises with the reason when `available()` is False (always, on CPU / Hopper)."""

    def __init__(self, model, profile="te-nvfp4"):
        ok, reason = available()
        if not ok:
            raise RuntimeError(f"TELearner unavailable: {reason}")
        self.model, self.profile = model, get_profile(profile)
        # The adapter body (steps 1-3 of the module docstring) needs an sm_100 machine to be written against and
        # tested; until one is lent, reaching this line is an error rather than an untested code path.
        raise NotImplementedError("TELearner needs an sm_100+ machine to be implemented and validated on")

    def logprobs(self, prompt_ids, response_ids, *, temperature: float = 1.0):  # pragma: no cover
        raise NotImplementedError
