"""ModelConfig: the architecture of a Qwen3-MoE (or dense Qwen3) causal LM, and its transformers config.json.

One frozen dataclass covers both families: `num_experts == 0` is dense Qwen3 (`Qwen3ForCausalLM`), anything
else is Qwen3-MoE (`Qwen3MoeForCausalLM`), whose decoder layers are MoE or dense per HF's rule (`is_moe_layer`).

`from_hf` / `to_hf` translate to and from transformers' config.json. transformers 5 names the RoPE settings
`rope_parameters = {"rope_type": "default", "rope_theta": ...}`; older files (Qwen3-30B-A3B on the hub) carry a
top-level `rope_theta` and `rope_scaling: null`. We read both and write the transformers-5 form. transformers 5
stores the expert count as `num_local_experts` (with `num_experts` as an alias); we read both and write
`num_experts`, which every version (and vLLM) reads. Features this model does not implement (attention bias,
sliding window, non-SiLU activations, scaled RoPE) are rejected with a ValueError naming the key, rather than
silently computing a different function than transformers would.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

MOE_ARCH, DENSE_ARCH = "Qwen3MoeForCausalLM", "Qwen3ForCausalLM"
# the fields that make a model's shape (what a named preset sets in an SFT config: rl/pretrain.py, experiment.py)
SHAPE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "num_experts", "num_experts_per_tok", "moe_intermediate_size")
MOE_TYPE, DENSE_TYPE = "qwen3_moe", "qwen3"


@dataclass(frozen=True)
class ModelConfig:
    """Defaults are Qwen3-30B-A3B's published config.json (the paper's model); tests and smoke runs use PRESETS."""

    vocab_size: int = 151936
    hidden_size: int = 2048
    intermediate_size: int = 6144  # dense-MLP width (mlp_only_layers, non-sparse steps, dense Qwen3)
    moe_intermediate_size: int = 768  # per-expert SwiGLU width
    num_hidden_layers: int = 48
    num_attention_heads: int = 32
    num_key_value_heads: int = 4  # GQA groups
    head_dim: int = 128  # not hidden_size // heads in Qwen3 (2048 / 32 = 64)
    num_experts: int = 128  # 0 = dense Qwen3
    num_experts_per_tok: int = 8
    norm_topk_prob: bool = True  # renormalise the top-k softmax probabilities (Qwen3-MoE: true)
    decoder_sparse_step: int = 1  # layer i is MoE when (i + 1) % step == 0 (and i not in mlp_only_layers)
    mlp_only_layers: tuple[int, ...] = ()  # layers forced to the dense MLP
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    tie_word_embeddings: bool = False
    bos_token_id: int | None = 151643
    eos_token_id: int | tuple[int, ...] | None = 151645
    pad_token_id: int | None = None

    def __post_init__(self):
        # normalise list-valued fields to tuples (frozen + hashable), then validate
        object.__setattr__(self, "mlp_only_layers", tuple(int(i) for i in self.mlp_only_layers))
        if isinstance(self.eos_token_id, (list, tuple)):
            object.__setattr__(self, "eos_token_id", tuple(int(i) for i in self.eos_token_id))
        if self.num_experts == 0:  # dense Qwen3: MoE-only fields are meaningless; canonical values keep == exact
            for key, value in (("moe_intermediate_size", 0), ("num_experts_per_tok", 0), ("norm_topk_prob", False),
                               ("decoder_sparse_step", 1), ("mlp_only_layers", ())):
                object.__setattr__(self, key, value)
        for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "head_dim", "decoder_sparse_step", "max_position_embeddings"):
            _require(key, getattr(self, key), _is_int(getattr(self, key)) and getattr(self, key) > 0, "a positive int")
        _require("num_experts", self.num_experts, _is_int(self.num_experts) and self.num_experts >= 0, "an int >= 0")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"ModelConfig.num_key_value_heads={self.num_key_value_heads} must divide "
                             f"num_attention_heads={self.num_attention_heads}")
        _require("head_dim", self.head_dim, self.head_dim % 2 == 0, "even (RoPE rotates pairs)")
        _require("rms_norm_eps", self.rms_norm_eps, self.rms_norm_eps > 0, "> 0")
        _require("rope_theta", self.rope_theta, self.rope_theta > 0, "> 0")
        for i in self.mlp_only_layers:
            _require("mlp_only_layers", self.mlp_only_layers, 0 <= i < self.num_hidden_layers,
                     f"layer indices in [0, {self.num_hidden_layers})")
        if any(not self.is_moe_layer(i) for i in range(self.num_hidden_layers)):
            _require("intermediate_size", self.intermediate_size,
                     _is_int(self.intermediate_size) and self.intermediate_size > 0, "a positive int (dense layers)")
        if self.num_experts > 0:
            _require("moe_intermediate_size", self.moe_intermediate_size,
                     _is_int(self.moe_intermediate_size) and self.moe_intermediate_size > 0, "a positive int")
            _require("num_experts_per_tok", self.num_experts_per_tok,
                     _is_int(self.num_experts_per_tok) and 0 < self.num_experts_per_tok <= self.num_experts,
                     f"in [1, num_experts={self.num_experts}]")

    # ---- structure -------------------------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, layer_idx: int) -> bool:
        """HF's rule (Qwen3MoeDecoderLayer): sparse unless listed in mlp_only_layers or off the sparse step."""
        return (layer_idx not in self.mlp_only_layers and self.num_experts > 0
                and (layer_idx + 1) % self.decoder_sparse_step == 0)

    def check_tokens(self, rows, *, new_tokens: int = 0, what: str = "sequence") -> None:
        """Token rows (lists of ids) against what this model was built for: every id in [0, vocab_size), every
        row's length + new_tokens <= max_position_embeddings (RoPE would run past them without a word).
        ValueError naming the row, the limit and what to do. Host lists only: no device sync."""
        for i, row in enumerate(rows):
            if row and (min(row) < 0 or max(row) >= self.vocab_size):
                bad = next(t for t in row if not 0 <= t < self.vocab_size)
                raise ValueError(f"{what} {i} holds token id {bad}, outside the model's vocabulary of "
                                 f"{self.vocab_size}: the tokenizer does not belong to this checkpoint")
            if len(row) + new_tokens > self.max_position_embeddings:
                extra = f" + {new_tokens} new tokens" if new_tokens else ""
                raise ValueError(f"{what} {i} has {len(row)} tokens{extra} = {len(row) + new_tokens} positions > "
                                 f"the model's max_position_embeddings {self.max_position_embeddings}; lower "
                                 "max_new_tokens or shorten the inputs")

    def replace(self, **fields) -> "ModelConfig":
        return dataclasses.replace(self, **fields)

    # ---- transformers config.json ----------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "ModelConfig":
        """Read a transformers config.json dict (Qwen3MoeForCausalLM or Qwen3ForCausalLM)."""
        model_type = hf.get("model_type")
        if model_type not in (MOE_TYPE, DENSE_TYPE):
            raise ValueError(f"model_type={model_type!r} is not one of {[MOE_TYPE, DENSE_TYPE]}")
        _require("hidden_act", hf.get("hidden_act", "silu"), hf.get("hidden_act", "silu") == "silu", "'silu'")
        _require("attention_bias", hf.get("attention_bias"), not hf.get("attention_bias", False), "false")
        _require("use_sliding_window", hf.get("use_sliding_window"), not hf.get("use_sliding_window", False),
                 "false")
        rope_theta = _rope_theta(hf)
        for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads"):
            if key not in hf:
                raise ValueError(f"config.json is missing required key {key!r}")
        moe = model_type == MOE_TYPE
        num_experts = hf.get("num_experts", hf.get("num_local_experts")) if moe else 0
        if num_experts is None:
            raise ValueError("config.json is missing required key 'num_experts' (or 'num_local_experts')")
        # HF fallbacks: Qwen3MoeAttention uses hidden // heads without head_dim; Qwen3Config defaults to 128.
        default_head_dim = hf["hidden_size"] // hf["num_attention_heads"] if moe else 128
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf.get("intermediate_size", 0),
            moe_intermediate_size=hf.get("moe_intermediate_size", 0) if moe else 0,
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=hf["num_attention_heads"],
            num_key_value_heads=hf["num_key_value_heads"],
            head_dim=hf.get("head_dim") or default_head_dim,
            num_experts=num_experts,
            num_experts_per_tok=hf.get("num_experts_per_tok", 0) if moe else 0,
            norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
            decoder_sparse_step=hf.get("decoder_sparse_step", 1) if moe else 1,
            mlp_only_layers=tuple(hf.get("mlp_only_layers") or ()) if moe else (),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            max_position_embeddings=hf.get("max_position_embeddings", 32768),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=hf.get("eos_token_id"),
            pad_token_id=hf.get("pad_token_id"),
        )

    def to_hf(self, dtype: str | None = None) -> dict[str, Any]:
        """config.json that transformers (5.x) loads as Qwen3MoeForCausalLM / Qwen3ForCausalLM."""
        hf: dict[str, Any] = {
            "architectures": [MOE_ARCH if self.is_moe else DENSE_ARCH],
            "model_type": MOE_TYPE if self.is_moe else DENSE_TYPE,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "use_sliding_window": False,
            "sliding_window": None,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "initializer_range": 0.02,
            "use_cache": True,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id,
            "pad_token_id": self.pad_token_id,
        }
        if self.is_moe:
            hf.update({
                "moe_intermediate_size": self.moe_intermediate_size,
                "num_experts": self.num_experts,
                "num_experts_per_tok": self.num_experts_per_tok,
                "norm_topk_prob": self.norm_topk_prob,
                "decoder_sparse_step": self.decoder_sparse_step,
                "mlp_only_layers": list(self.mlp_only_layers),
                "output_router_logits": False,
                "router_aux_loss_coef": 0.001,
            })
        else:
            hf.update({"max_window_layers": self.num_hidden_layers,
                       "layer_types": ["full_attention"] * self.num_hidden_layers})
        if dtype is not None:
            hf["dtype"] = dtype
        return hf


