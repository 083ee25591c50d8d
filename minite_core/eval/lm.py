"""`minite`: an lm-eval model that scores a checkpoint under one execution profile.

What: `lm_eval.simple_evaluate(model="minite", model_args="pretrained=DIR,profile=NAME,...")` loads the checkpoint
with our `load_pretrained`, runs it under the named profile (`use_profile`) and answers lm-eval's three request types:
- `loglikelihood` (multiple choice): one right-padded full-sequence forward per batch, log-softmax in fp32, the sum
  of the continuation's token log-probs + whether greedy decoding would produce it;
- `loglikelihood_rolling` (perplexity): lm-eval's disjoint rolling windows over the string, scored the same way;
- `generate_until`: greedy decoding through the RL stage's own rollout engine (`engines.make_sampler`: the fast
  CUDA-graph sampler on the GPU, the reference on CPU; temperature 0, KV cache, left padding), then the text cut
  at the first stop string — so an eval score is what the *sampler* of the RL loop would produce under that
  profile, not a separate decoding path.

Why our own model and not lm-eval's `hf`: `hf` runs transformers' modules, which know nothing of NVFP4 execution
profiles; here every GEMM runs the profile's numerics. The peer check (tests/test_eval.py) runs the same
checkpoint through `hf` (fp32) and through `minite` with the bf16 profile promoted to fp32 and finds the same
scores, so any difference under another profile is the profile's.

Conventions, chosen to match lm-eval's `hf` model request by request:
- tokenization is `TemplateLM`'s: `tok(text)` prepends `<bos>` (our tokenizer's convention, and `hf`'s default for a
  BOS-adding tokenizer); a continuation is the tail of `tok(context + continuation)`; inputs longer than
  `max_length` are left-truncated; `max_length` defaults to the config's `max_position_embeddings` (as `hf`).
- rolling log-likelihoods encode the string WITHOUT `<bos>` and condition on `<bos>` as the prefix token. `hf`
  encodes it with `<bos>` and then also prefixes `<bos>`, so it scores an extra `log p(<bos> | <bos>)`; we
  deliberately differ (that term is not part of the text's likelihood).
- `dtype=float32` promotes the profile's compute, router and LM-head dtypes to fp32 (the peer-check setting);
  parameters are always loaded as fp32 masters and cast per op by the profile.
- chat: `apply_chat_template` renders lm-eval's messages with the tokenizer's own chat template (the
  checkpoint's), as `hf` does, when `simple_evaluate(apply_chat_template=True)` asks for it.
- static-scale profiles (`vllm-nvfp4`) need calibrated activation amaxes: taken from the checkpoint when it
  carries them (unless `recalibrate=True`), else computed on `calib=PATH.jsonl` (`calib_n` examples chosen by
  `seed`) by the path every stage shares (engines.calibration: the same examples give RL's scales), else an
  error.

Batch composition matters under per-tensor dynamic activation scales (the amax is over every token of the batch,
pads included), exactly as in the engines; requests are ordered deterministically (longest first), so a run is
reproducible but a different `batch_size` may move scores slightly under such profiles.
"""
from __future__ import annotations

import json

import lm_eval.models  # noqa: F401  populate lm-eval's registry first (it imports built-ins only when empty)
import torch
import torch.nn.functional as F
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from tqdm import tqdm

from minite_core.engines.calibration import calibrate_on_examples
from minite_core.engines.fast_sampler import make_sampler
from minite_core.model import load_pretrained, use_profile
from minite_core.nn import is_calibrated
from minite_core.profiles import Profile, get_profile
from minite_core.task.jsonl import read_jsonl
from minite_core.task.tokenizer import load_tokenizer

DTYPES = ("auto", "float32", "bfloat16")


def eval_profile(name: str | Profile, dtype: str = "auto") -> Profile:
    """The profile an eval runs: as registered ("auto"), or with compute/router/LM-head dtypes set to `dtype`."""
    profile = get_profile(name)
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of {list(DTYPES)}")
    if dtype == "auto":
        return profile
    return profile.replace(dtype=dtype, router_dtype=dtype, lm_head_dtype=dtype)


