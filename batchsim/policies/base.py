"""What every batching policy shares: its validated config and KV arithmetic.

A policy is configured by one frozen pydantic model. :class:`PolicyConfig`
holds the fields the engine reads to size a replica's KV cache
(``block_size``, ``gpu_memory_utilization``, ``max_model_len``); each policy
subclasses it with its own knobs, bounded by ``Field`` constraints and
``Literal`` choices so that a bad scenario fails at load time with the field
name and value, never in the middle of a run.

The KV helpers here are the only place a policy turns tokens into blocks, so
every policy counts blocks the same way the engine's allocator does.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from batchsim.sim.protocols import KVView, SeqView

__all__ = ["PolicyConfig", "PolicyBase", "blocks_for", "held_blocks"]


class PolicyConfig(BaseModel):
    """Fields every policy accepts; subclasses add their own knobs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Registered policy name, entry-point name or 'package.module:ClassName'.")
    block_size: int = Field(16, ge=1, description="Tokens per paged-KV block (vLLM --block-size).")
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1,
        description="Fraction of device memory the replica may use; what is left after weights holds KV "
                    "(vLLM --gpu-memory-utilization).",
    )
    gpu_memory_utilization_of: Literal["total", "free"] = Field(
        "total", description="What gpu_memory_utilization is a fraction of: 'total' device memory (vLLM, "
                             "SGLang) or the memory 'free' after weights, runtime reserve and activations "
                             "(TensorRT-LLM free_gpu_memory_fraction).")
    max_model_len: int | None = Field(
        None, ge=1,
        description="Longest prompt + output a request may have; None takes the model's context length "
                    "(vLLM --max-model-len).",
    )


class PolicyBase:
    """Common constructor: holds the validated config; subclasses set ``Config``."""

    name: ClassVar[str]
    Config: ClassVar[type[PolicyConfig]] = PolicyConfig

    def __init__(self, config: PolicyConfig | None = None) -> None:
        if config is None:
            config = self.Config(name=self.name)
        if not isinstance(config, self.Config):
            raise TypeError(f"{type(self).__name__} needs a {self.Config.__name__}, got {type(config).__name__}")
        self.config = config

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config!r})"


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that hold ``tokens`` tokens of KV (ceil division)."""
    return -(-tokens // block_size)


def held_blocks(kv: KVView, seq: SeqView, reserve: int = 0) -> int:
    """Blocks ``seq`` holds now, i.e. what preempting or releasing it frees.

    Asks the KV handle (exact, prefix-cache aware). NOTE: ``reserve`` is kept
    for fakes without ``blocks_held``: they fall back to the engine's rule of
    ``max(reserve, num_computed)`` tokens' worth of blocks.
    """
    held = getattr(kv, "blocks_held", None)
    if held is not None:
        return held(seq)
    return blocks_for(max(reserve, seq.num_computed), kv.block_size)
