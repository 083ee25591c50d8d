"""`minite pretrain`: SFT-pretrain the RL base model from scratch on the arithmetic task, to *partial* accuracy.

What: a Qwen3-MoE-shaped model (every layer sparse, top-k softmax router, SwiGLU experts, QK-norm, GQA) of the
size in ``PretrainConfig`` is trained with next-token cross-entropy on the response tokens only (the prompt and its
``<bos>`` are context, not targets; ``<eos>`` is a target so the model learns to stop), AdamW on fp32 master
weights, forward/backward under the ``bf16`` profile. Every ``eval_every`` steps the held-out greedy accuracy
(exact final answer, ``task.reward``) is measured on the first ``eval_per_level`` held-out examples of each level;
training stops at the first evaluation whose mean accuracy reaches ``target_accuracy[0]``, or at ``max_steps``.

Why partial accuracy: GRPO learns only from groups whose rewards differ, so the base model must solve some but not
all prompts; stopping inside the band ``target_accuracy`` leaves RL headroom and makes reward curves of the engine
pairs comparable (all start from the same checkpoint). ``in_band`` in the result says whether the stop landed
inside the band (an evaluation interval too coarse for the learning speed can jump past the upper edge).

Outputs under ``--out``: ``model/`` (transformers ``save_pretrained`` layout, fp32 weights so RL starts from the
exact masters, + the tokenizer, so lm-eval and vLLM load it as is), ``loss.csv`` (one row per step; accuracy on
evaluation steps), ``pretrain.json`` (results contract, stage "pretrain": held-out accuracy per level on the whole
held-out split, steps, time). Resumable: ``--state`` holds ``state.pt`` (checkpoint.py, every ``checkpoint_every``
steps) and the growing ``loss.csv`` (copied to ``--out`` at the end); it lives outside the rule's outputs so that
Snakemake's cleanup of a failed job does not delete it.

Measured (2-core CPU, 64-wide 2-layer 4-expert model, batch 32, add2): ~0.1 s/step, held-out accuracy 0.03 at
step 100, ~0.5 at step 200, ~0.85 at step 500 — so the smoke band [0.2, 0.6] is reached in ~20-40 s.
"""
from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from minite_core.model import CausalLM, ModelConfig, save_pretrained, use_profile
from minite_core.model.config import PRESETS, SHAPE_FIELDS
from minite_core.nn import track_optimizer
from minite_core.nn.nonfinite import Watch
from minite_core.results import atomic_write_bytes, config_to_dict, write_result
from minite_core.runs.cli import add_run_args, parse_run_args
from minite_core.runs.lock import RunLock
from minite_core.runs.state import fingerprint, resume, save_state
from minite_core.runs.steplog import StepLog
from minite_core.rl.heldout import evaluate
from minite_core.task.tasks import ARITHMETIC
from minite_core.seeds import tagged
from minite_core.task.data import TOKENIZER, load_split
from minite_core.task.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB, encode, load_tokenizer, save_tokenizer

OUTPUTS = ("model", "loss.csv", "pretrain.json")  # what a run writes to --out (what --restart sets aside)
VOCAB_MULTIPLE = 16  # the model's vocabulary: the tokenizer's rounded up (extra rows are never targets); 16 = the
# NVFP4 block along K of the LM head's backward (dgrad reduces over the vocabulary). Character level: 54 -> 64.


