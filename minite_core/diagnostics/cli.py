"""`minite diagnose`: measure the learner↔sampler execution gap of profile pairs on one checkpoint.

For each pair "learner:sampler": the sampler generates responses to the prompts (KV-cache decode, processed
log-probs and their full rows, its argmax per step, the experts each MoE layer executed), the learner rescores the
same tokens (full-sequence forward, recording its own routing, replaying the sampler's under R3), and the mismatch
metrics (engines.mismatch: k1/k3/..., max |Δ|, full-vocabulary KL, routing agreement per MoE layer; and
NeMo-RL's / verl's under their names, engines.framework_metrics) are computed overall and per response-position
bucket. `--trace` adds the first-divergence trace of each pair,
prefill↔prefill and learner-prefill↔sampler-decode (diagnostics.trace); `--attribution` the one-knob attribution
from the naive pair (diagnostics.attribution); `--k3-budget` the mismatch gate (diagnostics.gate: exit 1 with one
line per pair over budget). Output: one JSON per the results contract (stage "diagnostics"), figures optional
(diagnostics.figures).

Prompts: `--prompts` task JSONL (the arithmetic task's rows, or your math data's: encoded as the RL stage encodes
them, task/tasks.py, with the checkpoint's tokenizer, which must be in the checkpoint dir) or random token prompts from the seed. Static activation scales (vllm-nvfp4) are calibrated on
data that is NOT measured: `--calib` JSONL (`--num-calib` examples chosen by --seed, through the calibration path
every stage shares: engines.calibration) or random token sequences from a different seed stream; a checkpoint
that already carries calibrated `input_amax` for every GEMM keeps them unless --calib is given. Every random draw
derives from (--seed, stream, index) (seeds.py).

Real Transformer Engine on the learner side: a learner named `te:<mode>` (a peers.te_learner mode, e.g.
`te:nvfp4:vllm-nvfp4`) rescores the sampler's tokens with `TELearner(model, mode)` — our model with its decoder
GEMMs as TE modules — and gets every metric above. What needs our profiles on both sides is skipped for such a
pair with the reason in the result's `skipped` list: the first-divergence trace (two profiles on one module
tree) and the one-knob attribution (switches profile knobs; a te:* pair is no base and feeds no cache). TE
missing, no CUDA, or a mode this GPU lacks: the run stops before any work with one line naming the pair and
TE's reason (te_learner.mode_available), never a fallback to our emulation.

Another framework's engines, from its logged rollouts and without a model: `minite diagnose --rollouts FILE...`
(diagnostics.external).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from minite_core.diagnostics import attribution as attr
from minite_core.diagnostics.gate import check_budgets, parse_budgets, violation_line
from minite_core.diagnostics.trace import TRACE_THRESHOLD, trace_pair
from minite_core.engines import Learner, make_sampler
from minite_core.engines.calibration import calibrate_on_examples, calibrate_on_sequences
from minite_core.engines.framework_metrics import framework_metrics
from minite_core.engines.mismatch import mismatch_by_position, mismatch_metrics, routing_agreement
from minite_core.model import load_pretrained
from minite_core.nn import is_calibrated
from minite_core.model.routing import moe_layers
from minite_core.peers import te_learner
from minite_core.profiles import Profile, get_profile
from minite_core.results import write_result
from minite_core.runs.cli import add_common_args, parse_with_config
from minite_core.seeds import tagged
from minite_core.task.jsonl import read_jsonl
from minite_core.task.data import calibration_examples
from minite_core.task.tasks import task_of
from minite_core.task.tokenizer import BOS_ID, EOS_ID

DEFAULT_PAIRS = "bf16:bf16,te-nvfp4:vllm-nvfp4,te-nvfp4:vllm-marlin-w4a16,minite:minite"
NUM_SPECIAL = 4  # ids 0..3 are <pad> <bos> <eos> <unk> (task.tokenizer); random prompts avoid them
TE_SKIP = {
    "trace": "the first-divergence trace runs two of our profiles on one module tree; a real-TE learner has none",
    "attribution": "the one-knob attribution switches our profiles' knobs; a real-TE learner has none (no base, "
                   "no cached pair)",
}


def _log(msg: str) -> None:
    print(f"[diagnose {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _num(v) -> str:
    return "n/a" if v is None else f"{v:.3e}"


def parse_pairs(spec: str) -> list[tuple[str, str]]:
    """"l:s,l:s" -> [(l, s), ...]; every name must be a registered profile, or a learner `te:<mode>` with a TE
    mode (split at the last ":": sampler names never contain one)."""
    pairs = []
    for item in filter(None, (x.strip() for x in spec.split(","))):
        learner, _, sampler = item.rpartition(":")
        if not learner:
            raise ValueError(f"pair {item!r} must be learner:sampler")
        if te_learner.learner_mode(learner) is None:
            get_profile(learner)
        else:
            te_learner.get_mode(te_learner.learner_mode(learner))
        get_profile(sampler)  # fail early on unknown names
        pairs.append((learner, sampler))
    if not pairs:
        raise ValueError("no pairs given")
    return pairs


def random_prompts(n: int, vocab: int, seed: int, *, min_len: int = 4, max_len: int = 12) -> list[list[int]]:
    """<bos> + random non-special tokens, prompt i from seeds.tagged(seed, "diag_prompts", i)."""
    out = []
    for i in range(n):
        g = torch.Generator().manual_seed(tagged(seed, "diag_prompts", i))
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        out.append([BOS_ID] + torch.randint(NUM_SPECIAL, vocab, (length - 1,), generator=g).tolist())
    return out


def random_calibration(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """n random token sequences of `length` (<bos> first) from the calibration seed stream (not the prompts')."""
    g = torch.Generator().manual_seed(tagged(seed, "diag_calib"))
    ids = torch.randint(NUM_SPECIAL, vocab, (n, length), generator=g)
    ids[:, 0] = BOS_ID
    return ids.tolist()


def jsonl_prompts(path, tokenizer, n: int) -> list[list[int]]:
    rows = read_jsonl(path)[:n]
    if len(rows) < n:
        raise ValueError(f"{path}: asked for {n} prompts, file has {len(rows)}")
    return task_of(rows).prompt_ids(tokenizer, rows)


def _check_disjoint(calib_path, rows: list[dict], prompts: list[list[int]], tokenizer) -> None:
    """Static scales fitted on the measured prompts would flatter the static sampler: refuse any overlap."""
    measured = {tuple(p) for p in prompts}
    shared = [r["prompt"] for r, ids in zip(rows, task_of(rows).prompt_ids(tokenizer, rows)) if tuple(ids) in measured]
    if shared:
        raise ValueError(f"--calib {calib_path} shares {len(shared)} prompts with the measured ones "
                         f"(e.g. {shared[0]!r}); calibrate on held-out data")


def calibrate_for_diagnose(model, args, prompts, tokenizer, vocab: int) -> str:
    """Static scales for the measured profiles: the checkpoint's unless --calib is given or it has none; --calib
    examples go through the path every stage shares (engines.calibration); else random token sequences."""
    if is_calibrated(model) and not args.calib:
        return "checkpoint"
    if args.calib:
        rows = read_jsonl(args.calib)
        _check_disjoint(args.calib, calibration_examples(rows, args.num_calib, args.seed), prompts, tokenizer)
        info = calibrate_on_examples(model, tokenizer, rows, n=args.num_calib, seed=args.seed)
        src = f"{args.calib} ({info['examples']} examples, seed {args.seed})"
    else:
        length = max(map(len, prompts)) + args.max_new_tokens
        calibrate_on_sequences(model, random_calibration(args.num_calib, length, vocab, args.seed))
        src = f"random(seed={args.seed}, stream=diag_calib, n={args.num_calib}, len={length})"
    _log(f"calibrated static activation scales on {src}")
    return src


def require_te(pairs, model=None) -> None:
    """RuntimeError, one line naming the first te:* pair that cannot run here and TE's reason (missing TE, no
    CUDA, a mode this GPU lacks; with `model`: a model not on CUDA). Called before any work."""
    for learner, sampler in pairs:
        if te_learner.learner_mode(learner) is None:
            continue
        ok, reason = te_learner.mode_available(te_learner.learner_mode(learner))
        if ok and model is not None:
            try:
                te_learner._require_cuda_model(model)  # the check build_te_model makes, before any work
            except ValueError as e:
                ok, reason = False, str(e)
        if not ok:
            raise RuntimeError(f"pair {learner}:{sampler}: the real TE learner cannot run: {reason}")


def _learner(model, learner: Profile | str, seed: int, batch_size) -> Learner:
    """Our Learner under a profile, or TELearner for a `te:<mode>` name (a TE copy of the model)."""
    if isinstance(learner, str) and te_learner.learner_mode(learner) is not None:
        return te_learner.TELearner(model, te_learner.learner_mode(learner), seed=seed, batch_size=batch_size)
    return Learner(model, learner, seed=seed, batch_size=batch_size)


def measure_pair(model, learner: Profile | str, sampler: Profile | str, prompts, *, max_new_tokens: int,
                 temperature: float, top_p: float, seed: int, stop_ids=(EOS_ID,), batch_size=None,
                 sampler_engine: str | None = None):
    """Sample with `sampler` (recording its routing and its processed log-prob rows) on the rollout engine
    `sampler_engine` (None: automatic), rescore with `learner` (a profile, replaying that routing when it says so, or
    `te:<mode>`: TELearner) -> (metrics, by_position rows, rollout)."""
    sampler = get_profile(sampler)
    engine = _learner(model, learner, seed, batch_size)
    name = learner if isinstance(learner, str) else learner.name
    rollout = make_sampler(model, sampler, engine=sampler_engine).generate(
        prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, stop_ids=stop_ids, seed=seed,
        batch_size=batch_size, record_routes=True, keep_logprob_rows=True)
    sc = engine.score(
        rollout.prompt_ids, rollout.response_ids, temperature=temperature, top_p=top_p, with_entropy=True,
        with_argmax=True, routes=rollout.routes, record_routes=True, sampler_rows=rollout.logprob_rows)
    rollout.logprob_rows = None  # (tokens, V): free them now, the KL is computed
    s = rollout.padded(device=sc.logp.device)
    if not bool(torch.isfinite(sc.logp[sc.mask]).all() & torch.isfinite(s["logprobs"][sc.mask]).all()):  # one sync
        raise ValueError(f"diagnose {name}:{sampler.name}: non-finite log-probs (learner or sampler logits "
                         "hold inf/NaN): the checkpoint's weights or the profile's scales overflow")
    kw = dict(argmax_learner=sc.argmax, argmax_sampler=s["argmax_ids"], kl=sc.kl_full_vocab)
    metrics = mismatch_metrics(sc.logp, s["logprobs"], sc.mask, **kw)
    metrics.update(framework_metrics(sc.logp, s["logprobs"], sc.mask))  # NeMo-RL's and verl's names, beside ours
    layers = moe_layers(model)
    metrics.update(routing_agreement(sc.routes, rollout.routes, layers))
    if metrics["routing/applies"]:
        metrics["routing/replayed"] = engine.profile.routing_replay
        if engine.profile.routing_replay:  # executed routes agree by construction; what the router would pick:
            metrics["routing/router_topk_disagree"] = routing_agreement(sc.router_routes, rollout.routes,
                                                                        layers)["routing/topk_disagree"]
    lengths = [len(r) for r in rollout.response_ids]
    metrics.update({
        "rollout/response_len_mean": sum(lengths) / max(len(lengths), 1),
        "rollout/finished_frac": sum(rollout.finished) / max(len(rollout), 1),
        "learner/entropy_mean": float(sc.entropy[sc.mask].mean()) if sc.mask.any() else float("nan"),
    })
    return metrics, mismatch_by_position(sc.logp, s["logprobs"], sc.mask, **kw), rollout


def _trace(model, key, learner, sampler, rollout, n, threshold, modes=("prefill", "decode")) -> list[dict]:
    """First-divergence traces of one measured pair on its first n rollout rows (the learner side replays the
    sampler's routes when its profile does)."""
    out = []
    for mode in modes:
        t = trace_pair(model, learner, sampler, rollout.prompt_ids[:n], rollout.response_ids[:n], sut_mode=mode,
                       threshold=threshold, routes=rollout.routes[:n] if rollout.routes is not None else None)
        t["pair"] = key
        out.append(t)
        first = t["first_divergence"]
        _log(f"trace {key} [{mode}]: first divergence "
             f"{first['op'] + ' rel=%.2e' % first['rel_err'] if first else 'none'}")
    return out


def diagnose(model, pairs, prompts, *, max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
             seed: int = 0, stop_ids=(EOS_ID,), batch_size=None, trace: bool = False,
             trace_sequences: int | None = None,
             trace_threshold: float = TRACE_THRESHOLD, attribution: bool = False,
             attribution_base=("te-nvfp4", "vllm-nvfp4"), attribution_target: str = "minite",
             attribution_cumulative: bool = False, budgets: dict[str, float] | None = None,
             sampler_engine: str | None = None) -> dict:
    """The whole measurement on a loaded (and, if needed, calibrated) model -> {"metrics", "by_position",
    "trace", "attribution", "budget", "skipped"} (trace / attribution None unless asked for, budget None without
    budgets; a budgeted pair over its budget that was not traced gets its decode trace, to name the first op;
    skipped: [{"pair", "step", "reason"}] for what a te:* pair cannot do, module docstring). sampler_engine: the
    rollout engine (None: automatic)."""
    require_te(pairs, model)
    opts = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed, stop_ids=stop_ids,
                batch_size=batch_size, sampler_engine=sampler_engine)
    budgets = budgets or {}
    cache: dict = {}  # forward_key pair -> metrics, shared with the attribution
    metrics, by_position, traces, gate_traces, skipped = {}, {}, [] if trace else None, [], []
    for learner, sampler in pairs:
        key = f"{learner}:{sampler}"
        t0 = time.perf_counter()
        m, rows, rollout = measure_pair(model, learner, sampler, prompts, **opts)
        metrics[key], by_position[key] = m, rows
        _log(f"{key}: k3={m['mismatch/k3']:.3e} k1={m['mismatch/k1']:.3e} "
             f"kl_full_vocab={m['mismatch/kl_full_vocab']:.3e} flip={m['mismatch/argmax_flip']:.3f} "
             f"routing_disagree={_num(m['routing/topk_disagree'])} tokens={m['mismatch/tokens']} "
             f"({time.perf_counter() - t0:.1f}s)")
        over = key in budgets and not m["mismatch/k3"] <= budgets[key]
        if te_learner.learner_mode(learner) is not None:  # what needs our profiles on both sides (module docstring)
            steps = ["trace"] * (trace or over) + ["attribution"] * attribution
            skipped += [{"pair": key, "step": step, "reason": TE_SKIP[step]} for step in steps]
            continue
        cache[(attr.forward_key(get_profile(learner)), attr.forward_key(get_profile(sampler)))] = m
        n = trace_sequences or len(rollout)  # default: the measured batch itself (same per-tensor scales)
        if trace:
            traces += _trace(model, key, learner, sampler, rollout, n, trace_threshold)
        elif over:
            gate_traces += _trace(model, key, learner, sampler, rollout, n, trace_threshold, modes=("decode",))
    for row in skipped:
        _log(f"{row['pair']}: {row['step']} skipped: {row['reason']}")
    result = {"metrics": metrics, "by_position": by_position, "trace": traces, "attribution": None, "budget": None,
              "skipped": skipped}
    if budgets:
        result["budget"] = check_budgets(metrics, budgets, (traces or []) + gate_traces)
    if attribution:
        def measure(lp, sp):
            t0 = time.perf_counter()
            m = measure_pair(model, lp, sp, prompts, **opts)[0]
            _log(f"attribution {lp.name}:{sp.name}: k3={m['mismatch/k3']:.3e} ({time.perf_counter() - t0:.1f}s)")
            return m
        result["attribution"] = attr.attribute(measure, base=attribution_base, target=attribution_target,
                                               cache=cache, cumulative=attribution_cumulative)
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="minite diagnose", description=__doc__.split("\n\n")[0],
                                epilog="Logged rollouts of another framework, no model: minite diagnose --rollouts "
                                       "FILE... (diagnostics/external.py; docs/rollouts.md)")
    p.add_argument("--checkpoint", required=True, help="transformers-format checkpoint dir (tokenizer optional)")
    p.add_argument("--learner", default="te-nvfp4")
    p.add_argument("--sampler", default="vllm-nvfp4")
    p.add_argument("--pairs", default=None, help=f"learner:sampler,... (default: --learner:--sampler); "
                                                 f"the DAG's four: {DEFAULT_PAIRS}")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=None, help="rows per sampler/learner batch (default: all)")
    p.add_argument("--prompts", default=None, help="task JSONL (field 'prompt'); default: random token prompts")
    p.add_argument("--calib", default=None, help="calibration JSONL (prompt + response), disjoint from --prompts")
    p.add_argument("--num-calib", type=int, default=16, help="calibration sequences")
    p.add_argument("--trace", action="store_true", help="first-divergence trace of every pair")
    p.add_argument("--trace-sequences", type=int, default=None, help="rows traced (default: all measured)")
    p.add_argument("--trace-threshold", type=float, default=TRACE_THRESHOLD)
    p.add_argument("--attribution", action="store_true", help="one-knob attribution from --attribution-base")
    p.add_argument("--attribution-base", default="te-nvfp4:vllm-nvfp4")
    p.add_argument("--attribution-target", default="minite")
    p.add_argument("--attribution-cumulative", action="store_true",
                   help="also switch the knobs one after another (interactions)")
    p.add_argument("--k3-budget", action="append", default=[], metavar="[PAIR=]X",
                   help="mismatch budget: fail (exit 1) when a pair's k3 exceeds X; X alone = every pair, "
                        "learner:sampler=X = that pair (repeatable; a pair's own value wins)")
    p.add_argument("--budget-json", default="{}", help='config form of the budget: {"learner:sampler": k3, ...}')
    p.add_argument("--out", required=True, help="result JSON (results contract, stage 'diagnostics')")
    p.add_argument("--figures", default=None, help="directory for PNG figures")
    add_common_args(p, config_help="the experiment's `diagnostics:` section as JSON (keys = the flags above)")
    return p


