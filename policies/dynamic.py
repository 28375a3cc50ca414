"""Dynamic batching, as Triton's dynamic batcher does it.

When the replica is idle: launch ``max_batch_size`` if that many wait; else
the largest preferred batch size that the queue can fill; else, once the
oldest request has waited ``max_queue_delay_s``, everyone waiting. Until
then the policy sleeps until that deadline, so requests arriving meanwhile
join the pending batch. Once launched, the batch runs exactly as a static one
(:mod:`policies.padded`).
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field, ValidationInfo, field_validator

from policies.base import PolicyConfig
from policies.padded import PaddedBatchConfig, PaddedBatchPolicy
from policies.registry import register
from sim.protocols import ReplicaView

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
class DynamicPolicy(PaddedBatchPolicy):
    """Padded batches launched by Triton's preferred-size / queue-delay rule."""

    Config: ClassVar[type[PolicyConfig]] = DynamicConfig
    config: DynamicConfig

    def launch_size(self, view: ReplicaView) -> tuple[int, float | None]:
        """Max size, else largest preferred size that fits, else all after the delay; else wake then."""
        n, cfg = len(view.waiting), self.config
        if n == 0:
            return 0, None
        if n >= cfg.max_batch_size:
            return cfg.max_batch_size, None
        fits = [b for b in cfg.preferred_batch_sizes if b <= n]
        if fits:
            return max(fits), None
        deadline = view.waiting[0].arrival + cfg.max_queue_delay_s
        return (n, None) if view.now >= deadline else (0, deadline)
