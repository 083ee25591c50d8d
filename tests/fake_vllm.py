"""A stand-in for the part of `vllm` that peers/vllm_sampler.py and peers/vllm_rollout.py call (LLM, SamplingParams,
inputs.TokensPrompt, platforms.current_platform, LLM.generate / collective_rpc / reset_prefix_cache /
llm_engine.model_config), in plain torch on CPU: the "engine" loads the checkpoint directory with our own loaders
(model.io for bf16, model.nvfp4_io for NVFP4, so it runs the file's bits) and generates with our reference
sampler under bf16, one request at a time with the request's own seed. `reload_weights` takes checkpoint-format
tensors as vLLM's worker does: every name must be one of the checkpoint's own (vLLM's AutoWeightsLoader rejects
unknown names), and the engine then runs exactly those tensors. It checks the adapter's side of the contract
(token-id prompts, detokenize=False, logprobs counts, processed log-probs) so tests/test_vllm_rollout.py runs
without vLLM; it says nothing about vLLM's numerics (tests/test_vllm_peer.py and the GPU commands run the real
one)."""
from __future__ import annotations

import json
import shutil
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path

from safetensors.torch import save_file

from minite_core.engines.sampler import Sampler
from minite_core.model import load_pretrained
from minite_core.model.io import CONFIG_NAME, WEIGHTS_NAME, read_safetensors
from minite_core.model.nvfp4_io import load_nvfp4

CALLS: list[tuple] = []  # (what, detail) of every engine call, in order


@dataclass
class Logprob:
    logprob: float
    rank: int


class SamplingParams:
    def __init__(self, **kw):
        assert kw["detokenize"] is False and kw["n"] == 1, kw
        self.__dict__.update(kw)


def TokensPrompt(prompt_token_ids):  # noqa: N802 - vllm.inputs.TokensPrompt is a TypedDict
    assert all(isinstance(t, int) for t in prompt_token_ids)
    return {"prompt_token_ids": prompt_token_ids}


def _load(path: Path):
    qc = json.loads((path / CONFIG_NAME).read_text()).get("quantization_config")
    return load_nvfp4(path)[0] if qc else load_pretrained(path)


class LLM:
    def __init__(self, model, tokenizer, dtype, seed, max_model_len, max_num_seqs, enforce_eager, logprobs_mode,
                 max_logprobs, **kw):
        assert logprobs_mode == "processed_logprobs" and dtype == "bfloat16"
        self.path, self.max_logprobs, self.kwargs = Path(model), max_logprobs, kw
        self.names = set(read_safetensors(self.path))  # the checkpoint's tensor names: all a reload may name
        self.model = _load(self.path)
        self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(
            get_vocab_size=lambda: self.model.config.vocab_size))
        CALLS.append(("LLM", kw))

    def generate(self, prompts, params, use_tqdm=False):
        outs = []
        for prompt, p in zip(prompts, params):
            assert p.logprobs <= self.max_logprobs, (p.logprobs, self.max_logprobs)
            r = Sampler(self.model, "bf16").generate(
                [prompt["prompt_token_ids"]], max_new_tokens=p.max_tokens, temperature=p.temperature, top_p=p.top_p,
                stop_ids=p.stop_token_ids, seed=p.seed, keep_logprob_rows=True)
            steps = []
            for tok, row in zip(r.response_ids[0], r.logprob_rows[0]):
                order = row.argsort(descending=True)
                rank = {int(t): i + 1 for i, t in enumerate(order)}
                keep = set(order[:p.logprobs].tolist()) | {tok}
                steps.append({t: Logprob(float(row[t]), rank[t]) for t in sorted(keep)})
            comp = types.SimpleNamespace(token_ids=r.response_ids[0], logprobs=steps,
                                         finish_reason="stop" if r.finished[0] else "length")
            outs.append(types.SimpleNamespace(outputs=[comp]))
        CALLS.append(("generate", len(prompts)))
        return outs

    def collective_rpc(self, method, kwargs=None):
        if callable(method):  # runs "in the worker": model_runner.model is the engine's model
            runner = types.SimpleNamespace(model=self.model, get_model=lambda: self.model)
            worker = types.SimpleNamespace(model_runner=runner, reload_weights=self._reload_weights)
            return [method(worker, **(kwargs or {}))]
        assert method == "reload_weights"
        return [self._reload_weights(**kwargs)]

    def _reload_weights(self, weights_iterator, is_checkpoint_format):
        assert is_checkpoint_format is True
        weights = dict(weights_iterator)
        unknown = set(weights) - self.names
        assert not unknown, f"reload_weights: names not in the checkpoint: {sorted(unknown)[:4]}"
        with tempfile.TemporaryDirectory() as tmp:  # the engine now runs exactly these tensors
            save_file({**read_safetensors(self.path), **weights}, str(Path(tmp) / WEIGHTS_NAME))
            shutil.copy(self.path / CONFIG_NAME, Path(tmp) / CONFIG_NAME)
            self.model = _load(Path(tmp))
        CALLS.append(("reload_weights", len(weights)))

    def reset_prefix_cache(self):
        CALLS.append(("reset_prefix_cache", None))
        return True


def modules() -> dict[str, types.ModuleType]:
    """sys.modules entries: vllm, vllm.inputs, vllm.platforms (a spec, so importlib.util.find_spec finds it)."""
    import importlib.machinery

    names = ("vllm", "vllm.inputs", "vllm.platforms")
    pkg, inputs, platforms = (types.ModuleType(n) for n in names)
    pkg.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    pkg.LLM, pkg.SamplingParams, pkg.inputs, pkg.platforms = LLM, SamplingParams, inputs, platforms
    inputs.TokensPrompt = TokensPrompt
    platforms.current_platform = types.SimpleNamespace(is_cpu=lambda: False)
    return dict(zip(names, (pkg, inputs, platforms)))
