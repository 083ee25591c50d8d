"""NVFP4 checkpoint export / import in the compressed-tensors `nvfp4-pack-quantized` layout (what vLLM loads).

What: our CausalLM (+ the static activation amax that `minite_core.model.calibrate` records) -> a transformers-style
checkpoint directory whose decoder Linears are W4A4 NVFP4, and back. Every quantized Linear `P` becomes

    P.weight_packed        uint8          [out, in/2]   two E2M1 codes a byte, even column in the low nibble
    P.weight_scale         float8_e4m3fn  [out, in/16]  one E4M3 scale per 1x16 block along `in`
    P.weight_global_scale  float32        [1]           ENCODE convention: S_enc = 2688 / amax (vLLM inverts it)
    P.input_global_scale   float32        [1]           S_enc of the calibrated input amax (static activation scale)

MoE experts are written per expert (`mlp.experts.{e}.gate_proj.weight_packed`, ...), the on-disk form of
transformers 5 and of hub checkpoints. The router (`mlp.gate`), the LM head, embeddings and norms stay in `dtype`
(bf16) and are listed in `ignore` (the router is not a target in llm-compressor's recipes either).
Codes and block scales come from our bit-exact quantizer (`formats.nvfp4.quantize`) with the weight spec of the
chosen profile (default `vllm-nvfp4`: 1x16, per-tensor, fast math), so the file holds exactly the bits that our
`vllm-nvfp4` emulation computes with -- provided that emulation uses the same *shared* global scales:

Shared weight global scales (how this differs from quantizing each matrix on its own). vLLM fuses q/k/v into one
QKVParallelLinear and gate/up into one MergedColumnParallelLinear, which hold ONE weight global scale; on load it
takes the max over the shards' scales (llm-compressor writes them equal for that reason). So q/k/v (and gate/up)
are quantized with the amax of their concatenation, `shared_amax = max(amax(Wq), amax(Wk), amax(Wv))`, which
changes the codes and block scales of every member whose own amax is smaller. `shared_weight_amax(model)` returns
that amax per module; an engine that emulates this checkpoint must quantize weights with it as a static amax
(`quantize(W, amax=shared_amax, ...)`), see `fusion_groups`. Our grouped expert weight `gate_up` [E, 2I, D] already
is gate|up concatenated, so a per-expert tensor scale there equals the shared scale.

Import (`load_nvfp4`) rebuilds a CausalLM whose Linear weights are the dequantized codes (x̂ = e2m1·sf·S_dec, fp32)
and whose `input_amax` re-derives the file's input_global_scale bit-exactly (`amax_for_encode_scale`). NVFP4
re-quantization is not idempotent (quantize(dequantize(q)) != q in general: a block whose largest code is < 6
gets a smaller scale), so the import also returns the NVFP4 tensors themselves: re-exporting them
(`export_nvfp4(..., weights=...)`) reproduces the file to the bit, and an emulation that must run exactly the
checkpoint's codes uses them (`pinned_weights`).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from minite_core.formats.nvfp4 import GLOBAL_ENC_NUMERATOR, NVFP4Tensor, dequantize, global_encode_scale, quantize
from minite_core.model.config import ModelConfig
from minite_core.model.io import (CONFIG_NAME, WEIGHTS_NAME, check_finite, read_config, read_safetensors,
                                 write_safetensors)
from minite_core.model.qwen3_moe import CausalLM
from minite_core.kernels import dispatch
from minite_core.nn import GroupedLinear, QuantLinear, gemm_modules
from minite_core.nn.arithmetic import gemm_nt
from minite_core.nn.operands import fused_weight_amax
from minite_core.profiles import Profile, get_profile
from minite_core.results import atomic_write_bytes

FORMAT = "nvfp4-pack-quantized"
_SUFFIXES = ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale")
_NVFP4_ARGS = {  # compressed-tensors QuantizationArgs of llm-compressor's NVFP4 preset scheme
    "num_bits": 4, "type": "float", "symmetric": True, "group_size": 16, "strategy": "tensor_group",
    "block_structure": None, "actorder": None, "observer": "minmax", "observer_kwargs": {},
    "scale_dtype": "float8_e4m3fn",
}


def quantization_config(ignore: list[str]) -> dict:
    """config.json `quantization_config` of a compressed-tensors NVFP4 W4A4 checkpoint.
    Weights: static 1x16 scales + a per-tensor global scale; inputs: `dynamic: "local"` = block scales computed at
    run time, global scale static (input_global_scale)."""
    return {
        "quant_method": "compressed-tensors",
        "format": FORMAT,
        "quantization_status": "compressed",
        "ignore": list(ignore),
        "kv_cache_scheme": None,
        "sparsity_config": {},
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "format": FORMAT,
            "weights": {**_NVFP4_ARGS, "dynamic": False},
            "input_activations": {**_NVFP4_ARGS, "dynamic": "local"},
            "output_activations": None,
        }},
    }


@dataclass
class CheckpointWeight:
    """One GEMM weight as the checkpoint stores it: `nvfp4` [N, K] (codes, E4M3 block scales, S_dec) and
    `encode_scale` = S_enc, the file's weight_global_scale. Kept apart because S_enc is not recoverable from
    S_dec = 1/S_enc bit for bit (the fp32 reciprocal is not injective)."""

    nvfp4: NVFP4Tensor
    encode_scale: torch.Tensor  # fp32 []


# ---- which modules, which scale groups ---------------------------------------------------------------------------
def _quantized_linears(model: CausalLM) -> dict[str, QuantLinear | GroupedLinear]:
    """Decoder GEMMs that a W4A4 checkpoint quantizes (role "linear" and the expert GEMMs), by our module name."""
    return dict(gemm_modules(model, linear_only=True))


def fusion_groups(model: CausalLM) -> list[list[str]]:
    """Module names that share one weight global scale: the model's own fused groups (`QuantLinear.fused_group`:
    [q, k, v] and [gate, up] of each layer); every other QuantLinear is a group of one. GroupedLinear weights are
    per-expert groups by construction (see module doc)."""
    mods = _quantized_linears(model)
    names = {id(m): n for n, m in mods.items()}
    groups, seen = [], set()
    for name, m in mods.items():
        if name in seen:
            continue
        group = [names[id(g)] for g in getattr(m, "fused_group", ())] or [name]
        seen.update(group)
        groups.append(group)
    return groups


@torch.no_grad()
def shared_weight_amax(model: CausalLM) -> dict[str, torch.Tensor]:
    """Weight amax that each quantized GEMM must use as a static amax to match a fused-layer engine (vLLM):
    fp32 [] for a QuantLinear (max over its fusion group: nn's `fused_weight_amax`, the value QuantLinear uses
    under `fused_weight_scale`), fp32 [E] for a GroupedLinear (per expert over its [out, in] slab; `gate_up` is
    gate|up, so this is the shared gate/up amax)."""
    out: dict[str, torch.Tensor] = {}
    for name, m in _quantized_linears(model).items():
        if isinstance(m, GroupedLinear):
            out[name] = m.weight.detach().float().abs().amax(dim=(1, 2))  # (E,)
        elif m.fused_group:
            out[name] = fused_weight_amax(m.fused_group)[0]
        else:
            out[name] = m.weight.detach().abs().amax().float()
    return out


def _weight_spec(profile: Profile):
    spec = profile.weight
    if spec is None or spec.scale_mode != "tensor" or spec.rounding != "rne":
        raise ValueError(f"profile {profile.name!r}: export needs per-tensor RNE NVFP4 weights, got {spec}")
    return spec


def _input_amax(module, n_experts: int | None) -> torch.Tensor:
    amax = getattr(module, "input_amax", None)
    if amax is None:
        return None
    amax = amax.detach().float().reshape(-1)
    if n_experts is not None:
        return amax.expand(n_experts) if amax.numel() == 1 else amax
    if amax.numel() != 1:
        raise ValueError(f"QuantLinear.input_amax must be a scalar, got shape {tuple(amax.shape)}")
    return amax[0]


# ---- export -----------------------------------------------------------------------------------------------------
@torch.no_grad()
def quantize_checkpoint_weights(model: CausalLM, profile: Profile | str = "vllm-nvfp4"
                                ) -> dict[str, CheckpointWeight | list[CheckpointWeight]]:
    """Our module name -> CheckpointWeight (QuantLinear) or a list of E of them (GroupedLinear, [N, K] each),
    quantized with the profile's weight spec and the shared amax. Layers that `profile.for_layer` keeps in high
    precision (boundary layers) are left out."""
    profile = get_profile(profile)
    spec = _weight_spec(profile)
    amax = shared_weight_amax(model)
    L = model.config.num_hidden_layers
    out: dict[str, CheckpointWeight | list[CheckpointWeight]] = {}

    def q(w: torch.Tensor, a: torch.Tensor) -> CheckpointWeight:
        return CheckpointWeight(quantize(w.float(), block=spec.block, scale_mode="tensor", amax=a, math=spec.math),
                                global_encode_scale(a).reshape(()))

    for name, m in _quantized_linears(model).items():
        if profile.for_layer(int(name.split(".")[2]), L).weight is None:
            continue
        if isinstance(m, GroupedLinear):
            out[name] = [q(m.weight[e], amax[name][e]) for e in range(m.num_experts)]
        else:
            out[name] = q(m.weight, amax[name])
    return out


def _hf_entries(model: CausalLM, weights: dict) -> list[tuple[str, CheckpointWeight, torch.Tensor | None]]:
    """(checkpoint prefix, weight, input amax) per checkpoint Linear; experts split per expert."""
    mods = _quantized_linears(model)
    I = model.config.moe_intermediate_size
    entries = []
    for name, w in weights.items():
        m = mods[name]
        if isinstance(m, GroupedLinear):
            amax = _input_amax(m, m.num_experts)
            prefix = name.rpartition(".")[0]  # model.layers.i.mlp.experts
            for e, w_e in enumerate(w):
                a = None if amax is None else amax[e]
                if name.endswith(".gate_up"):  # rows [0, I) gate, [I, 2I) up; same global scale
                    for proj, rows in (("gate_proj", slice(0, I)), ("up_proj", slice(I, 2 * I))):
                        entries.append((f"{prefix}.{e}.{proj}", _rows(w_e, rows), a))
                else:
                    entries.append((f"{prefix}.{e}.down_proj", w_e, a))
        else:
            entries.append((name, w, _input_amax(m, None)))
    return entries


def _rows(w: CheckpointWeight, rows: slice) -> CheckpointWeight:
    t = w.nvfp4
    return CheckpointWeight(NVFP4Tensor(t.data[rows].contiguous(), t.scale[rows].contiguous(), t.global_scale),
                            w.encode_scale)


def _fp32_preimage(f, target: torch.Tensor, guess: torch.Tensor) -> torch.Tensor:
    """An fp32 x near `guess` with f(x) == target bit for bit (f monotone, correctly rounded division)."""
    x = guess.clone()
    for _ in range(64):
        y = f(x)
        if torch.equal(y, target):
            return x
        # f is decreasing (c / x): too large an output -> larger x
        x = torch.nextafter(x, torch.full_like(x, float("inf") if y > target else 0.0))
    raise ValueError(f"no fp32 preimage of {target.item()!r} near {guess.item()!r}")


def amax_for_encode_scale(s_enc: torch.Tensor) -> torch.Tensor:
    """An amax with `global_encode_scale(amax) == s_enc` exactly (fp32 []): the inverse used on import, so our
    static quantizer runs the checkpoint's input_global_scale to the bit."""
    s_enc = s_enc.float().reshape(())
    if s_enc == 1.0:
        return torch.zeros((), dtype=torch.float32)  # amax == 0 maps to S_enc = 1
    guess = torch.full_like(s_enc, GLOBAL_ENC_NUMERATOR) / s_enc
    return _fp32_preimage(global_encode_scale, s_enc, guess)