def _rope_theta(hf: dict[str, Any]) -> float:
    """transformers 5 `rope_parameters` or legacy top-level `rope_theta` (+ `rope_scaling`, which must be null)."""
    params = hf.get("rope_parameters")
    if params is not None:
        rope_type = params.get("rope_type", params.get("type", "default"))
        _require("rope_parameters.rope_type", rope_type, rope_type == "default", "'default' (scaled RoPE unsupported)")
        return float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    scaling = hf.get("rope_scaling")
    _require("rope_scaling", scaling, scaling is None, "null (scaled RoPE unsupported)")
    return float(hf.get("rope_theta", 10000.0))  # transformers' default when neither key is present


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require(key: str, value, ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"ModelConfig.{key}={value!r} is invalid: must be {what}")


# Named presets. "tiny-*" keep CPU tests under a second per forward.
PRESETS: dict[str, ModelConfig] = {
    "qwen3-30b-a3b": ModelConfig(),
    "tiny-moe": ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            num_experts=4, num_experts_per_tok=2, mlp_only_layers=(1,), rope_theta=10000.0,
                            max_position_embeddings=256, bos_token_id=None, eos_token_id=None),
    "tiny-dense": ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=0,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              num_experts=0, num_experts_per_tok=0, rope_theta=10000.0, max_position_embeddings=256,
                              tie_word_embeddings=True, bos_token_id=None, eos_token_id=None),
}