def model_vocab(tokenizer_size: int) -> int:
    """The model's vocabulary size for a tokenizer of ``tokenizer_size`` tokens (VOCAB_MULTIPLE)."""
    return -(-tokenizer_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


@dataclass(frozen=True)
class PretrainConfig:
    # --- model (Qwen3-MoE shape; every layer MoE). Defaults: the CPU smoke size (~0.1 s per step on 2 cores).
    # a named shape (model/config.py PRESETS, e.g. "qwen3-moe-827m") sets the SHAPE_FIELDS below; "" = the fields
    preset: str = ""
    hidden_size: int = 64  # multiple of 16: the NVFP4 block along K
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2  # GQA as in Qwen3 (32 / 4 there)
    head_dim: int = 16
    num_experts: int = 4
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 64  # per-expert SwiGLU width (multiple of 16)
    rope_theta: float = 10000.0  # sequences are < 512 tokens; Qwen3's 1e6 is for 40k contexts
    # --- optimisation
    batch_size: int = 32  # sequences per step (~3k response tokens for add2)
    lr: float = 3e-3  # constant after warmup; 1e-3 reached the same accuracy 2x slower in the CPU prototype
    warmup_steps: int = 50
    weight_decay: float = 0.0  # stops at partial accuracy long before overfitting matters
    grad_clip: float = 1.0
    max_steps: int = 2000  # cap if the band is never reached (then in_band = False)
    # --- stopping / evaluation / checkpoints
    eval_every: int = 25  # add2 accuracy moves ~0.1 per 25 steps near the band (CPU prototype); ~0.5 s per eval
    # held-out prompts per level at each periodic evaluation; 0 = all, so the stopping rule and the reported
    # accuracy see the same set (a 64-prompt subset read 0.30 where all 128 read 0.22 in the smoke prototype)
    eval_per_level: int = 0
    # stop at the first eval >= low; high only reports in_band. ~0.3-0.6 keeps most GRPO groups mixed (signal)
    target_accuracy: tuple[float, float] = (0.3, 0.6)
    checkpoint_every: int = 100
    profile: str = "bf16"  # fp32 masters, bf16 compute (the BF16 baseline's base model is everyone's base model)

    def __post_init__(self):
        if self.preset:
            self._apply_preset()
        lo, hi = self.target_accuracy
        if not 0 <= lo <= hi <= 1:
            raise ValueError(f"PretrainConfig.target_accuracy must be 0 <= low <= high <= 1, got {self.target_accuracy}")
        for key in ("batch_size", "max_steps", "eval_every", "checkpoint_every"):
            if getattr(self, key) < 1:
                raise ValueError(f"PretrainConfig.{key} must be >= 1, got {getattr(self, key)}")
        self.model_config()  # ModelConfig checks the shape (GQA heads, head_dim, top-k)

    def _apply_preset(self) -> None:
        """The preset's shape replaces the fields still at their defaults; a field set to another value than the
        preset's is an error (one model, one shape)."""
        if self.preset not in PRESETS:
            raise ValueError(f"PretrainConfig.preset {self.preset!r} is not a model preset; known: {sorted(PRESETS)}")
        shape = PRESETS[self.preset]
        for f in SHAPE_FIELDS:
            mine, default, theirs = getattr(self, f), self.__dataclass_fields__[f].default, getattr(shape, f)
            if mine not in (default, theirs):
                raise ValueError(f"PretrainConfig.{f}={mine} contradicts preset {self.preset!r} ({f}={theirs}): "
                                 "give the preset or the shape fields")
            object.__setattr__(self, f, theirs)

    def model_config(self, vocab_size: int = model_vocab(len(VOCAB))) -> ModelConfig:
        """The model of this shape over a vocabulary of ``vocab_size`` (default: the character tokenizer's 64)."""
        return ModelConfig(
            vocab_size=vocab_size, hidden_size=self.hidden_size, intermediate_size=2 * self.hidden_size,
            moe_intermediate_size=self.moe_intermediate_size, num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim, num_experts=self.num_experts, num_experts_per_tok=self.num_experts_per_tok,
            rope_theta=self.rope_theta, max_position_embeddings=512, tie_word_embeddings=False,
            bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)


# ----------------------------------------------------------------------------------------------- shared helpers
def eval_subset(examples: list[dict], per_level: int | None) -> list[dict]:
    """The first ``per_level`` examples of every level (all when None or 0), in file order: the same set every
    time."""
    if not per_level:
        return list(examples)
    seen: dict[int, int] = {}
    out = []
    for e in examples:
        if seen.get(e["level"], 0) < per_level:
            seen[e["level"]] = seen.get(e["level"], 0) + 1
            out.append(e)
    return out


def greedy_accuracy(model, profile, tok, examples: list[dict], *, max_new_tokens: int, batch_size: int = 256,
                    engine: str | None = None) -> dict[str, float]:
    """Greedy (temperature 0) held-out accuracy under ``profile`` through the sampler engine ``engine`` (None:
    automatic; rl/heldout.py): {"acc", "se", "acc/<level>", "response_len"}. Leaves the model's mode and profile
    as they were."""
    return evaluate(model, profile, tok, examples, max_new_tokens=max_new_tokens, batch_size=batch_size,
                    engine=engine).metrics()


def max_response_tokens(tok, examples: list[dict]) -> int:
    """Generation budget: the longest reference response in tokens + <eos> + 16 tokens of slack for a wrong,
    longer one."""
    return ARITHMETIC.max_new_tokens(tok, examples)


def sft_batch(prompts, responses, idx: list[int]):
    """Right-padded (ids (B, L), loss mask (B, L-1) over positions whose next token is a response token)."""
    seqs = [prompts[i] + responses[i] for i in idx]
    L = max(map(len, seqs))
    ids = torch.full((len(idx), L), PAD_ID, dtype=torch.long)
    mask = torch.zeros(len(idx), L - 1, dtype=torch.bool)
    for b, i in enumerate(idx):
        ids[b, :len(seqs[b])] = torch.tensor(seqs[b])
        mask[b, len(prompts[i]) - 1:len(seqs[b]) - 1] = True
    return ids, mask


# ----------------------------------------------------------------------------------------------- training
@dataclass
class _SFT:
    """Everything one SFT run works with (built once by `_setup`)."""

    cfg: PretrainConfig
    tok: object
    prompts: list
    responses: list
    heldout: list
    eval_set: list
    max_new: int
    model: CausalLM
    opt: torch.optim.Optimizer
    run_cfg: dict
    seed: int
    device: str
    engine: str | None  # the rollout engine of the held-out evaluations (None: automatic)


def _setup(cfg: PretrainConfig, data_dir: str | Path, seed: int, device: str, engine: str | None) -> _SFT:
    train, heldout = load_split(data_dir, "train"), load_split(data_dir, "heldout")  # names a missing data dir
    tok = load_tokenizer(Path(data_dir) / TOKENIZER)
    prompts, responses = encode(tok, train)
    model_cfg = cfg.model_config(model_vocab(len(tok)))
    model_cfg.check_tokens([p + r for p, r in zip(prompts, responses)], what="training example")
    model = CausalLM(model_cfg).init_weights(tagged(seed, "init")).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    track_optimizer(opt, model)  # quantized-weight caches are stale after each step
    run_cfg = {**config_to_dict(cfg), "seed": seed, "inputs": fingerprint(Path(data_dir) / "train.jsonl")}
    return _SFT(cfg, tok, prompts, responses, heldout, eval_subset(heldout, cfg.eval_per_level),
                max_response_tokens(tok, train + heldout), model, opt, run_cfg, seed, device, engine)


def sft_step(run: _SFT, step: int) -> dict:
    """One SFT update -> its log row (acc None). Stops the stage on a non-finite loss or gradient norm (one check
    per step, on numbers the step syncs anyway), before the optimizer applies it."""
    cfg, t0 = run.cfg, time.perf_counter()
    g = torch.Generator().manual_seed(tagged(run.seed, "batch", step))
    idx = torch.randint(len(run.prompts), (cfg.batch_size,), generator=g).tolist()
    ids, mask = (t.to(run.device) for t in sft_batch(run.prompts, run.responses, idx))
    lr = cfg.lr * min(1.0, step / max(cfg.warmup_steps, 1))
    for group in run.opt.param_groups:
        group["lr"] = lr
    with Watch(run.model) as watch:  # non-finite activations / gradients, named by layer (nn/nonfinite.py)
        logits = run.model(ids)  # (B, L, V) fp32; right padding needs no mask under causal attention
        logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]  # (B, L-1)
        loss = -(logp * mask).sum() / mask.sum()
        run.opt.zero_grad(set_to_none=True)
        loss.backward()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.grad_clip))  # (syncs)
    watch.check(f"pretrain step {step}")  # one more sync, right behind the gradient norm's
    loss_f = loss.item()
    if not (math.isfinite(loss_f) and math.isfinite(grad_norm)):
        raise ValueError(f"pretrain step {step}: non-finite loss {loss_f} or gradient norm {grad_norm} (lr {lr:g}); "
                         "lower pretrain.lr or pretrain.grad_clip")
    run.opt.step()
    n_tok = int(mask.sum())
    return {"step": step, "loss": loss_f, "grad_norm": grad_norm, "lr": lr, "tokens": n_tok,
            "tokens_per_s": n_tok / (time.perf_counter() - t0), "acc": None}


