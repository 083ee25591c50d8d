"""First-divergence trace against real vLLM: our model and vLLM's, op by op, on the same tokens.

What: `capture` (run in the vLLM peer venv) generates rollouts with real vLLM and records, with forward hooks on
vLLM's own modules, every op's output row of every forward call (prefill and each decode step), keyed by
(request, position). `trace` replays those tokens through our model under a profile (one full-sequence forward,
the learner's schedule) with hooks on the matching ops, and reports per op, in execution order:
  rel_err   ‖ours − vLLM‖ / ‖vLLM‖ over all rows both computed (float64),
  equal     the fraction of elements that are equal bit for bit,
and the first op above `engines.mismatch.TRACE_THRESHOLD` plus the first op with any difference. Because errors
propagate, `isolate` also runs our arithmetic of each op on vLLM's *own* inputs of that op (rope on vLLM's
q_norm output, attention on vLLM's q/k/v, GEMMs on vLLM's GEMM inputs, the LM head on vLLM's final norm), for
each candidate value of the profile knob that governs it: the variant that equals vLLM bit for bit is the knob's
value for vLLM's CPU path, and an op that no variant reproduces is named as a remaining gap.

Op names (vLLM side → ours): `L{i}.input_layernorm`, `L{i}.q|k|v` (split of qkv_proj ↔ q_proj/k_proj/v_proj),
`L{i}.q_norm|k_norm`, `L{i}.rope_q|rope_k` (rotary_emb ↔ our apply_rope on our q_norm output, recomputed in the
hook with the model's own function and knob), `L{i}.attn` (Attention ↔ o_proj's input), `L{i}.o_proj`,
`L{i}.post_attention_layernorm`, `L{i}.gate|up` (gate_up_proj split), `L{i}.act` (SiluAndMul ↔ down_proj's
input), `L{i}.down_proj`, `final_norm`, `logits` (vLLM: only the rows it samples from). Dense Qwen3 models only.

Shape legend: N = rows of one forward call, F = features of an op's output.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

KEY = 1 << 20  # row key = request * KEY + position


# ---- vLLM side (peer venv) ---------------------------------------------------------------------------------------
def _vllm_hooks(model, runner, store: dict, order: list):
    """Forward hooks on vLLM's Qwen3 modules writing (keys, values) chunks into `store`."""
    from vllm.forward_context import get_forward_context

    state = {"keys": None, "last": None}

    def pre(module, args, kwargs):
        md = get_forward_context().attn_metadata
        meta = next(iter(md.values())) if isinstance(md, dict) else md
        n = int(meta.num_actual_tokens)
        qsl = meta.query_start_loc.tolist()
        reqs = [int(r.split("-")[0]) for r in runner.input_batch.req_ids[:len(qsl) - 1]]
        pos = kwargs["positions"][:n].long()
        req = torch.cat([torch.full((qsl[i + 1] - qsl[i],), r, dtype=torch.long) for i, r in enumerate(reqs)])
        state["keys"] = req * KEY + pos  # (N,)
        state["last"] = torch.tensor([qsl[i + 1] - 1 for i in range(len(reqs))])  # rows vLLM samples from

    def put(name, values, keys=None):
        keys = state["keys"] if keys is None else keys
        if name not in store:
            order.append(name)
            store[name] = []
        store[name].append((keys.clone(), values[:keys.numel()].detach().float().reshape(keys.numel(), -1).clone()))

    def hook(name, split=None):
        def fn(module, args, out):
            y = out[0] if isinstance(out, tuple) else out
            if split is None:
                put(name, y)
                return
            for part, chunk in zip(split[1], y[:state["keys"].numel()].split(split[0], dim=-1)):
                put(f"{name}.{part}" if name else part, chunk)
        return fn

    def rope_hook(L):
        def fn(module, args):  # Attention's inputs = the rotated q, k (rotary_emb is one module shared by layers)
            put(f"{L}.rope_q", args[0])
            put(f"{L}.rope_k", args[1])
        return fn

    handles = [model.register_forward_pre_hook(pre, with_kwargs=True),
               model.model.embed_tokens.register_forward_hook(hook("embed"))]
    cfg = model.config
    H, Hkv, Dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    for i, layer in enumerate(model.model.layers):
        L, a, m = f"L{i}", layer.self_attn, layer.mlp
        handles += [
            layer.input_layernorm.register_forward_hook(hook(f"{L}.input_layernorm")),
            a.qkv_proj.register_forward_hook(hook("", ([H * Dh, Hkv * Dh, Hkv * Dh],
                                                       [f"{L}.q", f"{L}.k", f"{L}.v"]))),
            a.q_norm.register_forward_hook(hook(f"{L}.q_norm")),
            a.k_norm.register_forward_hook(hook(f"{L}.k_norm")),
            a.attn.register_forward_pre_hook(rope_hook(L)),
            a.attn.register_forward_hook(hook(f"{L}.attn")),
            a.o_proj.register_forward_hook(hook(f"{L}.o_proj")),
            layer.post_attention_layernorm.register_forward_hook(hook(f"{L}.post_attention_layernorm")),
        ]
        if not hasattr(m, "gate_up_proj"):  # sparse MoE block: router logits and the block's output
            handles += [m.gate.register_forward_hook(hook(f"{L}.router")),
                        m.register_forward_hook(hook(f"{L}.moe"))]
            continue
        I = m.down_proj.input_size
        handles += [
            m.gate_up_proj.register_forward_hook(hook("", ([I, I], [f"{L}.gate", f"{L}.up"]))),
            m.act_fn.register_forward_hook(hook(f"{L}.act")),
            m.down_proj.register_forward_hook(hook(f"{L}.down_proj")),
        ]
    handles.append(model.model.norm.register_forward_hook(hook("final_norm")))
    handles.append(model.logits_processor.register_forward_hook(
        lambda mod, args, out: put("logits", out, state["keys"][state["last"]])))
    return handles