def _check_args(p: argparse.ArgumentParser, args) -> None:
    for flag, value, low in (("--num-prompts", args.num_prompts, 1), ("--max-new-tokens", args.max_new_tokens, 1),
                             ("--num-calib", args.num_calib, 1), ("--batch-size", args.batch_size or 1, 1)):
        if value < low:
            p.error(f"{flag} must be >= {low}, got {value}")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        p.error(f"need --temperature >= 0 and 0 < --top-p <= 1, got {args.temperature}, {args.top_p}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--rollouts" in argv:  # logged rollouts of any framework: no model, no engines (diagnostics.external)
        from minite_core.diagnostics.external import main as rollouts_main

        return rollouts_main(argv)
    p = build_parser()
    args = parse_with_config(p, argv)
    _check_args(p, args)
    pairs = parse_pairs(args.pairs or f"{args.learner}:{args.sampler}")
    require_te(pairs)  # before any work: missing TE / CUDA / mode is one line naming the pair (runs.cli)
    try:
        budget_cfg = [f"{pair}={value}" for pair, value in json.loads(args.budget_json).items()]
        budgets = parse_budgets(budget_cfg + args.k3_budget, [f"{l}:{s}" for l, s in pairs])
    except (ValueError, AttributeError) as e:
        p.error(f"--k3-budget / budget: {e}")
    base = parse_pairs(args.attribution_base)[0]
    if te_learner.learner_mode(base[0]) is not None:
        raise ValueError(f"--attribution-base {args.attribution_base}: {TE_SKIP['attribution']}")
    ckpt = Path(args.checkpoint)
    model = load_pretrained(ckpt, dtype=torch.float32, device=args.device).eval()
    vocab = model.config.vocab_size
    tokenizer = None
    if (ckpt / "tokenizer.json").exists():
        from minite_core.task.tokenizer import load_tokenizer
        tokenizer = load_tokenizer(ckpt)
    if (args.prompts or args.calib) and tokenizer is None:
        raise FileNotFoundError(f"--prompts/--calib are text: {ckpt} has no tokenizer.json to encode them with")
    stop = (tokenizer.eos_token_id,) if tokenizer is not None else (EOS_ID,)
    if args.prompts:
        prompts, prompt_src = jsonl_prompts(args.prompts, tokenizer, args.num_prompts), str(args.prompts)
        stop = task_of(read_jsonl(args.prompts)[:1]).stop_ids(tokenizer)  # the RL stage's stop tokens
    else:
        prompts, prompt_src = random_prompts(args.num_prompts, vocab, args.seed), f"random(seed={args.seed})"

    profiles = {get_profile(n) for pair in pairs for n in pair if te_learner.learner_mode(n) is None}  # TE modes: dynamic scales
    if args.attribution:
        profiles |= {get_profile(n) for n in base}
    calib_src = None
    if any(p.needs_calibration for p in profiles):
        calib_src = calibrate_for_diagnose(model, args, prompts, tokenizer, vocab)

    result = diagnose(model, pairs, prompts, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                      top_p=args.top_p, seed=args.seed, stop_ids=stop, batch_size=args.batch_size,
                      trace=args.trace, trace_sequences=args.trace_sequences, trace_threshold=args.trace_threshold,
                      attribution=args.attribution, attribution_base=base,
                      attribution_target=args.attribution_target,
                      attribution_cumulative=args.attribution_cumulative, budgets=budgets,
                      sampler_engine=args.execution.sampler_engine)
    config = {"checkpoint": str(ckpt), "pairs": [f"{l}:{s}" for l, s in pairs], "num_prompts": args.num_prompts,
              "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p,
              "seed": args.seed, "prompts": prompt_src, "calibration": calib_src, "device": args.device,
              "trace": args.trace, "attribution": args.attribution,
              "attribution_base": f"{base[0]}:{base[1]}" if args.attribution else None,
              "attribution_cumulative": args.attribution_cumulative, "k3_budget": budgets,
              "te": te_learner.available()[1] if any(te_learner.learner_mode(l) for l, _ in pairs) else None}
    write_result(args.out, stage="diagnostics", experiment=args.experiment, config=config,
                 metrics=result["metrics"], by_position=result["by_position"], trace=result["trace"],
                 attribution=result["attribution"], budget=result["budget"], skipped=result["skipped"])
    _log(f"wrote {args.out}")
    if args.figures:
        from minite_core.diagnostics.figures import write_figures
        from minite_core.results import read_result
        paths = write_figures(read_result(args.out, stage="diagnostics"), args.figures)
        _log(f"wrote {len(paths)} figures to {args.figures}")
    failed = [row for row in result["budget"] or [] if not row["pass"]]
    for row in failed:  # the gate: one line per pair over its budget, after the result is on disk
        print(f"minite diagnose: error: {violation_line(row)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