def _qwen3_moe(hidden: int, layers: int, heads: int, kv_heads: int, experts: int, top_k: int) -> ModelConfig:
    """A Qwen3-MoE of the task's kind: every layer sparse, head_dim 64 (32 at the smallest width), experts
    hidden/2 wide, RoPE base 1e4 (sequences < 512 tokens). The vocabulary is the task tokenizer's (rl/pretrain.py
    sets it); the one here is a placeholder."""
    return ModelConfig(vocab_size=64, hidden_size=hidden, intermediate_size=2 * hidden,
                       moe_intermediate_size=hidden // 2, num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=kv_heads, head_dim=hidden // heads, num_experts=experts,
                       num_experts_per_tok=top_k, rope_theta=10000.0, max_position_embeddings=512)


# The size ladder of the NVFP4-cost-against-size sweep (rl/scale.py): from the 13 M model every RL result used to
# rest on to the 0.83 B model of experiments/h200x8.yaml, width and depth grown together, experts 32 -> 64 and
# top-k 4 -> 8 on the way (Qwen3-30B-A3B: 128 experts, top-8). Names: parameters at the character vocabulary (64);
# the BPE vocabulary (~1,312) adds 2 x 1,248 x hidden (0.6 M at 256 wide, 2.6 M at 1024).
PRESETS.update({
    "qwen3-moe-13m": _qwen3_moe(256, 4, 8, 2, 32, 4),     # 13,306,368: experiments/h200.yaml's RL model until now
    "qwen3-moe-53m": _qwen3_moe(512, 4, 8, 2, 32, 4),     # 53,089,280
    "qwen3-moe-233m": _qwen3_moe(768, 4, 12, 4, 64, 8),   # 233,086,208
    "qwen3-moe-517m": _qwen3_moe(1024, 5, 16, 4, 64, 8),  # 516,894,336
    "qwen3-moe-827m": _qwen3_moe(1024, 8, 16, 4, 64, 8),  # 826,951,680: experiments/h200x8.yaml's RL model
})
