"""Model architectures as HuggingFace ``config.json`` fields, plus weight arithmetic.

A :class:`ModelSpec` carries exactly the fields the cost model needs, under the
names users already know from ``config.json`` (``hidden_size``,
``num_key_value_heads``, ``num_local_experts``, ...). The built-in catalog
(``batchsim/calibrate/catalog/*.yaml``) holds copies of the public configs of common
models; any ``config.json`` (or a YAML file with the same keys) works too.
Unknown keys in a config are ignored, so a real HF config loads as is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from batchsim.calibrate._io import catalog_names, read_mapping, resolve, validate
from batchsim.sim.errors import InputError

__all__ = ["ModelSpec", "load_model", "model_names", "weight_params", "param_count",
           "DTYPE_BYTES", "WEIGHT_DTYPES", "KV_DTYPES", "check_dtype"]

CATALOG_DIR = Path(__file__).parent / "catalog"

# Bytes per element. int4 adds one fp16 scale and one fp16 zero point per group
# of 128 weights (AWQ/GPTQ default): 0.5 + 4/128.
DTYPE_BYTES: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int4": 0.5 + 4.0 / 128}
WEIGHT_DTYPES = ("bf16", "fp16", "fp8", "int4")
KV_DTYPES = ("bf16", "fp16", "fp8")

# Architectures whose MLP is up -> act -> down (no gate projection).
_UNGATED = frozenset({"gpt2", "gpt_bigcode", "gpt_neox", "gptj", "opt", "bloom", "falcon",
                      "phi", "starcoder2"})
# HF spellings of the number of routed experts, by model family.
_EXPERT_ALIASES = ("num_local_experts", "num_experts", "n_routed_experts")


class ModelSpec(BaseModel):
    """A decoder-only transformer, in HuggingFace ``config.json`` terms.

    Derived when absent: ``num_key_value_heads`` (= heads, plain MHA),
    ``head_dim`` (= hidden_size / heads), ``mlp_gated`` (from ``model_type``).
    MoE models set ``num_local_experts`` (or ``num_experts``) and
    ``num_experts_per_tok``; ``moe_intermediate_size`` is the expert width when
    it differs from ``intermediate_size``.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str = Field(description="catalog name or the config's directory name")
    model_type: str = Field("llama", description="HF model_type")
    hidden_size: int = Field(ge=1)
    num_hidden_layers: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_key_value_heads: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    max_position_embeddings: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    hidden_act: str = "silu"
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_gated: bool = True
    num_local_experts: int = Field(0, ge=0)
    num_experts_per_tok: int = Field(0, ge=0)
    moe_intermediate_size: int | None = Field(None, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _derive(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        d = dict(data)
        if d.get("num_key_value_heads") is None and "num_attention_heads" in d:
            d["num_key_value_heads"] = d["num_attention_heads"]
        heads, hidden = d.get("num_attention_heads"), d.get("hidden_size")
        if d.get("head_dim") is None and isinstance(heads, int) and isinstance(hidden, int) and heads > 0:
            d["head_dim"] = hidden // heads
        if d.get("attention_bias") is None and str(d.get("model_type")) in ("qwen2", "qwen2_moe"):
            d["attention_bias"] = True  # implicit in the Qwen2 architecture, absent from its config
        if d.get("mlp_gated") is None:
            d["mlp_gated"] = str(d.get("model_type", "llama")) not in _UNGATED
        for alias in _EXPERT_ALIASES:
            if d.get(alias) is not None:
                d["num_local_experts"] = d[alias]
                break
        for key in ("num_local_experts", "num_experts_per_tok"):
            if d.get(key) is None:
                d[key] = 0
        return d

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")
        if self.num_local_experts and not 1 <= self.num_experts_per_tok <= self.num_local_experts:
            raise ValueError(f"num_experts_per_tok ({self.num_experts_per_tok}) must be in "
                             f"1..num_local_experts ({self.num_local_experts})")
        return self

    @property
    def is_moe(self) -> bool:
        """True when the MLP is a mixture of experts."""
        return self.num_local_experts > 0

    @property
    def expert_intermediate_size(self) -> int:
        """Width of one expert's MLP (``moe_intermediate_size`` or ``intermediate_size``)."""
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def gqa_group(self) -> int:
        """Query heads per KV head (1 = MHA)."""
        return self.num_attention_heads // self.num_key_value_heads


def model_names() -> list[str]:
    """Names of the built-in catalog models."""
    return catalog_names(CATALOG_DIR)


def load_model(name_or_path: str) -> ModelSpec:
    """A catalog model by name, or a HF ``config.json`` / YAML file by path."""
    path = resolve(str(name_or_path), CATALOG_DIR, "model")
    data = read_mapping(path)
    if "name" not in data:
        data["name"] = path.parent.name if path.name == "config.json" else path.stem
    return validate(ModelSpec, data, str(path))


def weight_params(spec: ModelSpec) -> dict[str, int]:
    """Parameter counts by component (whole model, unsharded)."""
    d, L, dh = spec.hidden_size, spec.num_hidden_layers, spec.head_dim
    h, hk = spec.num_attention_heads, spec.num_key_value_heads
    qkv_out = (h + 2 * hk) * dh
    attn = d * qkv_out + h * dh * d + (qkv_out if spec.attention_bias else 0)
    mats = 3 if spec.mlp_gated else 2
    if spec.is_moe:
        mlp = spec.num_local_experts * mats * d * spec.expert_intermediate_size + d * spec.num_local_experts
    else:
        mlp = mats * d * spec.intermediate_size
    emb = spec.vocab_size * d
    return {"attention": L * attn, "mlp": L * mlp, "norms": L * 2 * d + d,
            "embedding": emb, "lm_head": 0 if spec.tie_word_embeddings else emb}


def param_count(spec: ModelSpec) -> int:
    """Total parameters (tied embeddings counted once)."""
    return sum(weight_params(spec).values())


def check_dtype(value: str, allowed: tuple[str, ...], what: str) -> str:
    """Validate a dtype name; InputError listing the choices."""
    if value not in allowed:
        raise InputError(f"unknown {what} {value!r}; choose one of {', '.join(allowed)}")
    return value
