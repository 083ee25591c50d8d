"""Real Transformer Engine rows of the learner bench (`te:<mode>`) and the optimizer memory they need.

Real Transformer Engine rows (`te:<mode>`, e.g. te:bf16, te:fp8-current, te:fp8-block; modes of peers.te_learner):
the same model and batch through `te_learner.build_te_model(model, mode, share_weights=True)` (decoder GEMMs as
te.Linear, one per expert; every copy shares the model's parameter storage) and `te_learner.te_train_step`,
interleaved with the other profiles. `te:<mode>+grouped` runs each expert GEMM as one te.GroupedLinear instead, as
Megatron-Core's TE path runs an MoE (bf16 and FP8 recipes: TE's grouped GEMM has no path for the NVFP4 reference
quantizer, so `te:nvfp4+grouped` fails before any work). The TE copies share one Parameter set (expert views
included, whichever expert path a copy has), so one second AdamW serves every TE row (its state is apart from the
main optimizer's, as the parameters are its own Parameter objects); every optimizer step clears every copy's weight
caches. When TE cannot run a mode here (not installed, no CUDA, an FP8 recipe this GPU lacks) its row is skipped:
the reason is printed and recorded in the payload's `skipped`, and no number is made up.

Memory with TE rows (`OptimizerSwap`): two AdamW states would sit on the GPU at once — at 4 Qwen3-30B-A3B layers
(2.63B fp32 params) 21.0 GB each beside 10.5 GB of weights and 10.5 GB of grads; with the six rows of
experiments/h200.yaml that ran out of memory on the H200 (137 GB allocated). So only the optimizer of the row
about to run keeps its state in device memory: when the round switches between our rows and TE rows, the idle optimizer's state tensors (exp_avg,
exp_avg_sq, step) are copied to pinned CPU memory and the active one's copied back to where they were, bitwise,
before the step's timer starts and before the peak counter is reset. So the GPU holds weights + grads + one
state (42 GB at that shape) and each row's peak is what it would be with its own optimizer alone. Cost, all
outside the timed steps (it lengthens the rounds, so the budget may allow fewer of them): 21 GB each way per
switch, ~1 s at PCIe gen5 rates; with our rows and the TE rows listed as two blocks, at most 3 switches a round.
Host memory holds both states in pinned buffers (torch rounds each up to a power of two: ~2x27 GB at 4 layers).
Grads are freed by every step (zero_grad(set_to_none=True)), so they are never held twice. Why
not alias the TE optimizer's state to the main one's (experts as views W[e] of its exp_avg): AdamW's `step`
count is a tensor per parameter, and the 128 expert views would share W's — `_foreach_add_` would bump it 128
times per step — or count apart from it, so bias correction would no longer be AdamW's. Before any work, a row
whose weights + grads + AdamW state alone exceed the GPU's memory stops the bench with a one-line error.
"""
from __future__ import annotations

import torch

from minite_core.bench.learner_setup import LearnerBenchConfig


GROUPED = "+grouped"  # the row suffix of te.GroupedLinear experts (module docstring)


def te_row(name: str):
    """(the peers.te_learner mode, its expert path) of a `te:<mode>[+grouped]` row, else None. A grouped row of a
    mode TE cannot group raises ValueError."""
    from minite_core.peers import te_learner

    mode = te_learner.learner_mode(name)
    if mode is None:
        return None
    experts = "grouped" if mode.endswith(GROUPED) else "per-expert"
    mode = te_learner.get_mode(mode.removesuffix(GROUPED))
    if experts == "grouped" and mode.recipe == "nvfp4-ref":
        raise ValueError(f"row {name!r}: te.GroupedLinear has no path for TE's NVFP4 reference quantizer; "
                         f"use te:{mode.name} (one te.Linear per expert)")
    return mode, experts


def te_mode(name: str):
    """The peers.te_learner mode of a `te:<mode>[+grouped]` row, else None."""
    row = te_row(name)
    return None if row is None else row[0]


def _weight_slots(te_model) -> dict:
    """{slot: (module, attribute)} of a TE copy's decoder weights, one slot per weight whatever the expert path:
    a dense TELinear's by its name, an expert's by (its TEExperts' name, expert index)."""
    from minite_core.peers import te_learner

    slots, in_experts = {}, set()
    for mod_name, mod in te_model.named_modules():
        if isinstance(mod, te_learner.TEExperts):
            for e in range(mod.num_experts):
                owner = (mod.experts[e].linear, "weight") if mod.path == "per-expert" else (mod.grouped, f"weight{e}")
                slots[(mod_name, e)] = owner
            in_experts.update(id(m) for m in mod.modules())
        elif isinstance(mod, te_learner.TELinear) and id(mod) not in in_experts:
            slots[mod_name] = (mod.linear, "weight")
    return slots


def te_models(cfg: LearnerBenchConfig, model, log=print) -> tuple[dict, torch.optim.Optimizer | None, dict]:
    """({row: TE copy of model}, the TE rows' AdamW or None, {row: reason} of the rows TE cannot run here)."""
    from minite_core.peers import te_learner

    copies, skipped = {}, {}
    for name in cfg.profiles:
        row = te_row(name)
        if row is None:
            continue
        mode, experts = row
        ok, why = te_learner.mode_available(mode)
        if not ok:
            skipped[name] = why
            log(f"skipping {name}: {why}")
            continue
        copies[name] = te_learner.build_te_model(model, mode, share_weights=True, experts=experts)
    if not copies:
        return copies, None, skipped
    first = next(iter(copies.values()))
    shared = {slot: getattr(*owner) for slot, owner in _weight_slots(first).items()}
    for te_model in copies.values():  # one Parameter set for all copies (expert views are new per copy)
        for slot, (owner, attr) in _weight_slots(te_model).items():
            owner.register_parameter(attr, shared[slot])
    fused = next(model.parameters()).is_cuda
    opt = torch.optim.AdamW(first.parameters(), lr=cfg.lr, weight_decay=0.0, **({"fused": True} if fused else {}))
    return copies, opt, skipped


class OptimizerSwap:
    """Keeps only one optimizer's state in device memory (module docstring): `activate(opt)`
    copies the other optimizers' state tensors to CPU memory (pinned when they are on a GPU) and `opt`'s back to
    the devices they came from, bitwise. A no-op when `opt` is already the active one."""

    def __init__(self, *optimizers: torch.optim.Optimizer):
        self.optimizers, self.active = optimizers, None
        self.homes: dict = {}  # parked optimizer -> [(its state dict of one param, key, the tensor's device)]

    def activate(self, opt: torch.optim.Optimizer) -> None:
        if opt is self.active:
            return
        for other in self.optimizers:
            if other is not opt and other not in self.homes:
                self.park(other)
        for state, key, home in self.homes.pop(opt, []):
            state[key] = state[key].to(home, non_blocking=True)
        self.active = opt
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # sync point: the copies are done before the step's timer starts

    def park(self, opt: torch.optim.Optimizer) -> None:
        """Move `opt`'s state tensors to CPU memory (asynchronous from a GPU: `activate` synchronises)."""
        homes = []
        for state in opt.state.values():
            for key, t in state.items():
                if isinstance(t, torch.Tensor):
                    homes.append((state, key, t.device))
                    cpu = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
                    state[key] = cpu.copy_(t, non_blocking=t.is_cuda)  # the device copy is freed (stream-ordered)
        self.homes[opt] = homes
        if self.active is opt:
            self.active = None
