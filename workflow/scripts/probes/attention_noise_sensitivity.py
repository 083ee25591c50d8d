"""Measures how far 1-ulp bf16 noise in attention moves the learner's log-probs of sampled tokens, per profile.

The noise stands for what flash and masked SDPA kernels differ by on a GPU; CPU, reference kernels.
Run from the repository root (PYTHONPATH=$PWD):
    python workflow/scripts/probes/attention_noise_sensitivity.py CHECKPOINT DATA FRAC [attn|proj]
FRAC: the fraction of elements nudged by +-1 ulp; `proj` puts the noise on the q/k/v/o GEMM outputs instead of the
attention output. The findings: results/notes/rl_minite_k3.md."""
import sys
import torch
import torch.nn.functional as F
from minite_core.engines import Learner, Sampler
from minite_core.engines.mismatch import mismatch_metrics
from minite_core.model import load_pretrained
from minite_core.task.data import load_split
from minite_core.task.tokenizer import encode, load_tokenizer

torch.set_num_threads(1)
ckpt, data = sys.argv[1], sys.argv[2]
frac = float(sys.argv[3])
where = sys.argv[4] if len(sys.argv) > 4 else "attn"  # attn | proj (q/k/v/o GEMM outputs)
B, G, max_new = 16, 4, 120
orig = F.scaled_dot_product_attention
state = {"on": False, "gen": None}

def noise(out):
    if not state["on"] or out.dtype != torch.bfloat16:
        return out
    bits = out.view(torch.int16)
    pick = torch.rand(out.shape, generator=state["gen"]) < frac
    step = torch.where(torch.rand(out.shape, generator=state["gen"]) < 0.5, 1, -1).to(torch.int16)
    nz = out != 0
    return torch.where(pick & nz, bits + step, bits).view(torch.bfloat16)  # +-1 ulp (magnitude up or down)

def noisy_sdpa(*a, **k):
    return noise(orig(*a, **k))

model = load_pretrained(ckpt, dtype=torch.float32)
if where == "attn":
    F.scaled_dot_product_attention = noisy_sdpa
else:
    from minite_core.nn import QuantLinear
    for mod in model.modules():
        if isinstance(mod, QuantLinear) and mod.role == "linear":
            mod.register_forward_hook(lambda m, i, o: noise(o))
tok = load_tokenizer(ckpt)
train = load_split(data, "train")
prompts = [p for p in encode(tok, train)[0][:B] for _ in range(G)]
for profile in ("bf16", "minite"):
    roll = Sampler(model, profile).generate(prompts, max_new_tokens=max_new, temperature=1.0, seed=5)
    rp = roll.padded()
    L = Learner(model, profile)
    with torch.no_grad():
        lp0, _, mask = L.logprobs(prompts, roll.response_ids)
        res = []
        for rep in range(3):
            state.update(on=True, gen=torch.Generator().manual_seed(100 + rep))
            lp1, _, _ = L.logprobs(prompts, roll.response_ids)
            state["on"] = False
            m_all = mismatch_metrics(lp1, lp0, mask)
            m64 = mismatch_metrics(lp1[:, :64], lp0[:, :64], mask[:, :64])
            tail = mask.clone(); tail[:, :64] = False
            d = (lp1 - lp0)
            res.append((m_all["mismatch/k3"], m64["mismatch/k3"], d[mask].abs().max().item(),
                        d[tail].abs().max().item() if tail.any() else float("nan")))
    base = mismatch_metrics(lp0, rp["logprobs"], mask)["mismatch/k3"]
    print(f"{profile}: tokens {int(mask.sum())} (beyond 64: {int(mask[:, 64:].sum())}) sampler-vs-learner k3 {base:.2e}")
    for r in res:
        print(f"  noise {where} frac {frac}: k3 all {r[0]:.2e}  k3 first-64 {r[1]:.2e}  max|d| {r[2]:.2e}  max|d| beyond 64 {r[3]:.2e}")
