"""Chunked prefill: Sarathi-Serve's stall-free batching, vLLM v1's default.

Each step has a token budget (``max_num_batched_tokens``). Running decodes
are served first, one token each, with the same preemption as continuous
batching; the budget left goes to the running partially prefilled sequences
in admission order, then to new admissions in queue order, each taking
``min(pending, budget left)`` tokens. A long prompt is thus split across
steps and never freezes the running decodes.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from policies.base import PolicyBase, PolicyConfig
from policies.ordering import QUEUE_ORDERS
from policies.registry import register
from policies.step import IterationConfig, StepBuilder
from sim.protocols import ReplicaView
from sim.types import BatchPlan

__all__ = ["ChunkedPrefillConfig", "ChunkedPrefillPolicy"]


class ChunkedPrefillConfig(IterationConfig):
    """Knobs of :class:`ChunkedPrefillPolicy` (vLLM v1 defaults for online serving)."""

    max_num_batched_tokens: int = Field(
        512, ge=1, description="Token budget of one step, decodes plus prefill chunks "
                               "(vLLM --max-num-batched-tokens; Sarathi's chunk size).")


@register("chunked_prefill")
class ChunkedPrefillPolicy(PolicyBase):
    """Decodes first, then prefill chunks that fill the token budget left."""

    decode_cohort: ClassVar[bool] = True  # plans through StepBuilder (see sim.cohort)
    # with nothing waiting and only plain decodes running, a completion leaves the
    # decodes of the others unchanged (sim.engine runs on through it)
    steady_through_completions: ClassVar[bool] = True
    # with nothing waiting and one partial prefill beside the cohort, each step is the
    # cohort's decodes plus the prefill's next chunk in the budget they leave (sim.engine)
    steady_chunks: ClassVar[bool] = True
    Config: ClassVar[type[PolicyConfig]] = ChunkedPrefillConfig
    config: ChunkedPrefillConfig

    def schedule(self, view: ReplicaView) -> BatchPlan:
        """Decodes (with preemption), then partial prefills, then new admissions."""
        cfg = self.config
        step = StepBuilder(view, cfg.max_num_batched_tokens, cfg.max_num_seqs)
        step.schedule_decodes()
        # NOTE: admit nobody new if a running prefill stalled (it would be
        # overtaken) or if this step preempted (vLLM v1: victims would thrash).
        if step.schedule_partial_prefills() and not step.preempted:
            step.admit(QUEUE_ORDERS[cfg.order](view.waiting), chunked=True)
        return step.plan(steady=True)
