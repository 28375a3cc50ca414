"""Continuous (iteration-level) batching: Orca and vLLM v0.

Every step, finished sequences have left (the engine frees them) and queued
ones may enter; KV is allocated per step and running sequences that cannot
grow are preempted by recompute, most recently admitted first. A prompt runs
whole in one step. ``prefill_mode`` picks how prefills meet decodes:

- ``separate`` (vLLM v0 default): if any waiting sequence can be admitted the
  step is prefill-only and running decodes pause; otherwise it is a
  decode-only step. This is the "prefill stall" that chunked prefill fixes.
- ``mixed`` (Orca): decodes first, then whole prompts into the token budget
  and sequence slots left, in the same step.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from policies.base import PolicyBase, PolicyConfig
from policies.ordering import QUEUE_ORDERS
from policies.registry import register
from policies.step import IterationConfig, StepBuilder
from sim.protocols import ReplicaView
from sim.types import BatchPlan

__all__ = ["ContinuousConfig", "ContinuousPolicy"]


class ContinuousConfig(IterationConfig):
    """Knobs of :class:`ContinuousPolicy`."""

    prefill_mode: Literal["separate", "mixed"] = Field(
        "separate", description="'separate': prefill-only or decode-only steps (vLLM v0); "
                                "'mixed': decodes and whole prefills in one step (Orca).")


@register("continuous")
class ContinuousPolicy(PolicyBase):
    """Iteration-level batching with whole-prompt prefills and preemption by recompute."""

    decode_cohort: ClassVar[bool] = True  # plans through StepBuilder (see sim.cohort)
    # with nothing waiting and only plain decodes running, a completion leaves the
    # decodes of the others unchanged (sim.engine runs on through it)
    steady_through_completions: ClassVar[bool] = True
    Config: ClassVar[type[PolicyConfig]] = ContinuousConfig
    config: ContinuousConfig

    def schedule(self, view: ReplicaView) -> BatchPlan:
        """Fill one step: prefill-only else decodes (separate), or decodes then prefills (mixed)."""
        cfg = self.config
        step = StepBuilder(view, cfg.max_num_batched_tokens, cfg.max_num_seqs)
        queue = QUEUE_ORDERS[cfg.order](view.waiting)
        if cfg.prefill_mode == "separate":
            step.admit(queue, chunked=False)
            if not step.num_tokens:
                step.schedule_decodes()
        else:
            step.schedule_decodes()
            # NOTE: as in vLLM, a step that had to preempt admits nobody: the
            # victims would come straight back and thrash.
            if not step.preempted:
                step.admit(queue, chunked=False)
        return step.plan(steady=True)