def export_nvfp4(model: CausalLM, path: str | Path, *, profile: Profile | str = "vllm-nvfp4",
                 dtype: torch.dtype = torch.bfloat16, weights: dict | None = None) -> Path:
    """Write `path/config.json` (+ quantization_config) and `path/model.safetensors` in the compressed-tensors
    NVFP4 layout. Every quantized Linear needs a calibrated `input_amax` (`minite_core.model.calibrate`).
    `weights`: NVFP4 tensors to write instead of quantizing (e.g. those returned by `load_nvfp4`)."""
    tensors, hf = nvfp4_checkpoint(model, profile=profile, dtype=dtype, weights=weights)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    write_safetensors(path / WEIGHTS_NAME, tensors, {"format": "pt"})
    atomic_write_bytes(path / CONFIG_NAME, (json.dumps(hf, indent=2) + "\n").encode())
    return path


def nvfp4_checkpoint(model: CausalLM, *, profile: Profile | str = "vllm-nvfp4", dtype: torch.dtype = torch.bfloat16,
                     weights: dict | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """What `export_nvfp4` writes, in memory: (checkpoint name -> tensor on the CPU, config.json as a dict). A
    running vLLM engine takes the same tensors as a weight update (peers/vllm_rollout.py)."""
    profile = get_profile(profile)
    weights = quantize_checkpoint_weights(model, profile) if weights is None else weights
    entries = _hf_entries(model, weights)
    missing = sorted({p for p, _, a in entries if a is None})
    if missing:
        raise ValueError(f"{len(missing)} Linears have no calibrated input_amax (e.g. {missing[:3]}): run "
                         "minite_core.model.calibrate(model, batches) before export_nvfp4")
    tensors: dict[str, torch.Tensor] = {}
    for prefix, w, amax in entries:
        tensors[f"{prefix}.weight_packed"] = w.nvfp4.data.contiguous().cpu()
        tensors[f"{prefix}.weight_scale"] = w.nvfp4.scale.contiguous().cpu()
        tensors[f"{prefix}.weight_global_scale"] = w.encode_scale.float().reshape(1).clone()  # own storage
        tensors[f"{prefix}.input_global_scale"] = global_encode_scale(amax).reshape(1).clone()
    quantized = {name for name in weights}
    ignore = ["lm_head"]
    for name, m in _quantized_linears(model).items():  # boundary layers stay high precision
        if name not in quantized:
            ignore += ([f"{name.rpartition('.')[0]}.{e}.{p}" for e in range(m.num_experts)
                        for p in (("gate_proj", "up_proj") if name.endswith("gate_up") else ("down_proj",))]
                       if isinstance(m, GroupedLinear) else [name])
    if model.config.is_moe:
        ignore.append("re:.*mlp.gate$")  # the router: a Linear in vLLM's Qwen3-MoE, never quantized here
    for name, p in model.named_parameters():
        if name.endswith(".weight") and name[: -len(".weight")] in quantized:
            continue
        if name.endswith(".mlp.experts.gate_up.weight") or name.endswith(".mlp.experts.down.weight"):
            _put_experts(tensors, name, p, model.config, dtype)
            continue
        tensors[name] = p.detach().to(dtype).contiguous().cpu()
    hf = model.config.to_hf(dtype=str(dtype).removeprefix("torch."))
    hf["quantization_config"] = quantization_config(ignore)
    return tensors, hf


def _put_experts(tensors, name, p, config: ModelConfig, dtype) -> None:
    """High-precision experts (boundary layer) in the per-expert on-disk form."""
    prefix, I = name.rsplit(".", 2)[0], config.moe_intermediate_size
    for e in range(p.shape[0]):
        if name.endswith("gate_up.weight"):
            tensors[f"{prefix}.{e}.gate_proj.weight"] = p[e, :I].detach().to(dtype).contiguous()
            tensors[f"{prefix}.{e}.up_proj.weight"] = p[e, I:].detach().to(dtype).contiguous()
        else:
            tensors[f"{prefix}.{e}.down_proj.weight"] = p[e].detach().to(dtype).contiguous()


# ---- import -----------------------------------------------------------------------------------------------------
_QPREFIX = re.compile(r"^(.*)\.weight_packed$")
_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)$")


