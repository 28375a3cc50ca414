"""Continuous (iteration-level) batching: Orca and vLLM v0.

Every step, finished sequences have left (the engine frees them) and queued
ones may enter; KV is allocated per step and running sequences that cannot
grow are preempted by recompute, most recently admitted first. A prompt runs
whole in one step. ``prefill_mode`` picks how prefills meet decodes:

- ``separate`` (vLLM v0 default): if any waiting sequence can be admitted the
  step is prefill-only and running decodes pause; otherwise it is a
  decode-only step. This is the "prefill stall" that chunked prefill fixes.
- ``mixed`` (Orca): decodes first, then whole prompts into the token budget
  and sequence slots left, in the same step. As in vLLM, a step that had to
  preempt admits nobody: the victims would come straight back and thrash.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from batchsim.policies.base import PolicyConfig
from batchsim.policies.recipe import IterationRecipe, Move
from batchsim.policies.registry import register
from batchsim.policies.rules import RecipePolicy
from batchsim.policies.step import IterationConfig

__all__ = ["ContinuousConfig", "ContinuousPolicy", "MOVES"]

# The order of moves in one step, by prefill_mode (batchsim/policies/recipe.py).
MOVES: dict[str, tuple[Move, ...]] = {
    "separate": (Move("admit"), Move("decodes", unless=("rows",))),
    "mixed": (Move("decodes"), Move("admit", unless=("preempted",))),
}


class ContinuousConfig(IterationConfig):
    """Knobs of :class:`ContinuousPolicy`."""

    prefill_mode: Literal["separate", "mixed"] = Field(
        "separate", description="'separate': prefill-only or decode-only steps (vLLM v0); "
                                "'mixed': decodes and whole prefills in one step (Orca).")


@register("continuous")
class ContinuousPolicy(RecipePolicy):
    """Iteration-level batching with whole-prompt prefills and preemption by recompute."""

    Config: ClassVar[type[PolicyConfig]] = ContinuousConfig
    config: ContinuousConfig

    def make_recipe(self) -> IterationRecipe:
        """Prefill-only else decodes (separate), or decodes then prefills (mixed)."""
        return self.config.recipe(MOVES[self.config.prefill_mode])
