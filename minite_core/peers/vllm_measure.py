"""Real vLLM (peers.vllm_rollout) measured against our engines, on any device: weight push, log-probs, decode speed.

    python -m minite_core.peers.vllm_measure push-check --mode bf16 --out F.json        [--checkpoint DIR]
    python -m minite_core.peers.vllm_measure compare --checkpoint DIR --prompts F --calib F --out DIR
    python -m minite_core.peers.vllm_measure bench   --checkpoint DIR --prompts F --calib F --out DIR

push-check  one engine generates, takes a push of the weights it already runs (control: nothing may change),
            generates again, the model's weights move (one seeded perturbation, the size of an update),
            `push_weights()` loads them, the engine generates again; a fresh engine started on the moved weights
            (its own process: `vllm_compare sample`) generates the same prompts with the same seeds. Passes when
            the push of unchanged weights changed nothing, and the pushed engine's tokens and log-probs equal
            the fresh one's bit for bit and its tokens or log-probs differ from before.
compare     per vLLM mode (bf16, nvfp4: the kernel vLLM picks, nvfp4-emulation), one engine in its own process
            samples `--num-prompts` task prompts with every processed log-prob row kept (logprobs = vocabulary);
            our learner under each `--learners` profile (one full-sequence forward: k3, max |Δ|, full-vocabulary
            KL(vLLM ‖ ours)) and our sampler under each `--samplers` profile (teacher-forced cached decode,
            Sampler.score: k3, max |Δ|; no rows kept there) score vLLM's tokens. The kernels vLLM chose per module
            (vllm_rollout.describe_kernels: Marlin or emulation) are recorded beside each mode.
bench       decode tokens/s of real vLLM (CUDA graphs, its default) beside our fast sampler (CUDA graphs) on the same
            model, prompts and batch sizes: max_new_tokens generated for every row (no stop token), wall time of
            generate() after one warm-up call, median of --reps; every row asks for the sampled token's log-prob.

Static scales: the NVFP4 export and our static-scale profiles use the same calibration (engines.calibration on
`--calib`, `--calib-rows` examples, --seed), done in each process on the same base model, so the scales agree.
Outputs follow the results contract (stage `vllm_gpu`, one JSON per mode / engine / profile) + summary.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from minite_core.engines.calibration import calibrate_on_examples
from minite_core.engines.fast_sampler import make_sampler
from minite_core.engines.learner import Learner
from minite_core.engines.sampler import Rollout, Sampler
from minite_core.kernels import dispatch
from minite_core.model import CausalLM, load_pretrained, set_profile
from minite_core.peers import vllm_rollout
from minite_core.peers.vllm_compare import DENSE, MOE, _metrics
from minite_core.profiles import PROFILES, get_profile
from minite_core.results import write_json, write_result
from minite_core.seeds import tagged
from minite_core.task.jsonl import read_jsonl
from minite_core.task.tokenizer import build_tokenizer, load_tokenizer

STAGE = "vllm_gpu"


# ---- shared setup --------------------------------------------------------------------------------------------
def load_model(a) -> tuple[CausalLM, object]:
    """The base model (a checkpoint, or a random tiny one: --random moe|dense) with bf16-valued weights and its
    tokenizer, calibrated on --calib (static input scales: the NVFP4 export and our static-scale profiles)."""
    if a.checkpoint:
        model, tok = load_pretrained(a.checkpoint, device=a.device), load_tokenizer(a.checkpoint)
    else:
        model, tok = CausalLM(MOE if a.random == "moe" else DENSE).init_weights(a.seed, std=0.3).to(a.device), build_tokenizer()
    with torch.no_grad():  # bf16-valued masters: vLLM's bf16 tensors and ours are then the same numbers, and the
        for p in model.parameters():  # NVFP4 export quantizes exactly what our profiles quantize (vllm_compare)
            p.copy_(p.to(torch.bfloat16))
    rows = read_jsonl(a.calib) if a.calib else _task_rows(64, a.seed)
    set_profile(model, PROFILES["bf16"])  # the activations the scales are taken from (as vllm_compare)
    calibrate_on_examples(model, tok, rows, n=min(a.calib_rows, len(rows)), seed=a.seed)
    return model, tok


def _task_rows(n: int, seed: int) -> list[dict]:
    from minite_core.peers.vllm_compare import _task_examples

    return _task_examples(n, seed)


def _prompts(a, tok) -> list[list[int]]:
    rows = read_jsonl(a.prompts) if a.prompts else _task_rows(a.num_prompts, tagged(a.seed, "diag_prompts"))
    return [tok(r["prompt"])["input_ids"] for r in rows[:a.num_prompts]]


def _engine(model, tok, mode, a, **kw) -> vllm_rollout.VLLMRollout:
    kw.setdefault("enforce_eager", a.enforce_eager)
    return vllm_rollout.VLLMRollout(model, mode, tokenizer=tok, seed=a.seed, workdir=Path(a.work) / mode,
                                    gpu_memory_utilization=a.gpu_memory_utilization, **kw)


def _rollout_dict(r: Rollout) -> dict:
    return {"prompt_ids": r.prompt_ids, "response_ids": r.response_ids, "logprobs": r.logprobs,
            "finished": r.finished, "argmax_ids": r.argmax_ids}


# ---- push-check ------------------------------------------------------------------------------------------------
@torch.no_grad()
def push_check_main(a) -> int:
    model, tok = load_model(a)
    prompts = _prompts(a, tok)
    eng = _engine(model, tok, a.mode, a)
    gen = lambda: eng.generate(prompts, max_new_tokens=a.max_new_tokens, seed=a.seed)  # noqa: E731
    before = gen()
    eng.push_weights()  # the control: pushing the weights the engine already runs changes nothing
    unchanged = gen()
    g = torch.Generator(device="cpu").manual_seed(tagged(a.seed, "learner"))  # stands in for an update
    for p in model.parameters():  # ~1% of each tensor's scale: an update's size, enough to move the tokens
        p.add_(torch.randn(p.shape, generator=g).to(p.device) * (0.01 * float(p.float().std()) + 1e-8))
    eng.push_weights()
    after = gen()
    fresh_dir = vllm_rollout.export(model, a.mode, Path(a.work) / "fresh", tok)
    fresh = _sample_subprocess(fresh_dir, prompts, a, eng.engine_kwargs)  # started exactly as the pushed one
    diff = max((abs(x - y) for r1, r2 in zip(after.logprobs, fresh["logprobs"]) for x, y in zip(r1, r2)),
               default=float("nan"))
    metrics = {"push_unchanged_is_noop": unchanged.response_ids == before.response_ids
               and unchanged.logprobs == before.logprobs,
               "push_equals_fresh": after.response_ids == fresh["response_ids"] and after.logprobs == fresh["logprobs"],
               "push_vs_fresh_max_abs_dlogp": diff, "weights_moved_tokens": after.response_ids != before.response_ids,
               "weights_moved_logprobs": after.logprobs != before.logprobs,  # tokens alone may not move
               "push_s": eng.push_s, "tokens": sum(map(len, after.response_ids))}
    write_result(a.out, stage=STAGE, experiment=a.experiment, config={**_cfg(a), "mode": a.mode, "check": "push"},
                 metrics=metrics, kernels=eng.kernels(), vllm=vllm_rollout.available()[1])
    print(json.dumps(metrics))
    moved = metrics["weights_moved_tokens"] or metrics["weights_moved_logprobs"]
    return 0 if metrics["push_unchanged_is_noop"] and metrics["push_equals_fresh"] and moved else 1


def _sample_subprocess(checkpoint: Path, prompts, a, llm_kwargs: dict) -> dict:
    """One fresh engine in its own process (vLLM's offline API: one engine a process)."""
    work = Path(a.work)
    (work / "prompts.json").write_text(json.dumps(prompts))
    out = work / "fresh.json"
    cmd = [sys.executable, "-m", "minite_core.peers.vllm_compare", "sample", "--checkpoint", str(checkpoint),
           "--prompts", str(work / "prompts.json"), "--out", str(out), "--max-new-tokens", str(a.max_new_tokens),
           "--seed", str(a.seed), "--llm-kwargs", json.dumps(llm_kwargs)]
    if subprocess.run(cmd).returncode != 0:
        raise RuntimeError(f"the fresh vLLM engine failed: {' '.join(cmd)}")
    return json.loads(out.read_text())


# ---- compare ---------------------------------------------------------------------------------------------------
def sample_main(a) -> int:
    """(child process of compare) one mode's rollout with full log-prob rows, + the kernels vLLM chose."""
    model, tok = load_model(a)
    eng = _engine(model, tok, a.mode, a, full_rows=True)
    t0 = time.perf_counter()
    r = eng.generate(_prompts(a, tok), max_new_tokens=a.max_new_tokens, seed=a.seed, keep_logprob_rows=True)
    torch.save({**_rollout_dict(r), "logprob_rows": r.logprob_rows, "kernels": eng.kernels(),
                "generate_s": time.perf_counter() - t0, "vllm": vllm_rollout.available()[1]}, a.out)
    return 0


def compare_main(a) -> int:
    out, work = Path(a.out), Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    rollouts = {}
    for mode in a.modes.split(","):
        f = work / f"rollout-{mode}.pt"
        cmd = [sys.executable, "-m", "minite_core.peers.vllm_measure", "sample", "--mode", mode, "--out", str(f),
               *a.passthrough]
        if subprocess.run(cmd).returncode != 0:
            raise RuntimeError(f"vLLM mode {mode} failed: {' '.join(cmd)}")
        rollouts[mode] = torch.load(f)
    model, _ = load_model(a)
    rows, kernels = [], {}
    for mode, d in rollouts.items():
        r = Rollout(d["prompt_ids"], d["response_ids"], d["logprobs"], d["finished"], d["argmax_ids"])
        kernels[mode] = d["kernels"]
        for engine, names in (("learner", a.learners), ("sampler", a.samplers)):
            for name in names.split(","):
                m = _score(model, get_profile(name), r, d["logprob_rows"], engine)
                rows.append((mode, engine, name, m))
                write_result(out / STAGE / f"vllm-{mode}__{engine}-{name}.json", stage=STAGE,
                             experiment=a.experiment, config={**_cfg(a), "vllm_mode": mode, "engine": engine,
                                                              "profile": name, "vllm": d["vllm"]}, metrics=m)
                print(f"vllm:{mode:16s} {engine:7s} {name:20s} k3={m['mismatch/k3']:.3e} "
                      f"max|Δ|={m['mismatch/max_abs_delta']:.3e} kl={m.get('mismatch/kl_full_vocab', float('nan')):.3e}",
                      flush=True)
    write_json(out / STAGE / "kernels.json", kernels)
    _summary(out / STAGE / "summary.md", rows, kernels, a)
    return 0


@torch.no_grad()
def _score(model, profile, r: Rollout, vllm_rows, engine: str) -> dict:
    if engine == "sampler":  # our sampler's own schedule, teacher-forced: no rows kept, no full-vocabulary KL
        logp, mask, amx = Sampler(model, profile).score(r.prompt_ids, r.response_ids)
        return _metrics(logp, mask, amx, r)
    sc = Learner(model, profile).score(r.prompt_ids, r.response_ids, with_argmax=True, sampler_rows=vllm_rows)
    m = _metrics(sc.logp, sc.mask, sc.argmax, r)
    m["mismatch/kl_full_vocab"] = float(sc.kl_full_vocab.double()[sc.mask].mean())
    return m


def _summary(path: Path, rows, kernels, a) -> None:
    lines = [f"# Real vLLM ({vllm_rollout.available()[1]}) against our engines", "",
             f"`{' '.join(sys.argv)}`", "", "| vLLM | our engine | profile | k3 | max abs Δ | KL full vocab | flip |",
             "|---|---|---|---|---|---|---|"]
    for mode, engine, name, m in rows:
        lines.append(f"| vllm:{mode} | {engine} | {name} | {m['mismatch/k3']:.3e} | {m['mismatch/max_abs_delta']:.3e} "
                     f"| {m.get('mismatch/kl_full_vocab', float('nan')):.3e} | {m['mismatch/argmax_flip']:.4f} |")
    lines += ["", "Kernels vLLM chose (module: method / kernel or backend: count):", ""]
    for mode, k in kernels.items():
        lines += [f"- vllm:{mode}: " + "; ".join(f"{key} ×{n}" for key, n in sorted(k.items()))]
    path.write_text("\n".join(lines) + "\n")


# ---- bench -----------------------------------------------------------------------------------------------------
def _time(fn, reps: int) -> float:
    fn()  # warm-up: compiles, captures graphs
    times = []
    for _ in range(reps):
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_main(a) -> int:
    """Ours in this process; each vLLM mode in its own (`bench-vllm`): tokens/s per batch size."""
    out = Path(a.out)
    model, tok = load_model(a)
    base = _prompts(a, tok)
    res, kernels = {}, {}
    for prof in a.samplers.split(","):
        s = make_sampler(model, prof)  # the fast CUDA-graph sampler on the GPU
        for b in map(int, a.batches.split(",")):
            prompts = (base * (b // len(base) + 1))[:b]
            t = _time(lambda: s.generate(prompts, max_new_tokens=a.max_new_tokens, seed=a.seed, stop_ids=()), a.reps)
            res[f"ours:{prof}/b{b}"] = b * a.max_new_tokens / t
    for mode in a.modes.split(","):
        f = Path(a.work) / f"bench-{mode}.json"
        cmd = [sys.executable, "-m", "minite_core.peers.vllm_measure", "bench-vllm", "--mode", mode, "--out", str(f),
               *a.passthrough]
        if subprocess.run(cmd).returncode != 0:
            raise RuntimeError(f"vLLM bench of mode {mode} failed: {' '.join(cmd)}")
        got = json.loads(f.read_text())
        kernels[mode] = got.pop(f"vllm:{mode}/kernels", None)  # the kernels vLLM picked, beside the speeds
        res.update(got)
    write_result(out / STAGE / "decode_bench.json", stage=STAGE, experiment=a.experiment,
                 config={**_cfg(a), "batches": a.batches, "samplers": a.samplers, "modes": a.modes},
                 metrics={f"tokens_per_s/{k}": v for k, v in res.items()}, kernels=kernels)
    for k, v in res.items():
        print(f"{k:40s} {v:12.0f} tok/s")
    return 0


def bench_vllm_main(a) -> int:
    model, tok = load_model(a)
    base = _prompts(a, tok)
    eng = _engine(model, tok, a.mode, a, enforce_eager=False, max_num_seqs=max(map(int, a.batches.split(","))))
    res = {}
    for b in map(int, a.batches.split(",")):
        prompts = (base * (b // len(base) + 1))[:b]
        t = _time(lambda: eng.generate(prompts, max_new_tokens=a.max_new_tokens, seed=a.seed, stop_ids=()), a.reps)
        res[f"vllm:{a.mode}/b{b}"] = b * a.max_new_tokens / t
    res[f"vllm:{a.mode}/kernels"] = eng.kernels()
    write_json(a.out, res)
    return 0


# ---- CLI -------------------------------------------------------------------------------------------------------
def _cfg(a) -> dict:
    return {"checkpoint": a.checkpoint or f"random {a.random}", "num_prompts": a.num_prompts,
            "max_new_tokens": a.max_new_tokens, "seed": a.seed, "device": a.device, "calib_rows": a.calib_rows,
            "kernels": dispatch.current_backend(), "enforce_eager": a.enforce_eager,
            "command": "python -m minite_core.peers.vllm_measure " + " ".join(sys.argv[1:])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minite_core.peers.vllm_measure", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    cmds = {"push-check": push_check_main, "compare": compare_main, "sample": sample_main, "bench": bench_main,
            "bench-vllm": bench_vllm_main}
    for name in cmds:
        p = sub.add_parser(name)
        p.add_argument("--out", required=True)
        p.add_argument("--checkpoint", default=None, help="base model directory (default: a random tiny model)")
        p.add_argument("--random", default="moe", choices=("moe", "dense"), help="the random model without one")
        p.add_argument("--prompts", default=None, help="task JSONL whose prompts are sampled (default: made here)")
        p.add_argument("--calib", default=None, help="task JSONL for the static scales (default: made here)")
        p.add_argument("--calib-rows", type=int, default=64)
        p.add_argument("--num-prompts", type=int, default=64)
        p.add_argument("--max-new-tokens", type=int, default=64)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
        p.add_argument("--work", default="/tmp/minite-vllm-work")
        p.add_argument("--experiment", default="adhoc")
        p.add_argument("--gpu-memory-utilization", type=float, default=0.3)
        p.add_argument("--mode", default="bf16", choices=sorted(vllm_rollout.MODES))
        p.add_argument("--modes", default="bf16,nvfp4,nvfp4-emulation")
        p.add_argument("--learners", default="bf16,te-nvfp4,minite,vllm-marlin-w4a16,vllm-nvfp4,vllm-nvfp4-emulation")
        p.add_argument("--samplers", default="bf16,vllm-marlin-w4a16,vllm-nvfp4")
        p.add_argument("--batches", default="1,16,64,256")
        p.add_argument("--reps", type=int, default=3)
        p.add_argument("--enforce-eager", action="store_true", help="vLLM without torch.compile / CUDA graphs")
    a = ap.parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    # what a child process of compare / bench repeats: every option but the command, --out and --mode
    keep, skip = [], False
    for tok in argv[1:]:
        if skip:
            skip = False
        elif tok in ("--out", "--mode"):
            skip = True
        elif not tok.startswith(("--out=", "--mode=")):
            keep.append(tok)
    a.passthrough = keep
    vllm_rollout.require()
    Path(a.work).mkdir(parents=True, exist_ok=True)
    return cmds[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
