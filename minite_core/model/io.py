"""Load / save CausalLM in the transformers on-disk format (config.json + safetensors).

Expert layout (checked against transformers 5.19 by instantiating a tiny Qwen3MoeForCausalLM):
- in memory, transformers 5 fuses experts: `mlp.experts.gate_up_proj` [E, 2I, D] (gate rows first, i.e.
  `cat([gate, up], dim=1)` of the stacked per-expert weights) and `mlp.experts.down_proj` [E, D, I] (no `.weight`);
- on disk, `save_pretrained` reverses its conversion mapping and writes per-expert keys, the format of the hub
  checkpoints and what vLLM reads: `mlp.experts.{e}.gate_proj.weight` [I, D], `.up_proj.weight` [I, D],
  `.down_proj.weight` [D, I].
We save the per-expert form; we load all three spellings (per-expert, transformers' fused in-memory names, and
ours: `mlp.experts.gate_up.weight` / `mlp.experts.down.weight`). All other names are transformers' verbatim.
Tied embeddings: `lm_head.weight` is not written (transformers re-ties it) and is ignored when present.

Calibrated static activation scales (`input_amax` buffers on QuantLinear / GroupedLinear) are written under our
module names (`...q_proj.input_amax`); transformers reports them as unexpected keys and ignores them.

Loading checks what it loads: a missing or unreadable config.json / safetensors file is an error naming the file,
and every floating tensor must be finite (one check per tensor on load: a NaN weight would otherwise surface as
NaN metrics with exit 0). Saving is atomic per file (results.atomic_write_bytes). Our safetensors files carry the
sha256 of their tensor data in the header's metadata (`minite.sha256`, hashed from the bytes in memory while
writing); loading one reads the file once, checks the hash and then parses those bytes, so a changed byte is an
error naming the file. Files without the key (other tools' checkpoints) load as they are, memory-mapped.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import torch
from safetensors.torch import load, load_file, save

from minite_core.model.config import ModelConfig
from minite_core.model.qwen3_moe import CausalLM
from minite_core.results import atomic_write_bytes

CONFIG_NAME, WEIGHTS_NAME, INDEX_NAME = "config.json", "model.safetensors", "model.safetensors.index.json"
_PER_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_AMAX = ".input_amax"
SHA256_KEY = "minite.sha256"  # safetensors metadata: sha256 of the file's tensor data (module docstring)


def write_safetensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> Path:
    """safetensors `save`, its header's metadata extended by SHA256_KEY (the tensor data's hash), atomically."""
    blob = save(tensors, metadata=metadata)
    n = int.from_bytes(blob[:8], "little")
    header, data = json.loads(blob[8:8 + n]), memoryview(blob)[8 + n:]
    header.setdefault("__metadata__", {})[SHA256_KEY] = hashlib.sha256(data).hexdigest()
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data stays 8-byte aligned, as safetensors writes it
    return atomic_write_bytes(path, len(text).to_bytes(8, "little"), text, data)


def _load_file(path: Path, device) -> dict[str, torch.Tensor]:
    try:
        with open(path, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            digest = (json.loads(fh.read(n)).get("__metadata__") or {}).get(SHA256_KEY)
        if digest is None:  # not ours: as it is, memory-mapped
            return load_file(path, device=str(device))
        raw = path.read_bytes()
        intact = hashlib.sha256(memoryview(raw)[8 + n:]).hexdigest() == digest
        tensors = load(raw) if intact else None
    except Exception as e:  # noqa: BLE001 - safetensors raises several types for one meaning: a damaged file
        raise ValueError(f"{path} is not a readable safetensors file ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:160]}); rewrite or re-download it") from None
    if tensors is None:
        raise ValueError(f"{path} is damaged: the sha256 of its tensor data does not match its header (a changed "
                         "or truncated byte); rerun the stage that wrote it")
    return {k: v.to(device) for k, v in tensors.items()}


def read_safetensors(path: str | Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory: model.safetensors, or the shards of model.safetensors.index.json."""
    path = Path(path)
    if (path / INDEX_NAME).exists():
        shards = sorted(set(read_config(path, INDEX_NAME)["weight_map"].values()))
        tensors: dict[str, torch.Tensor] = {}
        for shard in shards:
            tensors.update(_load_file(path / shard, device))
        return tensors
    if (path / WEIGHTS_NAME).exists():
        return _load_file(path / WEIGHTS_NAME, device)
    raise FileNotFoundError(f"no {WEIGHTS_NAME} or {INDEX_NAME} in {path}: is it a checkpoint directory?")


def read_config(path: str | Path, name: str = CONFIG_NAME) -> dict:
    """A checkpoint directory's JSON file (config.json), with errors that name it."""
    file = Path(path) / name
    if not file.is_file():
        raise FileNotFoundError(f"{file} does not exist: {path} is not a checkpoint directory "
                                "(save_pretrained writes config.json + model.safetensors)")
    try:
        return json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{file} is not valid JSON ({e})") from None


_CHECKED = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # (float8 scales: no inf; NaN caught on use)


