"""Chunked prefill: Sarathi-Serve's stall-free batching, vLLM v1's default.

Each step has a token budget (``max_num_batched_tokens``). Running decodes
are served first, one token each, with the same preemption as continuous
batching; the budget left goes to the running partially prefilled sequences
in admission order, then to new admissions in queue order, each taking
``min(pending, budget left)`` tokens. A long prompt is thus split across
steps and never freezes the running decodes. Nobody new is admitted when a
running prefill stalled (it would be overtaken) or when the step preempted
(vLLM v1: the victims would thrash).

``prefill_mode: separate`` is SGLang's default instead (``enable_mixed_chunk=False``,
"run prefill first if possible"): a step holds prefill chunks only, under the same budget, and
running decodes step only when no prefill chunk is scheduled.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from batchsim.policies.base import PolicyConfig
from batchsim.policies.recipe import IterationRecipe, Move
from batchsim.policies.registry import register
from batchsim.policies.rules import RecipePolicy
from batchsim.policies.step import IterationConfig

__all__ = ["ChunkedPrefillConfig", "ChunkedPrefillPolicy", "MOVES"]

MOVES: dict[str, tuple[Move, ...]] = {
    "mixed": (
        Move("decodes"),
        Move("partial_prefills"),
        Move("admit_chunks", unless=("stalled", "preempted")),
    ),
    "separate": (
        Move("partial_prefills"),
        Move("admit_chunks", unless=("stalled",)),
        Move("decodes", unless=("rows",)),
    ),
}


class ChunkedPrefillConfig(IterationConfig):
    """Knobs of :class:`ChunkedPrefillPolicy` (vLLM v1 defaults for online serving)."""

    max_num_batched_tokens: int = Field(
        512, ge=1, description="Token budget of one step, decodes plus prefill chunks "
                               "(vLLM --max-num-batched-tokens; Sarathi's chunk size).")
    prefill_mode: Literal["mixed", "separate"] = Field(
        "mixed", description="'mixed': decodes and prefill chunks share a step (vLLM v1, Sarathi); "
                             "'separate': prefill-chunk steps first, decode steps when none is due (SGLang).")


@register("chunked_prefill")
class ChunkedPrefillPolicy(RecipePolicy):
    """Decodes first, then prefill chunks that fill the token budget left."""

    Config: ClassVar[type[PolicyConfig]] = ChunkedPrefillConfig
    config: ChunkedPrefillConfig

    def make_recipe(self) -> IterationRecipe:
        """Decodes (with preemption), then partial prefills, then new admissions."""
        return self.config.recipe(MOVES[self.config.prefill_mode])