def read_nvfp4_tensors(raw: dict[str, torch.Tensor]) -> dict[str, tuple[CheckpointWeight, torch.Tensor]]:
    """Checkpoint prefix -> (weight with S_dec = 1 / weight_global_scale, input_global_scale fp32 [])."""
    out = {}
    for key in raw:
        m = _QPREFIX.match(key)
        if not m:
            continue
        p = m.group(1)
        s_enc = raw[f"{p}.weight_global_scale"].float().reshape(())
        s_dec = torch.full_like(s_enc, 1.0) / s_enc  # correctly rounded, as quantize computes S_dec
        out[p] = (CheckpointWeight(NVFP4Tensor(raw[key], raw[f"{p}.weight_scale"], s_dec), s_enc),
                  raw[f"{p}.input_global_scale"].float().reshape(()))
    return out


def load_nvfp4(path: str | Path, dtype: torch.dtype = torch.float32
               ) -> tuple[CausalLM, dict[str, CheckpointWeight | list[CheckpointWeight]]]:
    """(model with dequantized weights in `dtype` + input_amax, NVFP4 weights by our module name)."""
    path = Path(path)
    hf = read_config(path)
    qc = hf.get("quantization_config") or {}
    if qc.get("format") != FORMAT:
        raise ValueError(f"{path}: quantization_config.format={qc.get('format')!r}, expected {FORMAT!r}")
    config = ModelConfig.from_hf(hf)
    raw = read_safetensors(path)
    check_finite(raw, path)
    q = read_nvfp4_tensors(raw)
    plain = {k: v for k, v in raw.items() if not any(k.endswith("." + s) for s in _SUFFIXES)}
    weights: dict[str, CheckpointWeight | list[CheckpointWeight]] = {}
    amax: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, dict[str, tuple[CheckpointWeight, torch.Tensor]]]] = {}
    for prefix, (w, s_in) in q.items():
        m = _EXPERT.match(prefix)
        if m:
            experts.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = (w, s_in)
            continue
        weights[prefix] = w
        amax[prefix] = amax_for_encode_scale(s_in)
        plain[f"{prefix}.weight"] = dequantize(w.nvfp4)
    for prefix, per_e in experts.items():
        E = config.num_experts
        if sorted(per_e) != list(range(E)):
            raise ValueError(f"{prefix}: quantized experts {sorted(per_e)} != 0..{E - 1}")
        gate_up, down, a_gu, a_d = [], [], [], []
        for e in range(E):
            (g, s_g), (u, s_u), (d, s_d) = (per_e[e][p] for p in ("gate_proj", "up_proj", "down_proj"))
            if not torch.equal(g.encode_scale, u.encode_scale) or not torch.equal(s_g, s_u):
                raise ValueError(f"{prefix}.{e}: gate/up global scales differ; our fused gate_up needs them equal")
            gate_up.append(CheckpointWeight(NVFP4Tensor(torch.cat([g.nvfp4.data, u.nvfp4.data]),
                                                        torch.cat([g.nvfp4.scale, u.nvfp4.scale]),
                                                        g.nvfp4.global_scale), g.encode_scale))
            down.append(d)
            a_gu.append(amax_for_encode_scale(s_g))
            a_d.append(amax_for_encode_scale(s_d))
            for proj, t in (("gate_proj", g), ("up_proj", u), ("down_proj", d)):
                plain[f"{prefix}.{e}.{proj}.weight"] = dequantize(t.nvfp4)
        weights[f"{prefix}.gate_up"], weights[f"{prefix}.down"] = gate_up, down
        amax[f"{prefix}.gate_up"], amax[f"{prefix}.down"] = _one_if_equal(a_gu), _one_if_equal(a_d)
    from minite_core.model.io import from_hf_state_dict  # per-expert names -> our fused GroupedLinear weights

    state = from_hf_state_dict(plain, config)
    with torch.device("meta"):
        model = CausalLM(config)
    expected = set(model.state_dict()) - ({"lm_head.weight"} if config.tie_word_embeddings else set())
    if set(state) != expected:
        raise ValueError(f"{path}: missing={sorted(expected - set(state))[:8]} "
                         f"unexpected={sorted(set(state) - expected)[:8]}")
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    for name, a in amax.items():
        model.get_submodule(name).input_amax = a
    return model, weights


