"""`minite scale`: NVFP4's cost against model size — one SFT'd base model's held-out greedy accuracy under each
execution profile, and each profile's drop from BF16 with its paired standard error.

Why: at 13 M parameters, quantizing the SFT base model to NVFP4 already costs several points of held-out accuracy,
so an NVFP4 RL run starts behind BF16 before the engines' mismatch plays any part; real models lose far less. The
DAG runs this command on every size of a sweep (config `scale.sizes`, one `minite pretrain` and one `minite scale`
job a size, each SFT'd by the same recipe into the same held-out band), so the report can show how the cost falls
with size and pick the RL model where it is small.

What, for one checkpoint (a `minite pretrain` output):
- the problems: `rl.heldout.heldout_set(heldout, eval_n)`, the set every RL evaluation with the same n scores;
- per profile, greedy decoding through the rollout engine (`rl.heldout.evaluate`: the fast CUDA-graph sampler on
  the GPU, the reference on CPU), the budget of the RL stage (the longest reference response in tokens + 17);
- static-scale profiles (vllm-nvfp4) are calibrated first, on `calibration_examples` training examples chosen by
  the run seed with the base weights — `rl.train.calibrate_static`, so the scales are those an RL run of this
  checkpoint starts with, and the evaluation is that run's step-0 one (same problems, batch size and scales);
- drop(profile) = acc(bf16) − acc(profile) on the same problems, and its SE the paired one
  (`rl.heldout.paired_gain`: std of the per-problem differences / sqrt(n)), far below the two binomial SEs
  combined, since the problems both solve (or both miss) cancel.

Output (results contract, stage "scale"): `metrics = {"size", "num_parameters", "heldout_n", "base": the SFT's
steps, stop reason, band, held-out accuracy (pretrain.json beside the checkpoint), "profiles": {profile: {"acc",
"se", "drop", "drop_se", "response_len", "acc/<level>", "outcomes"}}}` — `outcomes` the per-problem results as a
string of 0/1 in problem order, so any other pairing can be recomputed from the file. The report
(report/scale.py) reads every size's file into a table and a figure.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from minite_core.model import load_pretrained
from minite_core.profiles import get_profile
from minite_core.results import config_to_dict, read_result, write_result
from minite_core.rl.heldout import binomial_se, evaluate, heldout_set, paired_gain
from minite_core.rl.pretrain import max_response_tokens
from minite_core.rl.train import calibrate_static
from minite_core.runs.cli import add_common_args, parse_run_args
from minite_core.task.data import load_split
from minite_core.task.tokenizer import load_tokenizer

REFERENCE = "bf16"  # the drops are from this profile's accuracy


@dataclass(frozen=True)
class ScaleConfig:
    # the profiles of the paper's comparison: BF16 (the reference), miniTE (aligned), TE's learner numerics and
    # vLLM's served numerics (static calibrated scales) of the naive Blackwell stack
    profiles: tuple[str, ...] = ("bf16", "minite", "te-nvfp4", "vllm-nvfp4")
    eval_n: int = 512  # held-out problems, as RLConfig.eval_n (binomial SE <= 2.2 points); 0 = the whole split
    eval_batch_size: int = 512  # sampler rows per batch, as RLConfig.eval_batch_size (per-tensor scales see it)
    calibration_examples: int = 64  # as RLConfig.calibration_examples: the scales an RL run starts with
    max_new_tokens: int = 0  # 0 = the RL stage's budget: longest reference response in tokens + 17

    def __post_init__(self):
        if REFERENCE not in self.profiles:
            raise ValueError(f"ScaleConfig.profiles must include {REFERENCE!r} (the drops are from it), got "
                             f"{list(self.profiles)}")
        for name in self.profiles:
            get_profile(name)  # unknown profile -> ValueError naming it
        if self.eval_n < 0 or self.eval_batch_size < 1 or self.calibration_examples < 1 or self.max_new_tokens < 0:
            raise ValueError(f"ScaleConfig needs eval_n >= 0, eval_batch_size >= 1, calibration_examples >= 1, "
                             f"max_new_tokens >= 0; got {self}")


def measure(checkpoint: str | Path, data_dir: str | Path, cfg: ScaleConfig, *, seed: int, device: str = "cpu",
            progress: bool = True) -> tuple[dict, dict]:
    """(metrics, calibration) of one checkpoint (module docstring); calibration None without a static-scale
    profile."""
    checkpoint = Path(checkpoint)
    model = load_pretrained(checkpoint, dtype=torch.float32, device=device).eval()  # names a missing checkpoint
    tok = load_tokenizer(checkpoint)
    train, heldout = load_split(data_dir, "train"), load_split(data_dir, "heldout")
    problems = heldout_set(heldout, cfg.eval_n)
    max_new = cfg.max_new_tokens or max_response_tokens(tok, train + heldout)
    profiles = [get_profile(name) for name in cfg.profiles]
    calibration = calibrate_static(model, profiles, tok, train, cfg.calibration_examples, seed)
    outcomes = {}
    for profile in tqdm(profiles, desc=f"scale {checkpoint.parent.name}", disable=not progress):
        outcomes[profile.name] = evaluate(model, profile, tok, problems, max_new_tokens=max_new,
                                          batch_size=cfg.eval_batch_size)
    ref = outcomes[REFERENCE].correct
    per_profile = {}
    for name, ev in outcomes.items():
        drop, drop_se = paired_gain(ev.correct, ref)  # mean over the problems of bf16's outcome - this profile's
        m = ev.metrics()
        per_profile[name] = {"acc": ev.acc, "se": binomial_se(ev.acc, ev.n), "drop": drop, "drop_se": drop_se,
                             **{k: v for k, v in m.items() if k not in ("acc", "se")},
                             "outcomes": "".join("1" if c else "0" for c in ev.correct)}
    return {"num_parameters": model.num_parameters(), "heldout_n": len(problems), "max_new_tokens": max_new,
            "base": _base(checkpoint), "profiles": per_profile}, calibration


def _base(checkpoint: Path) -> dict:
    """The SFT run that made the checkpoint (its pretrain.json, beside it): how far it trained, where it stopped."""
    path = checkpoint.parent / "pretrain.json"
    if not path.is_file():
        return {}
    m = read_result(path, stage="pretrain")["metrics"]
    return {k: m.get(k) for k in ("steps", "stop_reason", "in_band", "heldout_accuracy")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="minite scale", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="a `minite pretrain` model dir (pretrain.json beside it)")
    p.add_argument("--data", required=True, help="`minite data` output directory")
    p.add_argument("--out", required=True, help="results JSON to write (stage scale)")
    p.add_argument("--size", default=None, help="the size's name in the sweep (default: the checkpoint's folder)")
    p.add_argument("--no-progress", action="store_true")
    add_common_args(p, config_help="ScaleConfig fields as JSON (the experiment's `scale:` minus sizes)")
    args, cfg = parse_run_args(p, argv, ScaleConfig)
    size = args.size or Path(args.checkpoint).resolve().parent.name
    metrics, calibration = measure(args.checkpoint, args.data, cfg, seed=args.seed, device=args.device,
                                   progress=not args.no_progress)
    write_result(args.out, stage="scale", experiment=args.experiment,
                 config={**config_to_dict(cfg), "seed": args.seed, "checkpoint": str(args.checkpoint),
                         "calibration": calibration},
                 metrics={"size": size, **metrics})
    drops = ", ".join(f"{name} {100 * m['drop']:+.1f} ± {100 * m['drop_se']:.1f}"
                      for name, m in metrics["profiles"].items() if name != REFERENCE)
    print(f"scale {size}: {metrics['num_parameters']:,} parameters, bf16 "
          f"{100 * metrics['profiles'][REFERENCE]['acc']:.1f}% on {metrics['heldout_n']} problems; drop in points: "
          f"{drops}")
    return 0