def capture_main(args) -> int:
    """One vLLM engine: generate, recording every op (see module doc) -> torch file {rollout, ops, order}."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from minite_core.peers.vllm_sampler import VLLMSampler, available, rollout_to_json
    from minite_core.task.tokenizer import EOS_ID

    prompts = json.loads(Path(args.prompts).read_text())
    sampler = VLLMSampler(args.checkpoint, dtype=args.dtype, seed=args.seed)
    runner = sampler.llm.collective_rpc(lambda worker: worker.model_runner)[0]  # in-process engine core
    store, order = {}, []
    handles = _vllm_hooks(runner.model, runner, store, order)
    try:
        r = sampler.generate(prompts, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                             top_p=args.top_p, stop_ids=(EOS_ID,), seed=args.seed)
    finally:
        for h in handles:
            h.remove()
    ops = {name: (torch.cat([k for k, _ in ch]), torch.cat([v for _, v in ch])) for name, ch in store.items()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    torch.save({"rollout": rollout_to_json(r), "ops": ops, "order": order, "dtype": args.dtype,
                "vllm": available()[1]}, tmp)
    tmp.replace(out)
    return 0


# ---- our side ---------------------------------------------------------------------------------------------------
def _our_hooks(model, store: dict, state: dict):
    from minite_core.model.qwen3_moe import SparseMoE, apply_rope
    from minite_core.nn.operands import torch_dtype

    def put(name, values):
        keys = state["keys"]
        store.setdefault(name, []).append((keys, values.detach().float().reshape(keys.numel(), -1)))

    def out_hook(name):
        return lambda mod, args, out: put(name, out)

    def in_hook(name):
        return lambda mod, args: put(name, args[0])

    def rope_hook(name, attn):
        def fn(mod, args, out):  # out: (B, T, H, Dh) -> the rotation the model applies next
            p = attn.o_proj.profile
            rd = torch_dtype(p.rope_dtype) if p.rope_dtype else None
            rot = apply_rope(out.transpose(1, 2), state["cos"], state["sin"], rd, p.kernel_rounding).transpose(1, 2)
            put(name, rot)
        return fn

    def attn_pre(mod, args):
        state["cos"], state["sin"] = args[1], args[2]

    handles = [model.model.embed_tokens.register_forward_hook(  # after the model's cast to the compute dtype
        lambda mod, args, out: put("embed", out.to(torch_dtype(model.profile.dtype))))]
    for i, layer in enumerate(model.model.layers):
        L, a, m = f"L{i}", layer.self_attn, layer.mlp
        handles += [
            layer.input_layernorm.register_forward_hook(out_hook(f"{L}.input_layernorm")),
            a.register_forward_pre_hook(attn_pre),
            a.q_proj.register_forward_hook(out_hook(f"{L}.q")),
            a.k_proj.register_forward_hook(out_hook(f"{L}.k")),
            a.v_proj.register_forward_hook(out_hook(f"{L}.v")),
            a.q_norm.register_forward_hook(out_hook(f"{L}.q_norm")),
            a.k_norm.register_forward_hook(out_hook(f"{L}.k_norm")),
            a.q_norm.register_forward_hook(rope_hook(f"{L}.rope_q", a)),
            a.k_norm.register_forward_hook(rope_hook(f"{L}.rope_k", a)),
            a.o_proj.register_forward_pre_hook(in_hook(f"{L}.attn")),
            a.o_proj.register_forward_hook(out_hook(f"{L}.o_proj")),
            layer.post_attention_layernorm.register_forward_hook(out_hook(f"{L}.post_attention_layernorm")),
        ]
        if isinstance(m, SparseMoE):
            handles += [m.gate.register_forward_hook(out_hook(f"{L}.router")),
                        m.register_forward_hook(out_hook(f"{L}.moe"))]
            continue
        handles += [
            m.gate_proj.register_forward_hook(out_hook(f"{L}.gate")),
            m.up_proj.register_forward_hook(out_hook(f"{L}.up")),
            m.down_proj.register_forward_pre_hook(in_hook(f"{L}.act")),
            m.down_proj.register_forward_hook(out_hook(f"{L}.down_proj")),
        ]
    handles.append(model.model.norm.register_forward_hook(out_hook("final_norm")))
    handles.append(model.lm_head.register_forward_hook(out_hook("logits")))
    return handles


@torch.inference_mode()
def record_ours(model, profile, prompt_ids, response_ids) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Our full-sequence forward (the learner's right-padded batch) under `profile`: op -> (keys, values)."""
    from minite_core.engines.learner import pack_right
    from minite_core.model import use_profile

    ids, attn, _, _ = pack_right(prompt_ids, response_ids, device=model.lm_head.weight.device)
    B, Lq = ids.shape
    keys = torch.arange(B)[:, None] * KEY + torch.arange(Lq)[None]  # (B, L)
    state = {"keys": torch.where(attn.bool().cpu(), keys, -1).reshape(-1)}
    store: dict = {}
    handles = _our_hooks(model, store, state)
    try:
        with use_profile(model, profile):
            model(ids, attention_mask=attn)
    finally:
        for h in handles:
            h.remove()
    return {name: (torch.cat([k for k, _ in ch]), torch.cat([v for _, v in ch])) for name, ch in store.items()}


