"""Where a learner step's time and memory go, per profile (H200 probe).

usage: PYTHONPATH=. python3 workflow/scripts/probe_learner_phases.py PROFILES_4_LAYERS [PROFILES_6_LAYERS]
(comma lists). Builds `bench learner --config h200` at 4 layers (then 6), runs two warm-up steps per profile, then
times forward / backward / AdamW with CUDA events and reads the allocator around each phase (current and peak
GB), and prints the step's kernel table (bench.op_profile). Writes $OUT/probe.json. Not a benchmark: one step,
no interleaving (`bench learner` is the measurement); it answers "which phase, which kernel, how much memory".
"""
import json
import os
import sys

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # before CUDA starts, as the bench

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from minite_core.bench import learner_setup as L  # noqa: E402
from minite_core.bench.op_profile import kernel_table, profiled  # noqa: E402
from minite_core.model import use_profile  # noqa: E402

GB = 1e9


def phases(model, opt, ids, labels) -> dict:
    """One learner step split at forward+loss / backward / AdamW: ms per phase, allocated and peak GB."""
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    ev[0].record()
    logits = model(ids)
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))
    ev[1].record()
    torch.cuda.synchronize()
    after_fwd, peak_fwd = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    del logits, loss
    ev[2].record()
    torch.cuda.synchronize()
    after_bwd, peak_bwd = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    opt.step()
    opt.zero_grad(set_to_none=True)
    ev[3].record()
    torch.cuda.synchronize()
    return dict(fwd_ms=ev[0].elapsed_time(ev[1]), bwd_ms=ev[1].elapsed_time(ev[2]), opt_ms=ev[2].elapsed_time(ev[3]),
                mem_start=start / GB, mem_after_fwd=after_fwd / GB, peak_fwd=peak_fwd / GB,
                mem_after_bwd=after_bwd / GB, peak_bwd=peak_bwd / GB, peak_opt=torch.cuda.max_memory_allocated() / GB)


def run(layers: int, profiles: list[str], top: int = 45, kernels: bool = True) -> dict:
    dev = torch.device("cuda")
    cfg = L.resolve_config("h200", dev, layers=layers, seq=4096, batch=4)
    model, opt, ids, labels = L.build(cfg, dev)
    res = {}
    for name in profiles:
        with use_profile(model, name):
            for r in range(2):  # warm-up: Triton compiles, allocator growth
                L.set_step_seed(model, r)
                L.learner_step(model, opt, ids, labels)
            res[name] = {"phases": phases(model, opt, ids, labels)}
            print(name, layers, json.dumps({k: round(v, 2) for k, v in res[name]["phases"].items()}), flush=True)
            if kernels:
                with profiled(dev) as prof:
                    L.learner_step(model, opt, ids, labels)
                table = res[name]["kernels"] = kernel_table(prof, top=top)
                print(f"  {table['kernels_per_step']:.0f} kernels {table['kernel_ms_per_step']:.1f} ms", flush=True)
                for row in table["top"]:
                    print(f"  {row['ms_per_step']:8.2f} ms x{row['calls_per_step']:<5g} {row['kernel'][:110]}",
                          flush=True)
    del model, opt
    torch.cuda.empty_cache()
    return res


def main(argv: list[str]) -> None:
    out_path = os.path.join(os.environ.get("OUT", "/tmp"), "probe.json")
    out = {"l4": run(4, argv[0].split(","))}
    if len(argv) > 1:
        try:
            out["l6"] = run(6, argv[1].split(","), kernels=False)
        except torch.OutOfMemoryError as e:  # the answer to "does it fit", recorded
            print("6 layers: out of memory:", str(e)[:300], flush=True)
            out["l6"] = {"oom": str(e)[:500]}
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