def pretrain(cfg: PretrainConfig, *, data_dir: str | Path, out: str | Path, state_dir: str | Path, seed: int,
             experiment: str = "adhoc", device: str = "cpu", sampler_engine: str | None = None,
             progress: bool = True, stop_after: int | None = None, restart: bool = False,
             on_change: str = "error") -> dict:
    """Run (or resume) SFT; returns the metrics of pretrain.json. ``sampler_engine``: the rollout engine of the
    held-out evaluations (the command's execution; None: automatic); ``stop_after`` = stop after that many steps
    of this call without finishing (tests use it to simulate a kill); ``restart`` sets the run in ``out`` aside and
    starts over; ``on_change``: what a run of another config in ``out`` gets (runs/state.py `resume`)."""
    out, state_dir = Path(out), Path(state_dir)
    out.mkdir(parents=True, exist_ok=True)
    run = _setup(cfg, data_dir, seed, device, sampler_engine)
    # one writer per state directory (the log lives beside the state); the model trains and evaluates under the
    # profile, which it owns for the run
    with RunLock(state_dir), use_profile(run.model, cfg.profile):
        step, extra, log = resume(state_dir, model=run.model, optimizer=run.opt, config=run.run_cfg,
                                  log_name="loss.csv", restart=restart, on_change=on_change, run_dir=out,
                                  outputs=OUTPUTS, result="pretrain.json")
        last_eval, t_start, steps_this_call = extra.get("last_eval"), time.time(), 0
        # a stop at the target accuracy that was killed before the final write is done already
        done = "target" if last_eval is not None and last_eval["acc"] >= cfg.target_accuracy[0] else None
        bar = tqdm(total=cfg.max_steps, initial=step, desc="pretrain", disable=not progress, mininterval=2.0)
        while done is None and step < cfg.max_steps:
            step += 1
            row = sft_step(run, step)
            if step % cfg.eval_every == 0 or step == cfg.max_steps:
                last_eval = greedy_accuracy(run.model, cfg.profile, run.tok, run.eval_set, max_new_tokens=run.max_new,
                                            engine=run.engine)
                row["acc"] = last_eval["acc"]
                done = "target" if last_eval["acc"] >= cfg.target_accuracy[0] else None
            log.append(row)
            bar.update(1)
            steps_this_call += 1
            killed = stop_after is not None and steps_this_call >= stop_after and done is None
            if step % cfg.checkpoint_every == 0 or done or killed:
                save_state(state_dir, step=step, model=run.model, optimizer=run.opt, config=run.run_cfg,
                           extra={"last_eval": last_eval})
            if killed:
                bar.close()
                return {"stopped_at": step}
        bar.close()
        loss = row["loss"] if steps_this_call else math.nan
        return _finish(run, out, log, step, done or "max_steps", loss, time.time() - t_start, experiment)