# ---- comparison ------------------------------------------------------------------------------------------------
def _align(ref: tuple, sut: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows both sides computed, in key order; the last occurrence of a key wins (vLLM computes each once)."""
    def table(kv):
        keys, vals = kv
        keep = keys >= 0
        return dict(zip(keys[keep].tolist(), vals[keep]))
    a, b = table(ref), table(sut)
    common = sorted(set(a) & set(b))
    if not common:
        return torch.empty(0), torch.empty(0)
    return torch.stack([a[k] for k in common]), torch.stack([b[k] for k in common])


def compare_op(ref: torch.Tensor, sut: torch.Tensor) -> dict:
    """rel_err (‖sut − ref‖ / ‖ref‖, float64), equal (bitwise-equal element fraction), max_abs, rows."""
    from minite_core.engines.mismatch import rel_error

    if ref.numel() == 0:
        return {"rel_err": math.nan, "equal": math.nan, "max_abs": math.nan, "rows": 0}
    return {"rel_err": rel_error(ref, sut), "equal": float((ref == sut).double().mean()),
            "max_abs": float((ref.double() - sut.double()).abs().max()), "rows": int(ref.shape[0])}


def trace_against(capture: dict, model, profile, threshold: float | None = None) -> dict:
    """Propagated trace: vLLM's recorded ops (reference) vs ours under `profile` on the capture's tokens."""
    from minite_core.engines.mismatch import TRACE_THRESHOLD
    from minite_core.profiles import get_profile

    threshold = TRACE_THRESHOLD if threshold is None else threshold
    r = capture["rollout"]
    ours = record_ours(model, get_profile(profile), r["prompt_ids"], r["response_ids"])
    rows = []
    for name in capture["order"]:
        if name in ours:
            rows.append({"op": name, **compare_op(*_align(capture["ops"][name], ours[name]))})
    above = next((x for x in rows if x["rel_err"] > threshold), None)
    nonzero = next((x for x in rows if x["equal"] < 1.0), None)
    return {"profile": get_profile(profile).name, "threshold": threshold, "ops": rows,
            "first_divergence": above, "first_nonzero": nonzero}


# ---- isolation: our arithmetic of one op on vLLM's own inputs of that op ------------------------------------------
def _rows(capture: dict, name: str, keys: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's (keys, values) of op `name`, restricted to `keys` (in that order) when given."""
    k, v = capture["ops"][name]
    if keys is None:
        return k, v
    index = {key: i for i, key in enumerate(k.tolist())}
    return keys, v[[index[key] for key in keys.tolist()]]


def _rope(x: torch.Tensor, pos: torch.Tensor, cfg, profile, dtype) -> torch.Tensor:
    """Our apply_rope (with the profile's rope knob) on rows x (N, H*Dh) at positions pos (N,)."""
    from minite_core.model.qwen3_moe import apply_rope, rope_cos_sin
    from minite_core.nn.operands import torch_dtype

    N, Dh = x.shape[0], cfg.head_dim
    cos, sin = rope_cos_sin(pos[None], Dh, cfg.rope_theta, dtype)  # (1, 1, N, Dh)
    xh = x.to(dtype).view(N, -1, Dh).transpose(0, 1)[None]  # (1, H, N, Dh)
    rd = torch_dtype(profile.rope_dtype) if profile.rope_dtype else None
    return apply_rope(xh, cos, sin, rd, profile.kernel_rounding)[0].transpose(0, 1).reshape(N, -1)


def _attention(q, k, v, keys, cfg, profile, dtype) -> torch.Tensor:
    """Our SDPA (with the profile's attention_dtype) per request, causal over the request's positions."""
    from minite_core.model.qwen3_moe import cast
    from minite_core.nn.operands import torch_dtype

    att = torch_dtype(profile.attention_dtype or profile.dtype)
    H, Hkv, Dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    out = torch.empty(q.shape[0], H * Dh)
    req = keys // KEY
    for r in req.unique().tolist():
        idx = (req == r).nonzero().flatten()
        idx = idx[torch.argsort(keys[idx])]  # positions 0..n-1 of request r
        def heads(t, h):
            return t[idx].to(dtype).view(-1, h, Dh).transpose(0, 1)[None].to(att)  # (1, h, n, Dh)
        o = F.scaled_dot_product_attention(heads(q, H), heads(k, Hkv), heads(v, Hkv), is_causal=True,
                                           enable_gqa=H != Hkv)
        out[idx] = cast(o, dtype, profile.kernel_rounding)[0].transpose(0, 1).reshape(-1, H * Dh).float()
    return out


@torch.inference_mode()
def isolate(capture: dict, model, profile) -> list[dict]:
    """Per op: our arithmetic under `profile` on vLLM's inputs of that op vs vLLM's output (module doc)."""
    from minite_core.model import use_profile
    from minite_core.profiles import get_profile

    profile = get_profile(profile)
    with use_profile(model, profile):
        return _isolate(capture, model, profile)


def _isolate(capture: dict, model, profile) -> list[dict]:
    from minite_core.model.qwen3_moe import SparseMoE
    from minite_core.nn.operands import torch_dtype

    dtype, cfg = torch_dtype(profile.dtype), model.config
    rows = []

    def check(op, sut_fn, inputs, knob):
        keys = capture["ops"][op][0]
        args = [_rows(capture, name, keys)[1] for name in inputs]
        ref = capture["ops"][op][1]
        rows.append({"op": op, "inputs": inputs, "knob": knob, **compare_op(ref, sut_fn(keys, *args).float().reshape(ref.shape))})

    for i, layer in enumerate(model.model.layers):
        L, a, m = f"L{i}", layer.self_attn, layer.mlp
        H, Hkv, Dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        lin = lambda mod: (lambda keys, x: mod(x.to(dtype)))  # noqa: E731 - our GEMM on vLLM's input
        for name, mod in (("q", a.q_proj), ("k", a.k_proj), ("v", a.v_proj)):
            check(f"{L}.{name}", lin(mod), [f"{L}.input_layernorm"], "w4a4_gemm")
        check(f"{L}.q_norm", lambda keys, x: a.q_norm(x.to(dtype).view(-1, H, Dh)), [f"{L}.q"], "-")
        check(f"{L}.k_norm", lambda keys, x: a.k_norm(x.to(dtype).view(-1, Hkv, Dh)), [f"{L}.k"], "-")
        for name in ("q", "k"):
            check(f"{L}.rope_{name}", lambda keys, x: _rope(x, keys % KEY, cfg, profile, dtype),
                  [f"{L}.{name}_norm"], "rope_dtype")
        check(f"{L}.attn", lambda keys, q, k, v: _attention(q, k, v, keys, cfg, profile, dtype),
              [f"{L}.rope_q", f"{L}.rope_k", f"{L}.v"], "attention_dtype")
        check(f"{L}.o_proj", lin(a.o_proj), [f"{L}.attn"], "w4a4_gemm")
        if isinstance(m, SparseMoE):
            check(f"{L}.router", lambda keys, x: m.gate(x.to(torch_dtype(profile.router_dtype))),
                  [f"{L}.post_attention_layernorm"], "router_dtype")
            check(f"{L}.moe", lambda keys, x: m(x.to(dtype)[None])[0], [f"{L}.post_attention_layernorm"], "-")
            continue
        check(f"{L}.gate", lin(m.gate_proj), [f"{L}.post_attention_layernorm"], "w4a4_gemm")
        check(f"{L}.up", lin(m.up_proj), [f"{L}.post_attention_layernorm"], "w4a4_gemm")
        check(f"{L}.act", lambda keys, g, u: F.silu(g.to(dtype)) * u.to(dtype), [f"{L}.gate", f"{L}.up"], "-")
        check(f"{L}.down_proj", lin(m.down_proj), [f"{L}.act"], "w4a4_gemm")
    check("logits", lambda keys, x: model.lm_head(x.to(torch_dtype(profile.lm_head_dtype))), ["final_norm"],
          "lm_head_dtype")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minite_core.peers.vllm_trace")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capture", help="(vLLM venv) generate with real vLLM, recording every op")
    c.add_argument("--checkpoint", required=True)
    c.add_argument("--prompts", required=True, help="JSON list of token-id lists")
    c.add_argument("--out", required=True, help="torch file")
    c.add_argument("--dtype", default="bfloat16")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--max-new-tokens", type=int, default=64)
    c.add_argument("--temperature", type=float, default=1.0)
    c.add_argument("--top-p", type=float, default=1.0)
    a = ap.parse_args(argv)
    return {"capture": capture_main}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