def _flag(value) -> bool:
    """model_args arrive as strings from lm-eval's arg parser ("True"/"false"/"1") or as Python values."""
    return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes")


@register_model("minite")
class MiniteLM(TemplateLM):
    """lm-eval model over `minite_core.model.CausalLM` under an execution profile (see the module docstring)."""

    def __init__(self, pretrained: str, profile: str = "bf16", dtype: str = "auto", batch_size: int | str = 8,
                 max_batch_size: int | None = None, device: str | None = None, tokenizer: str | None = None,
                 calib: str | None = None, calib_n: int = 32, max_length: int | None = None,
                 recalibrate: bool = False, max_gen_toks: int = 256, seed: int = 0, engine: str | None = None):
        super().__init__()
        del max_batch_size  # lm-eval passes it for "auto" batch sizing, which we do not implement
        if str(batch_size).startswith("auto"):
            raise ValueError("minite: batch_size='auto' is not supported; give an integer")
        self.batch_size_per_call = int(batch_size)
        if self.batch_size_per_call < 1:
            raise ValueError(f"minite: batch_size must be >= 1, got {batch_size}")
        self._device = torch.device(device or "cpu")
        self.profile = eval_profile(profile, dtype)
        self.pretrained = str(pretrained)
        self.model = load_pretrained(pretrained, dtype=torch.float32, device=self._device).eval()
        self.tokenizer = load_tokenizer(tokenizer or pretrained)
        if len(self.tokenizer) > self.model.config.vocab_size:
            raise ValueError(f"minite: tokenizer has {len(self.tokenizer)} tokens > model vocab "
                             f"{self.model.config.vocab_size}")
        self.seed = int(seed)
        self.engine = engine or None  # the rollout engine of generate_until (None: automatic for the device)
        self.calibration = self._calibrate(calib, int(calib_n), _flag(recalibrate))
        self._max_length = int(max_length) if max_length else self.model.config.max_position_embeddings
        self._max_gen_toks = int(max_gen_toks)

    # ---- setup -------------------------------------------------------------------------------------------------
    def _calibrate(self, calib: str | None, n: int, recalibrate: bool) -> dict:
        """Static activation scales for profiles that need them: the checkpoint's (what a vLLM deployment of that
        checkpoint would use), else — or with `recalibrate` — computed on `calib`; neither is an error."""
        if not self.profile.needs_calibration:
            return {"source": "none"}
        if is_calibrated(self.model) and not recalibrate:
            return {"source": "checkpoint"}
        if calib is None:
            raise ValueError(
                f"minite: profile {self.profile.name!r} uses static (calibrated) activation scales, but checkpoint "
                f"{self.pretrained} carries none: pass calib=PATH.jsonl (e.g. the task's train split) in model_args "
                "or --calib to `minite eval`")
        with use_profile(self.model, self.profile):  # in the profile's compute dtype, as the exporter calibrates
            info = calibrate_on_examples(self.model, self.tokenizer, read_jsonl(calib), n=n, seed=self.seed)
        return {"source": str(calib), "n": n, **info}

    # ---- TemplateLM plumbing -----------------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        return self.tokenizer.bos_token_id if self.tokenizer.bos_token_id is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name_or_path.replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.tokenizer.chat_template if chat_template else None

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        if not self.tokenizer.chat_template:
            raise ValueError(f"minite: tokenizer of {self.pretrained} has no chat template; evaluate without "
                             "apply_chat_template")
        return self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        if add_special_tokens is None:  # as lm-eval's hf: no second <bos> if the text already starts with one
            add_special_tokens = not string.startswith(self.tokenizer.bos_token or "\0")
        return self.tokenizer.encode(string, add_special_tokens=add_special_tokens)

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    # ---- scoring -----------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs: int | None = None):
        """requests: [(cache_key, context_ids, continuation_ids)] -> [(sum log p(continuation), is_greedy)].
        Shapes: B = batch, L = padded input length, V = vocab."""
        # longest first (as hf): the first batch is the largest, and order is deterministic
        order = sorted(range(len(requests)), key=lambda i: -len(requests[i][1] + requests[i][2]))
        bs = override_bs or self.batch_size_per_call
        out: list[tuple[float, bool] | None] = [None] * len(requests)
        for start in tqdm(range(0, len(order), bs), disable=disable_tqdm, desc="minite loglikelihood"):
            idx = order[start:start + bs]
            inps, spans = [], []
            for i in idx:
                _, ctx, cont = requests[i]
                if not cont:
                    raise ValueError(f"minite: empty continuation in request {requests[i][0]!r}")
                inp = (ctx + cont)[-(self.max_length + 1):][:-1]  # the last token is only predicted
                inps.append(inp)
                spans.append((len(inp) - len(cont), len(inp)))  # positions whose next-token logits score cont
            L = max(map(len, inps))
            ids = torch.full((len(inps), L), self.tokenizer.pad_token_id, dtype=torch.long)  # (B, L) right-padded
            for b, inp in enumerate(inps):
                ids[b, :len(inp)] = torch.tensor(inp, dtype=torch.long)
            # right padding never reaches a real position through causal attention: no mask needed (as hf)
            with use_profile(self.model, self.profile):
                logp = F.log_softmax(self.model(ids.to(self._device)).float(), dim=-1)  # (B, L, V)
            for b, i in enumerate(idx):
                lo, hi = spans[b]
                cont = torch.tensor(requests[i][2], dtype=torch.long, device=self._device)
                lp = logp[b, lo:hi]  # (len(cont), V)
                answer = (float(lp.gather(-1, cont[:, None]).sum()), bool((lp.argmax(-1) == cont).all()))
                out[i] = answer
                if requests[i][0] is not None:
                    self.cache_hook.add_partial("loglikelihood", requests[i][0], answer)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        windows, owner = [], []
        for r, (string,) in enumerate(req.args for req in requests):
            tokens = self.tok_encode(string, add_special_tokens=False)  # <bos> is the prefix token, not text
            for ctx, cont in map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
                    token_list=tokens, prefix_token=self.prefix_token_id, max_seq_len=self.max_length,
                    context_len=1)):
                windows.append((None, ctx, cont))
                owner.append(r)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
        totals = [0.0] * len(requests)
        for r, (lp, _) in zip(owner, scores):
            totals[r] += lp
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy decoding via the RL stage's sampler engine (`engines.make_sampler`); requests grouped by their
        generation kwargs."""
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            groups.setdefault(json.dumps(req.args[1], sort_keys=True, default=str), []).append(i)
        eos_text = self.tokenizer.decode([self.eot_token_id], skip_special_tokens=False)
        out: list[str | None] = [None] * len(requests)
        sampler = make_sampler(self.model, self.profile, engine=self.engine, device=self._device)
        for members in groups.values():
            kwargs = normalize_gen_kwargs(requests[members[0]].args[1], self.max_gen_toks)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos_text)
            max_gen_toks = int(kwargs.pop("max_gen_toks"))
            if kwargs.get("do_sample") or float(kwargs.get("temperature", 0.0)) > 0:
                raise ValueError(f"minite: generate_until supports greedy decoding only, got {kwargs}")
            max_ctx = self.max_length - max_gen_toks
            if max_ctx <= 0:
                raise ValueError(f"minite: max_gen_toks={max_gen_toks} leaves no context within "
                                 f"max_length={self.max_length}")
            # longest prompt first (as hf), so batches hold similar lengths and the order is deterministic
            members = sorted(members, key=lambda i: (-len(self.tok_encode(requests[i].args[0])), i))
            prompts = [self.tok_encode(requests[i].args[0])[-max_ctx:] for i in members]
            rollout = sampler.generate(prompts, max_new_tokens=max_gen_toks, temperature=0.0,
                                       stop_ids=(self.eot_token_id,), seed=self.seed,
                                       batch_size=self.batch_size_per_call)
            for i, resp in zip(tqdm(members, disable=disable_tqdm, desc="minite generate_until"),
                               rollout.response_ids):
                text = postprocess_generated_text(self.tok_decode(resp), stop=until, think_end_token=None)
                out[i] = text
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return out
