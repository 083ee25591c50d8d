"""Real vLLM as the rollout engine: a sampler named `vllm:<mode>` (as `te:<mode>` names a real-TE learner).

What. `VLLMRollout(model, mode)` exports our CausalLM into a directory vLLM loads, starts vLLM's offline engine
on it (peers.vllm_sampler.VLLMSampler: `LLM(...)`, `SamplingParams(logprobs=1)`, prompt token ids in through
`TokensPrompt`, no tokenizer round trip, the processed log-prob of each sampled token out) and returns the same
`Rollout` as engines.sampler.Sampler. After each optimizer step `push_weights()` loads the policy's current
weights into the running engine, so RL (`minite rl --sampler vllm:nvfp4`) samples from the policy it trains.

Modes (MODES): what is exported and which vLLM kernels run it.
  bf16             model.io's transformers layout in bf16 (the calibrated input_amax buffers left out: vLLM's
                   loader rejects unknown names); vLLM's own bf16 kernels (FlashAttention, Triton fused MoE).
  nvfp4            model.nvfp4_io's compressed-tensors W4A4 checkpoint, quantized by the `vllm-nvfp4` profile
                   (1x16 block scales, per-tensor global scale, fast math, the calibrated static input scale:
                   the run calibrates once at the start, as the emulated naive stack does); vLLM picks the kernel:
                   on Hopper Marlin W4A16 (no FP4 tensor cores: activations stay bf16, our profile
                   `vllm-marlin-w4a16`), on Blackwell FlashInfer / CUTLASS W4A4 (`vllm-nvfp4`).
  nvfp4-emulation  the same checkpoint through vLLM's software W4A4 (`linear_backend` / `moe_backend`
                   "emulation": ref_nvfp4_quant with the static input scale, dequantize, bf16 matmul).

Weight push, the way open RL frameworks do it. OpenRLHF's `WorkerWrap.update_weight`
(openrlhf/trainer/ray/vllm_worker_wrap.py) calls `self.model_runner.model.load_weights(weights=[(name, weight)])`
inside the vLLM worker; NeMo-RL's `VllmInternalWorkerExtension` (nemo_rl/models/generation/vllm/vllm_backend.py,
`_load_full_hf_weights`) does the same within vLLM's layerwise reload (vllm/model_executor/model_loader/reload),
which re-runs each layer's process_weights_after_loading — needed once a quantized layer's parameters were
repacked for its kernel (Marlin), since load_weights takes checkpoint-format tensors. vLLM 0.26 exposes exactly
that as the worker method `reload_weights(weights_iterator, is_checkpoint_format=True)`
(v1/worker/gpu_model_runner.py); we call it through `LLM.collective_rpc` with the engine core in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0: the uniproc executor calls the worker directly, the tensors are handed over,
not serialised), then `LLM.reset_prefix_cache()`: prompt KV cached under the old weights must not be reused.
The pushed tensors are the ones the export writes (same function), so the engine always runs the file's bits.
The reload copies each re-processed layer's parameters and buffers back into their old storage (CUDA graphs
captured at start read those addresses), but not the tensors vLLM 0.26's NVFP4 path keeps as plain module
attributes and makes anew on every processing (the compressed-tensors NVFP4 MoE's global scales, Marlin's lock
workspace): `vllm_sampler.reload_weights_in_place` holds those through the reload and copies the new values into them.

Not here: routes (vLLM does not expose the experts it executed, so a routing-replay learner cannot pair with it)
and multi-process RL (one engine in the process that trains). A missing vLLM raises one line naming what is
missing and docs/vllm-gpu.md (`available()`), never a fallback to our emulation.
"""
from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from minite_core.engines.sampler import Rollout, check_generate_args
from minite_core.model.io import CONFIG_NAME, WEIGHTS_NAME, to_hf_state_dict, write_safetensors
from minite_core.model.nvfp4_io import nvfp4_checkpoint
from minite_core.model.routing import moe_layers
from minite_core.profiles import PROFILES, Profile
from minite_core.results import atomic_write_bytes
from minite_core.task.tokenizer import EOS_ID, save_tokenizer

