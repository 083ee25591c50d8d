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

Loading streams: the model is built on the meta device, allocated once on the target device in the target dtype,
and filled tensor by tensor, shard by shard, from `safe_open` on that device — host memory holds one shard's
mapping and one tensor at a time, never the whole checkpoint (a 61 GB bf16 Qwen3-30B-A3B loads on a host with
far less free memory; tests/test_hf_checkpoint.py measures the peak). A sharded checkpoint is read through its
model.safetensors.index.json (the hub's layout); every shard it names must exist before anything is read.

Loading checks what it loads, one line naming the input: config.json missing, unreadable or of another
architecture (model_type other than qwen3_moe / qwen3); a shard missing or damaged; a tensor whose shape does
not match config.json, a tensor the model has no place for, a weight the checkpoint lacks; and every floating
tensor must be finite (one check per tensor on load: a NaN weight would otherwise surface as NaN metrics with
exit 0). Saving is atomic per file (results.atomic_write_bytes) and shards a model above `MAX_SHARD_BYTES` the
same way (model-0000i-of-0000n.safetensors + index), one shard in host memory at a time.

Safetensors files this module writes carry the sha256 of their tensor data in the header's metadata
(`minite.sha256`, hashed from the bytes in memory while writing); loading one checks the hash first (`verify_sha256`,
streamed in chunks), so a changed byte is an error naming the file. Files without the key (other
tools' checkpoints) load as they are, memory-mapped.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save

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
MAX_SHARD_BYTES = 5 * 1024**3  # the hub's usual shard size (Qwen3-30B-A3B: 16 shards of <= 4 GB)


def _unreadable(path: Path, e: Exception) -> ValueError:
    return ValueError(f"{path} is not a readable safetensors file ({type(e).__name__}: "
                      f"{' '.join(str(e).split())[:160]}); rewrite or re-download it")


def _load_file(path: Path, device) -> dict[str, torch.Tensor]:
    verify_sha256(path)  # ours: the hash first; other tools' files: as they are
    try:
        return load_file(path, device=str(device))
    except Exception as e:  # noqa: BLE001 - safetensors raises several types for one meaning: a damaged file
        raise _unreadable(path, e) from None


def read_safetensors(path: str | Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory at once (small checkpoints: NVFP4 exports); `load_pretrained` streams."""
    tensors: dict[str, torch.Tensor] = {}
    for shard in shard_files(path):
        tensors.update(_load_file(shard, device))
    return tensors


def shard_files(path: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint directory: model.safetensors, or every shard its
    model.safetensors.index.json names — each checked to exist before any is read."""
    path = Path(path)
    if (path / INDEX_NAME).exists():
        weight_map = read_config(path, INDEX_NAME).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{path / INDEX_NAME} has no weight_map: re-download the checkpoint's index")
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise FileNotFoundError(f"{path / missing[0]} is missing ({len(missing)} of the {len(shards)} shards "
                                    f"{INDEX_NAME} names are absent): download the missing shard(s)")
        return [path / s for s in shards]
    if (path / WEIGHTS_NAME).exists():
        return [path / WEIGHTS_NAME]
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


def _hf_views(model: CausalLM) -> list[tuple[str, torch.Tensor]]:
    """(transformers' on-disk name, our tensor or a view of it) for every parameter (per-expert names) and every
    calibrated input_amax buffer, in named_parameters order: nothing is copied yet."""
    I = model.config.moe_intermediate_size
    out: list[tuple[str, torch.Tensor]] = []
    for name, p in model.named_parameters():  # tied lm_head.weight is deduplicated away here
        if name.endswith(".mlp.experts.gate_up.weight"):
            prefix = name[: -len(".gate_up.weight")]
            for e in range(p.shape[0]):
                out += [(f"{prefix}.{e}.gate_proj.weight", p[e, :I]), (f"{prefix}.{e}.up_proj.weight", p[e, I:])]
        elif name.endswith(".mlp.experts.down.weight"):
            prefix = name[: -len(".down.weight")]
            out += [(f"{prefix}.{e}.down_proj.weight", p[e]) for e in range(p.shape[0])]
        else:
            out.append((name, p))
    out += [(name, buf) for name, buf in model.named_buffers() if name.endswith(_AMAX) and buf is not None]
    return out


def _host_copy(name: str, t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    t = t.detach()
    if name.endswith(_AMAX):
        return t.float().contiguous().cpu()  # scales stay fp32 whatever the weight dtype
    return (t.to(dtype) if dtype is not None and t.is_floating_point() else t).contiguous().cpu()


def to_hf_state_dict(model: CausalLM, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Our parameters (+ calibrated input_amax buffers) -> transformers' on-disk names (per-expert), on the host."""
    return {name: _host_copy(name, t, dtype) for name, t in _hf_views(model)}


def _stored_bytes(name: str, t: torch.Tensor, dtype: torch.dtype | None) -> int:
    itemsize = 4 if name.endswith(_AMAX) else (dtype.itemsize if dtype is not None and t.is_floating_point()
                                               else t.element_size())
    return t.numel() * itemsize


def read_model_config(path: str | Path) -> ModelConfig:
    """config.json as a ModelConfig; another architecture or an unsupported feature is an error naming the file."""
    hf = read_config(path)
    try:
        return ModelConfig.from_hf(hf)
    except ValueError as e:
        raise ValueError(f"{Path(path) / CONFIG_NAME}: {e} (this harness runs Qwen3-MoE and dense Qwen3 "
                         f"checkpoints; architectures={hf.get('architectures')})") from None


def _target(name: str, config: ModelConfig) -> tuple[str, object, tuple | None]:
    """A checkpoint tensor name -> (our parameter, the piece it fills, index into the parameter or None = whole).
    Per-expert tensors fill one expert's slice of the stacked GroupedLinear weights."""
    m = _PER_EXPERT.match(name)
    if m:
        prefix, e, proj = m.group(1), int(m.group(2)), m.group(3)
        I = config.moe_intermediate_size
        if proj == "down_proj":
            return f"{prefix}.down.weight", (e, proj), (e,)  # [E, D, I][e]
        rows = slice(0, I) if proj == "gate_proj" else slice(I, 2 * I)  # gate rows first
        return f"{prefix}.gate_up.weight", (e, proj), (e, rows)  # [E, 2I, D][e, rows]
    if name.endswith(".mlp.experts.gate_up_proj") or name.endswith(".mlp.experts.down_proj"):
        return name[: -len("_proj")] + ".weight", "all", None  # transformers 5's fused in-memory names
    return name, "all", None


def _pieces_missing(name: str, pieces: set, config: ModelConfig) -> list[str]:
    """The checkpoint names a parameter still lacks (empty when complete)."""
    if "all" in pieces:
        return []
    if name.endswith(".experts.gate_up.weight") or name.endswith(".experts.down.weight"):
        prefix = name.rsplit(".", 2)[0]
        projs = ("down_proj",) if name.endswith(".down.weight") else ("gate_proj", "up_proj")
        return [f"{prefix}.{e}.{p}.weight" for e in range(config.num_experts) for p in projs if (e, p) not in pieces]
    return [name]


def verify_sha256(file: Path, chunk: int = 1 << 20) -> None:
    """A file written by `write_safetensors`: its tensor data against the header's sha256, read in chunks (constant
    host memory); other files: nothing to check."""
    try:
        with open(file, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            digest = (json.loads(fh.read(n)).get("__metadata__") or {}).get(SHA256_KEY)
            if digest is None:
                return
            h = hashlib.sha256()
            while block := fh.read(chunk):
                h.update(block)
    except Exception as e:  # noqa: BLE001 - a header that is not JSON, a size past the file's end, ...
        raise _unreadable(file, e) from None
    if h.hexdigest() != digest:
        raise ValueError(f"{file} is damaged: the sha256 of its tensor data does not match its header (a changed "
                         "or truncated byte); rerun the stage that wrote it")


def _open_shard(file: Path, device):
    verify_sha256(file)
    try:
        return safe_open(str(file), framework="pt", device=str(device))
    except Exception as e:  # noqa: BLE001 - safetensors raises several types for one meaning: a damaged file
        raise _unreadable(file, e) from None


@torch.no_grad()
def load_pretrained(path: str | Path, dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu") -> CausalLM:
    """A CausalLM from a transformers checkpoint directory; parameters in `dtype` (fp32 masters by default),
    streamed shard by shard onto `device` (module docstring). The compute precision is the profile's
    (`use_profile`), independent of `dtype`."""
    path = Path(path)
    config = read_model_config(path)
    files = shard_files(path)
    with torch.device("meta"):  # no allocation: every element is assigned from the checkpoint below
        model = CausalLM(config).to(dtype)
    model.to_empty(device=device)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    params = dict(model.named_parameters())  # tied lm_head.weight is the embedding's (deduplicated)
    filled: dict[str, set] = {name: set() for name in params}
    for file in files:
        with _open_shard(file, device) as f:
            for key in f.keys():
                try:
                    t = f.get_tensor(key)
                except Exception as e:  # noqa: BLE001 - a truncated shard fails here, not at open
                    raise ValueError(f"{file} is not a readable safetensors file (tensor {key}: "
                                     f"{' '.join(str(e).split())[:120]}); rewrite or re-download it") from None
                check_finite({key: t}, file)
                if key.endswith(_AMAX):  # calibrated static scales (ours): a buffer, fp32 whatever the weights
                    model.get_submodule(key[: -len(_AMAX)]).input_amax = t.float()
                    continue
                if config.tie_word_embeddings and key == "lm_head.weight":
                    continue  # tied: the embedding is the LM head
                name, piece, index = _target(key, config)
                if name not in params:
                    raise ValueError(f"{file}: tensor {key} has no place in a {config.num_hidden_layers}-layer "
                                     f"{'Qwen3-MoE' if config.is_moe else 'dense Qwen3'} model of "
                                     f"{path / CONFIG_NAME}: the checkpoint does not match its config")
                dest = params[name] if index is None else params[name][index]
                if tuple(t.shape) != tuple(dest.shape):
                    raise ValueError(f"{file}: tensor {key} has shape {tuple(t.shape)}, {path / CONFIG_NAME} "
                                     f"implies {tuple(dest.shape)}: the checkpoint does not match its config")
                dest.copy_(t)  # casts to `dtype` on the device
                filled[name].add(piece)
                del t  # one tensor alive at a time
    missing = [m for name, pieces in filled.items() for m in _pieces_missing(name, pieces, config)]
    if missing:
        raise ValueError(f"checkpoint {path} lacks {len(missing)} tensor(s) its config.json needs, e.g. "
                         f"{missing[:3]}: a shard is incomplete or the config is of another model")
    return model


def save_pretrained(model: CausalLM, path: str | Path, dtype: torch.dtype | None = None,
                    max_shard_bytes: int = MAX_SHARD_BYTES) -> Path:
    """Write config.json + safetensors that transformers loads as Qwen3(Moe)ForCausalLM: model.safetensors, or
    above `max_shard_bytes` the hub's shards + model.safetensors.index.json, each shard copied to the host and
    written before the next is made. `dtype` casts floating weights on the way out (e.g. bf16 for a sampler);
    default: as held."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    views = _hf_views(model)
    shards: list[list[tuple[str, torch.Tensor]]] = [[]]
    size = 0
    for name, t in views:  # greedy packing in parameter order, as transformers' save_pretrained
        nbytes = _stored_bytes(name, t, dtype)
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, t))
        size += nbytes
    names = ([WEIGHTS_NAME] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    for stale in [*path.glob("model-*-of-*.safetensors"), path / WEIGHTS_NAME, path / INDEX_NAME]:
        if stale.name not in names:
            stale.unlink(missing_ok=True)  # a previous save of another layout would shadow this one
    for file, shard in zip(names, shards):
        tensors = {name: _host_copy(name, t, dtype) for name, t in shard}
        write_safetensors(path / file, tensors, {"format": "pt"})
        del tensors
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(_stored_bytes(n, t, dtype) for n, t in views)},
                 "weight_map": {name: file for file, shard in zip(names, shards) for name, _ in shard}}
        atomic_write_bytes(path / INDEX_NAME, (json.dumps(index, indent=2) + "\n").encode())
    stored = dtype if dtype is not None else model.model.embed_tokens.weight.dtype
    config = json.dumps(model.config.to_hf(dtype=str(stored).removeprefix("torch.")), indent=2) + "\n"
    atomic_write_bytes(path / CONFIG_NAME, config.encode())
    return path