def _finish(run: _SFT, out: Path, log: StepLog, step: int, reason: str, final_loss: float, wall_s: float,
            experiment: str) -> dict:
    """Held-out accuracy on the whole split, the checkpoint, loss.csv and pretrain.json."""
    final = greedy_accuracy(run.model, run.cfg.profile, run.tok, run.heldout, max_new_tokens=run.max_new,
                            engine=run.engine)
    atomic_write_bytes(out / "loss.csv", log.path.read_bytes())
    save_pretrained(run.model, out / "model", dtype=torch.float32)
    save_tokenizer(run.tok, out / "model")
    lo, hi = run.cfg.target_accuracy
    metrics = {"steps": step, "stop_reason": reason, "heldout_accuracy": final["acc"],
               "accuracy_per_level": {k.split("/", 1)[1]: v for k, v in final.items() if k.startswith("acc/")},
               "response_len": final["response_len"], "in_band": lo <= final["acc"] <= hi,
               "final_loss": final_loss, "num_parameters": run.model.num_parameters(), "wall_s_this_call": wall_s}
    write_result(out / "pretrain.json", stage="pretrain", experiment=experiment, config=run.run_cfg,
                 metrics=metrics, model_config=run.model.config.to_hf())
    return metrics


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="minite pretrain", description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="`minite data` output directory")
    p.add_argument("--out", required=True, help="output directory (model/, loss.csv, pretrain.json)")
    add_run_args(p, "PretrainConfig fields as JSON (the experiment's `pretrain:`)")
    args, cfg = parse_run_args(p, argv, PretrainConfig)
    metrics = pretrain(cfg, data_dir=args.data, out=args.out, state_dir=args.state or Path(args.out) / "state",
                       seed=args.seed, experiment=args.experiment, device=args.device,
                       sampler_engine=args.execution.sampler_engine, progress=not args.no_progress,
                       restart=args.restart, on_change="restart" if args.restart_if_changed else "error")
    print(f"pretrain: {metrics['steps']} steps ({metrics['stop_reason']}), held-out accuracy "
          f"{metrics['heldout_accuracy']:.3f} {metrics['accuracy_per_level']}")
    return 0