SAMPLER_PREFIX = "vllm:"
DOCS = "docs/vllm-gpu.md"
_AMAX = ".input_amax"


@dataclass(frozen=True)
class VLLMMode:
    """One way of running our model in vLLM. `profile`: our profile that calibrates and quantizes the export
    (its weight quantizer writes the codes); `llm_kwargs`: what the mode asks of `vllm.LLM`."""

    name: str
    export: str  # "bf16" | "nvfp4"
    profile: Profile
    llm_kwargs: dict = field(default_factory=dict)


MODES: dict[str, VLLMMode] = {m.name: m for m in (
    VLLMMode("bf16", "bf16", PROFILES["bf16"]),
    VLLMMode("nvfp4", "nvfp4", PROFILES["vllm-nvfp4"]),
    VLLMMode("nvfp4-emulation", "nvfp4", PROFILES["vllm-nvfp4"],
             {"linear_backend": "emulation", "moe_backend": "emulation"}),
)}


def sampler_mode(name: str) -> str | None:
    """The mode of a real-vLLM sampler name `vllm:<mode>`, None for any other name (one of our profiles)."""
    return name[len(SAMPLER_PREFIX):] if isinstance(name, str) and name.startswith(SAMPLER_PREFIX) else None


def get_mode(mode: str | VLLMMode) -> VLLMMode:
    if isinstance(mode, VLLMMode):
        return mode
    try:
        return MODES[mode]
    except KeyError:
        raise ValueError(f"unknown vLLM mode {mode!r}; one of {sorted(MODES)} (a sampler `vllm:<mode>`)") from None


def available() -> tuple[bool, str]:
    """(True, "vllm <version>") when vLLM is importable, else (False, one line naming what is missing + DOCS)."""
    from minite_core.peers import vllm_sampler

    ok, reason = vllm_sampler.available()
    return ok, reason if ok or DOCS in reason else f"{reason} ({DOCS})"


def require() -> None:
    ok, reason = available()
    if not ok:
        raise RuntimeError(f"the vllm: sampler cannot run: {reason}")


# ---- export ---------------------------------------------------------------------------------------------------
def checkpoint_tensors(model, mode: str | VLLMMode) -> tuple[dict[str, torch.Tensor], dict]:
    """(checkpoint name -> tensor, config.json dict) of `model` in `mode`'s export format: what `export` writes
    and `push_weights` loads."""
    mode = get_mode(mode)
    if mode.export == "nvfp4":
        return nvfp4_checkpoint(model, profile=mode.profile)
    tensors = {k: v for k, v in to_hf_state_dict(model, torch.bfloat16).items() if not k.endswith(_AMAX)}
    return tensors, model.config.to_hf(dtype="bfloat16")


def export(model, mode: str | VLLMMode, path: str | Path, tokenizer=None) -> Path:
    """Write `model` as a checkpoint directory vLLM loads (config.json + model.safetensors, + the tokenizer)."""
    tensors, hf = checkpoint_tensors(model, mode)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    write_safetensors(path / WEIGHTS_NAME, tensors, {"format": "pt"})
    atomic_write_bytes(path / CONFIG_NAME, (json.dumps(hf, indent=2) + "\n").encode())
    if tokenizer is not None:
        save_tokenizer(tokenizer, path)
    return path


