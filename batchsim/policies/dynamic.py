"""Dynamic batching, as Triton's dynamic batcher does it.

When the replica is idle: launch ``max_batch_size`` if that many wait; else
the largest preferred batch size that the queue can fill; else, once the
oldest request has waited ``max_queue_delay_s``, everyone waiting. Until
then the policy sleeps until that deadline, so requests arriving meanwhile
join the pending batch. Once launched, the batch runs exactly as a static one
(:mod:`batchsim.policies.padded`).
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field, ValidationInfo, field_validator

from batchsim.policies.base import PolicyConfig
from batchsim.policies.padded import PaddedBatchConfig
from batchsim.policies.recipe import PaddedRecipe
from batchsim.policies.registry import register
from batchsim.policies.rules import RecipePolicy

__all__ = ["DynamicConfig", "DynamicPolicy"]


class DynamicConfig(PaddedBatchConfig):
    """Knobs of :class:`DynamicPolicy` (Triton ``dynamic_batching`` names)."""

    preferred_batch_sizes: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=list, description="Batch sizes to launch as soon as the queue can fill one "
                                          "(Triton preferred_batch_size); each in 1..max_batch_size.")
    max_queue_delay_s: float = Field(
        0.01, ge=0, description="Longest the oldest request waits for a fuller batch "
                                "(Triton max_queue_delay_microseconds, in seconds).")

    @field_validator("preferred_batch_sizes")
    @classmethod
    def _preferred_within_max(cls, v: list[int], info: ValidationInfo) -> list[int]:
        top = info.data.get("max_batch_size")
        over = [b for b in v if top is not None and b > top]
        if over:
            raise ValueError(f"preferred_batch_sizes {over} exceed max_batch_size ({top})")
        return v


@register("dynamic")
class DynamicPolicy(RecipePolicy):
    """Padded batches launched by Triton's preferred-size / queue-delay rule."""

    Config: ClassVar[type[PolicyConfig]] = DynamicConfig
    config: DynamicConfig

    def make_recipe(self) -> PaddedRecipe:
        """Max size, else the largest preferred size that fits, else all after the delay."""
        cfg = self.config
        return PaddedRecipe(max_batch_size=cfg.max_batch_size,
                            preferred_batch_sizes=tuple(cfg.preferred_batch_sizes),
                            max_queue_delay_s=cfg.max_queue_delay_s, complete_at=cfg.complete_at)