def check_finite(tensors: dict[str, torch.Tensor], source) -> None:
    """Every floating tensor finite; else ValueError naming the tensors (one check per tensor: load time only)."""
    bad = [name for name, t in tensors.items() if t.dtype in _CHECKED and not bool(torch.isfinite(t).all())]
    if bad:
        raise ValueError(f"{source}: non-finite values (inf/NaN) in {len(bad)} tensor(s), e.g. {bad[:3]}")


def from_hf_state_dict(hf: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """transformers names (per-expert or fused) -> our state_dict names."""
    ours: dict[str, torch.Tensor] = {}
    per_expert: dict[str, dict[str, dict[int, torch.Tensor]]] = {}  # prefix -> proj -> expert -> weight
    for name, t in hf.items():
        if config.tie_word_embeddings and name == "lm_head.weight":
            continue  # tied: the embedding is the LM head
        m = _PER_EXPERT.match(name)
        if m:
            per_expert.setdefault(m.group(1), {}).setdefault(m.group(3), {})[int(m.group(2))] = t
        elif name.endswith(".mlp.experts.gate_up_proj"):
            ours[name[: -len("_proj")] + ".weight"] = t  # [E, 2I, D], gate first: same layout as ours
        elif name.endswith(".mlp.experts.down_proj"):
            ours[name[: -len("_proj")] + ".weight"] = t  # [E, D, I]
        else:
            ours[name] = t
    for prefix, projs in per_expert.items():
        stacked = {}
        for proj in ("gate_proj", "up_proj", "down_proj"):
            experts = projs.get(proj, {})
            if sorted(experts) != list(range(config.num_experts)):
                raise ValueError(f"{prefix}: {proj} has experts {sorted(experts)}, "
                                 f"expected 0..{config.num_experts - 1}")
            stacked[proj] = torch.stack([experts[e] for e in range(config.num_experts)])  # [E, out, in]
        ours[prefix + ".gate_up.weight"] = torch.cat([stacked["gate_proj"], stacked["up_proj"]], dim=1)  # [E, 2I, D]
        ours[prefix + ".down.weight"] = stacked["down_proj"]  # [E, D, I]
    return ours


def to_hf_state_dict(model: CausalLM, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Our parameters (+ calibrated input_amax buffers) -> transformers' on-disk names (per-expert)."""
    I = model.config.moe_intermediate_size
    out: dict[str, torch.Tensor] = {}

    def put(name: str, t: torch.Tensor) -> None:
        t = t.detach()
        out[name] = (t.to(dtype) if dtype is not None and t.is_floating_point() else t).contiguous().cpu()

    for name, p in model.named_parameters():  # tied lm_head.weight is deduplicated away here
        if name.endswith(".mlp.experts.gate_up.weight"):
            prefix = name[: -len(".gate_up.weight")]
            for e in range(p.shape[0]):
                put(f"{prefix}.{e}.gate_proj.weight", p[e, :I])
                put(f"{prefix}.{e}.up_proj.weight", p[e, I:])
        elif name.endswith(".mlp.experts.down.weight"):
            prefix = name[: -len(".down.weight")]
            for e in range(p.shape[0]):
                put(f"{prefix}.{e}.down_proj.weight", p[e])
        else:
            put(name, p)
    for name, buf in model.named_buffers():
        if name.endswith(_AMAX) and buf is not None:
            out[name] = buf.detach().float().contiguous().cpu()  # scales stay fp32 whatever the weight dtype
    return out


def load_pretrained(path: str | Path, dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu") -> CausalLM:
    """A CausalLM from a transformers checkpoint directory; parameters in `dtype` (fp32 masters by default).
    The compute precision is the profile's (`use_profile`), independent of `dtype`."""
    path = Path(path)
    config = ModelConfig.from_hf(read_config(path))
    raw = read_safetensors(path, device)
    check_finite(raw, path)
    state = from_hf_state_dict(raw, config)
    amax = {k: state.pop(k) for k in [k for k in state if k.endswith(_AMAX)]}
    with torch.device("meta"):  # no allocation: every parameter is assigned from the checkpoint below
        model = CausalLM(config)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    bad_shape = [f"{k}: {tuple(state[k].shape)} != {tuple(s)}" for k, s in expected.items()
                 if k in state and state[k].shape != s]
    if missing or unexpected or bad_shape:
        raise ValueError(f"checkpoint {path} does not match its config: missing={missing[:8]} "
                         f"unexpected={unexpected[:8]} shape={bad_shape[:8]}")
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    model.load_state_dict(state, strict=False, assign=True)  # strict checked above (tied lm_head aside)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight  # assign=True replaced the tied Parameter
    for name, t in amax.items():
        module = model.get_submodule(name[: -len(_AMAX)])
        module.input_amax = t.to(device)
    return model.to(device)


def save_pretrained(model: CausalLM, path: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write config.json + model.safetensors that transformers loads as Qwen3(Moe)ForCausalLM.
    `dtype` casts floating weights on the way out (e.g. bf16 for a sampler); default: as held."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = to_hf_state_dict(model, dtype)
    stored = dtype if dtype is not None else model.model.embed_tokens.weight.dtype
    config = json.dumps(model.config.to_hf(dtype=str(stored).removeprefix("torch.")), indent=2) + "\n"
    write_safetensors(path / WEIGHTS_NAME, tensors, {"format": "pt"})
    atomic_write_bytes(path / CONFIG_NAME, config.encode())
    return path
