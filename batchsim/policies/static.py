"""Static batching: wait for B requests (or a timeout), run them as one padded batch.

The oldest scheme: a batch launches when the replica is idle and either
``max_batch_size`` requests wait or the oldest has waited ``timeout_s``
(``0``: launch at once with whoever waits, up to B). The batch then runs to
its longest member's end (see :mod:`batchsim.policies.padded`), exposing padding, dead
slots and short requests waiting on long ones.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from batchsim.policies.base import PolicyConfig
from batchsim.policies.padded import PaddedBatchConfig
from batchsim.policies.recipe import PaddedRecipe
from batchsim.policies.registry import register
from batchsim.policies.rules import RecipePolicy

__all__ = ["StaticConfig", "StaticPolicy"]


class StaticConfig(PaddedBatchConfig):
    """Knobs of :class:`StaticPolicy`."""

    timeout_s: float = Field(
        0.0, ge=0, description="Longest the oldest request waits for a full batch; 0 launches at once.")


@register("static")
class StaticPolicy(RecipePolicy):
    """Fixed-size padded batches, launched when full or on timeout."""

    Config: ClassVar[type[PolicyConfig]] = StaticConfig
    config: StaticConfig

    def make_recipe(self) -> PaddedRecipe:
        """B if B wait; all waiting once the oldest waited ``timeout_s``; no preferred sizes."""
        cfg = self.config
        return PaddedRecipe(max_batch_size=cfg.max_batch_size, max_queue_delay_s=cfg.timeout_s,
                            complete_at=cfg.complete_at)