def _one_if_equal(per_expert: list[torch.Tensor]) -> torch.Tensor:
    """GroupedLinear holds one static input amax per grouped GEMM (what `calibrate` records); a checkpoint stores
    one per expert. Equal values (our exports) -> the scalar; different ones (another tool's calibration) -> [E],
    which a per-expert static scale in GroupedLinear would need (it raises on [E] today, loudly)."""
    stacked = torch.stack(per_expert)
    return stacked[0].clone() if bool((stacked == stacked[0]).all()) else stacked


# ---- pinning a checkpoint's codes into our model ---------------------------------------------------------------
class pinned_weights:
    """Context manager: every QuantLinear named in `weights` computes y = Q(x) W_ckptᵀ with the checkpoint's own
    NVFP4 weight (no re-quantization of W) and its profile's activation spec and static input_amax.

    Why: our nn quantizes the master weight with its own per-matrix amax; to run *exactly* a checkpoint's codes
    (shared q/k/v scales, or a checkpoint made by another tool) the weight must not be re-quantized (NVFP4
    re-quantization is not idempotent). Implemented with forward hooks that replace the module's output with nn's
    own W4A4 step on the pinned weight: the activation through `kernels.dispatch.quantize` with the profile's
    spec, the GEMM through `nn.arithmetic.gemm_nt` (the same calls QuantLinear makes; no second GEMM here).
    Only QuantLinear (dense models); GroupedLinear experts are not pinned (vLLM CPU has no NVFP4 MoE either)."""

    def __init__(self, model: CausalLM, weights: dict):
        self.model, self.weights, self.handles = model, weights, []

    def __enter__(self):
        for name, w in self.weights.items():
            m = self.model.get_submodule(name)
            if isinstance(m, GroupedLinear):
                raise NotImplementedError(f"{name}: pinning grouped expert weights is not implemented")

            def hook(module, args, output, w_q=w.nvfp4):
                (x,) = args
                prof = module.profile
                if prof.weight is None or prof.activation is None:
                    raise RuntimeError(f"pinned_weights needs a W4A4 profile, got {prof.name!r}")
                amax = module.input_amax if prof.activation.static else None
                x2 = x.reshape(-1, x.shape[-1]).to(output.dtype)  # (M, K)
                y = gemm_nt(dispatch.quantize(x2, prof.activation, amax=amax, check=False), w_q)  # (M, N) fp32
                return y.to(output.dtype).reshape(output.shape)

            self.handles.append(m.register_forward_hook(hook))
        return self.model

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles.clear()
        return False
