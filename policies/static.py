"""Static batching: wait for B requests (or a timeout), run them as one padded batch.

The oldest scheme: a batch launches when the replica is idle and either
``max_batch_size`` requests wait or the oldest has waited ``timeout_s``
(``0``: launch at once with whoever waits, up to B). The batch then runs to
its longest member's end (see :mod:`policies.padded`), exposing padding, dead
slots and short requests waiting on long ones.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from policies.base import PolicyConfig
from policies.padded import PaddedBatchConfig, PaddedBatchPolicy
from policies.registry import register
from sim.protocols import ReplicaView

__all__ = ["StaticConfig", "StaticPolicy"]


class StaticConfig(PaddedBatchConfig):
    """Knobs of :class:`StaticPolicy`."""

    timeout_s: float = Field(
        0.0, ge=0, description="Longest the oldest request waits for a full batch; 0 launches at once.")


@register("static")
class StaticPolicy(PaddedBatchPolicy):
    """Fixed-size padded batches, launched when full or on timeout."""

    Config: ClassVar[type[PolicyConfig]] = StaticConfig
    config: StaticConfig

    def launch_size(self, view: ReplicaView) -> tuple[int, float | None]:
        """B if B wait (or no timeout); all waiting once the oldest timed out; else wake then."""
        n, cfg = len(view.waiting), self.config
        if n == 0:
            return 0, None
        if n >= cfg.max_batch_size or cfg.timeout_s == 0:
            return min(n, cfg.max_batch_size), None
        deadline = view.waiting[0].arrival + cfg.timeout_s
        return (n, None) if view.now >= deadline else (0, deadline)