# ---- the engine -----------------------------------------------------------------------------------------------
class VLLMRollout:
    """Rollout engine backed by a running vLLM engine on `model`'s exported weights (module docstring).
    `model` stays ours (the learner's; weight sync = `push_weights()`); `profile` is the mode's profile, the one
    the run calibrates with and evaluation reports. `llm_kwargs` go to `vllm.LLM` (e.g. gpu_memory_utilization)."""

    def __init__(self, model, mode: str | VLLMMode, *, tokenizer, seed: int = 0, workdir: str | Path | None = None,
                 max_model_len: int | None = None, max_num_seqs: int = 256, gpu_memory_utilization: float = 0.3,
                 enforce_eager: bool = False, full_rows: bool = False, **llm_kwargs):
        require()
        from minite_core.peers.vllm_sampler import VLLMSampler

        self.model, self.mode = model, get_mode(mode)
        self.profile, self.name = self.mode.profile, SAMPLER_PREFIX + self.mode.name
        self._tmp = None if workdir is not None else tempfile.TemporaryDirectory(prefix="minite-vllm-")
        self.checkpoint = export(model, self.mode, Path(workdir or self._tmp.name) / "checkpoint", tokenizer)
        device = next(model.parameters()).device
        kwargs = {"gpu_memory_utilization": gpu_memory_utilization} if device.type == "cuda" else {}
        # full_rows: max_logprobs = the vocabulary, so generate(keep_logprob_rows=True) can ask for every token
        # what the engine is started with besides the checkpoint, dtype and seed (a fresh engine on other
        # weights is started the same way: vllm_measure push-check)
        self.engine_kwargs = {"max_model_len": max_model_len, "max_num_seqs": max_num_seqs,
                              "enforce_eager": enforce_eager,
                              "max_logprobs": model.config.vocab_size if full_rows else 1,
                              **self.mode.llm_kwargs, **kwargs, **llm_kwargs}
        self.engine = VLLMSampler(self.checkpoint, dtype="bfloat16", seed=seed, **self.engine_kwargs)
        self.pushes, self.push_s = 0, 0.0  # weight pushes so far and their total wall time

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, stop_ids=(EOS_ID,), seed: int, batch_size: int | None = None,
                 record_routes: bool = False, keep_logprob_rows: bool = False) -> Rollout:
        """`Sampler.generate`'s contract through vLLM (batch_size: vLLM schedules the batch itself)."""
        check_generate_args(prompts, max_new_tokens, temperature, top_p)
        if record_routes and moe_layers(self.model):
            raise ValueError(f"sampler {self.name}: vLLM does not expose the experts it executed, so a learner that "
                             "replays the sampler's routing (routing_replay) cannot pair with it")
        return self.engine.generate(prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                    stop_ids=stop_ids, seed=seed, keep_logprob_rows=keep_logprob_rows)

    @torch.no_grad()
    def push_weights(self) -> None:
        """Load the model's current weights into the running engine (after an optimizer step, or a resume)."""
        t0 = time.perf_counter()
        tensors, _ = checkpoint_tensors(self.model, self.mode)
        self.engine.update_weights(tensors.items())
        self.pushes += 1
        self.push_s += time.perf_counter() - t0

    def kernels(self) -> dict[str, int]:
        """What vLLM runs, read from its model in the worker: "<module class>: <method> / <kernel or backend>"
        -> how many modules (e.g. MarlinNvFp4LinearKernel vs EmulationNvFp4LinearKernel, the MoE backend)."""
        return self.engine.llm.collective_rpc(describe_kernels)[0]


def describe_kernels(worker) -> dict[str, int]:
    """Runs in the vLLM worker (`LLM.collective_rpc`): every module with a quant_method, scheme or attention
    implementation, described by the class names vLLM chose for it, counted."""
    counts: dict[str, int] = {}
    for module in worker.model_runner.model.modules():
        parts = []
        for attr in ("quant_method", "scheme", "impl"):
            obj = getattr(module, attr, None)
            if obj is None:
                continue
            parts.append(type(obj).__name__)
            for inner in ("kernel", "nvfp4_backend", "unquantized_backend", "experts_cls"):
                val = getattr(obj, inner, None)
                if val is not None:
                    parts.append(getattr(val, "__name__", None) or getattr(val, "value", None) or type(val).__name__)
        if parts:
            key = f"{type(module).__name__}: {' / '.join(map(str, parts))}"
            counts[key] = counts.get(key, 0) + 1
    return counts
