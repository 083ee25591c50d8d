"""Measures the RL-loop mismatch: sampler vs learner old log-probs per profile, before and after AdamW steps.

Run from the repository root (PYTHONPATH=$PWD; CPU, or a GPU with ENGINE fast):
    python workflow/scripts/probes/rl_loop_mismatch.py CHECKPOINT DATA ENGINE PROFILE B G MAX_NEW STEPS
e.g. `... /tmp/onpolicy/model results/smoke/data reference minite 2 2 80 2` (ENGINE: reference | fast | fast-eager).
Prints, each step, k3, max |Δ| and whether the two engines' log-probs are bitwise equal; then one AdamW step, so
the next step runs on changed weights. The findings: results/notes/rl_minite_k3.md."""
import sys, time
import torch
from minite_core.engines import Learner, make_sampler
from minite_core.engines.mismatch import mismatch_metrics
from minite_core.model import load_pretrained
from minite_core.nn import track_optimizer
from minite_core.kernels import dispatch
from minite_core.task.data import load_split
from minite_core.task.tokenizer import encode, load_tokenizer
from minite_core.seeds import tagged

torch.set_num_threads(1)
ckpt, data = sys.argv[1], sys.argv[2]
engine, profile = sys.argv[3], sys.argv[4]
B, G, max_new, steps = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8])
model = load_pretrained(ckpt, dtype=torch.float32)
tok = load_tokenizer(ckpt)
train = load_split(data, "train")
prompts_all = encode(tok, train)[0]
learner = Learner(model, profile, seed=1)
sampler = make_sampler(model, profile, engine=engine)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
track_optimizer(opt, model)
print("backend", dispatch.current_backend(), "engine", engine, "profile", profile, flush=True)
for step in range(1, steps + 1):
    t0 = time.time()
    prompts = [prompts_all[i] for i in range(B * step, B * step + B) for _ in range(G)]
    roll = sampler.generate(prompts, max_new_tokens=max_new, temperature=1.0, seed=tagged(0, "sample", step))
    rp = roll.padded()
    with torch.no_grad():
        lp, _, mask = learner.logprobs(prompts, roll.response_ids)
    d = (lp - rp["logprobs"])[mask]
    m = mismatch_metrics(lp, rp["logprobs"], mask)
    print(f"step {step} tokens {int(mask.sum())} k3 {m['mismatch/k3']:.3e} max|d| {d.abs().max():.3e} "
          f"bitwise_equal {bool((d == 0).all())} finished {sum(roll.finished)}/{len(roll)} ({time.time()-t0:.0f}s)",
          flush=True)
    # one update so the next step runs on changed weights (stale caches would show here)
    model.train()
    logp_new, _, _ = learner.logprobs(prompts, roll.response_ids, grad=True)
    loss = -(logp_new * mask).sum() / mask.sum()
    opt.zero_grad(); loss.backward(); opt.step()
