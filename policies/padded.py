"""Padded batches: the execution shared by static and dynamic batching.

A padded batch is formed once, prefilled once and decoded in lockstep until
its last member finishes, the way a server without iteration-level
scheduling runs (HuggingFace ``generate`` on a batch; Triton's dynamic
batcher in front of such a model). Static and dynamic batching differ only
in *when* a batch launches (:meth:`PaddedBatchPolicy.launch_size`); this
module does everything else:

- launch: the FCFS prefix of the waiting queue (at most the launch size,
  shrunk until its reservation fits the free KV blocks); every member's whole
  prompt in one step, a padding row ``(P - p_i, p_i, no sample)`` for each
  member shorter than the longest prompt ``P``, and KV reserved for
  ``P + max(max_tokens)`` tokens per member, as a padded tensor would need;
- decode: one token per live member, billed over the padded context
  ``P + t`` at decode step ``t`` (``BatchPlan.context``); a finished member
  is a dead slot that still costs a padding row ``(1, P + t, sample)``;
- end: when every member has finished, release them all (completing them at
  release time under ``complete_at: batch_end``) and launch the next batch
  in the same plan.

The batch in flight is read from the view (``running`` is exactly the
batch), so the policy keeps no state that could drift from the engine's.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import islice
from typing import ClassVar, Literal, Sequence

from pydantic import Field

from policies.base import PolicyBase, PolicyConfig, held_blocks
from sim.protocols import KVView, ReplicaView, SeqView
from sim.types import BatchPlan

__all__ = ["PaddedBatchConfig", "PaddedBatchPolicy", "reserve_tokens"]


class PaddedBatchConfig(PolicyConfig):
    """Knobs shared by the padded-batch policies."""

    max_batch_size: int = Field(8, ge=1, description="Most requests in one batch (B).")
    complete_at: Literal["batch_end", "own_token"] = Field(
        "batch_end", description="When a member completes: when the whole batch ends and returns "
                                 "('batch_end'), or at its own last token ('own_token').")


def reserve_tokens(batch: Sequence[SeqView]) -> int:
    """KV tokens reserved per member: longest prompt plus the largest ``max_tokens``.

    NOTE: uses ``prompt_tokens``: padded batches never preempt, so a member's
    pending tokens at launch are its prompt.
    """
    return max(s.prompt_tokens for s in batch) + max(s.max_tokens for s in batch)


def fit_prefix(kv: KVView, candidates: Sequence[SeqView], free: int) -> list[SeqView]:
    """Longest prefix of ``candidates`` whose padded reservation fits ``free`` blocks.

    NOTE: O(k^2) calls to ``blocks_needed`` for a batch of k; paid once per
    batch, and a reservation can only grow with the prefix.
    """
    best: list[SeqView] = []
    for k in range(1, len(candidates) + 1):
        members = list(candidates[:k])
        target = reserve_tokens(members)
        if sum(kv.blocks_needed(s, target) for s in members) > free:
            break
        best = members
    return best


class PaddedBatchPolicy(PolicyBase):
    """Runs one padded batch at a time; subclasses decide when it launches."""

    # a finished member is billed as a dead slot exactly like its live row (one token
    # over the padded context), so a completion leaves the decode step's billed shape
    # unchanged (sim.runs goes on through completions to the batch's end)
    steady_dead_slots: ClassVar[bool] = True
    config: PaddedBatchConfig

    def launch_size(self, view: ReplicaView) -> tuple[int, float | None]:
        """How many waiting requests to launch now (0: not yet) and, if not, when to look again."""
        raise NotImplementedError

    def schedule(self, view: ReplicaView) -> BatchPlan:
        """Decode the batch in flight; once it has finished, release it and launch the next."""
        batch = list(view.running)
        if any(not s.finished for s in batch):
            return self._decode(batch)
        if not batch:
            return self._launch(view, view.kv.free_blocks)
        target = reserve_tokens(batch)
        freed = sum(held_blocks(view.kv, s, target) for s in batch)
        plan = self._launch(view, view.kv.free_blocks + freed)
        return replace(plan, release=tuple(s.rid for s in batch),
                       complete_on_release=self.config.complete_at == "batch_end")

    def _decode(self, batch: list[SeqView]) -> BatchPlan:
        """One lockstep decode: live members advance, finished ones bill dead-slot rows."""
        longest = max(s.prompt_tokens for s in batch)
        t = max(s.num_generated for s in batch) - 1  # decode steps already run
        live = [s for s in batch if not s.finished]
        return BatchPlan(
            num_tokens={s.rid: 1 for s in live},
            # every row of the padded tensor attends over the padded length
            context={s.rid: longest + t for s in live if s.num_computed != longest + t},
            padding=tuple((1, longest + t, True) for s in batch if s.finished),
            hold_finished=True,
            # the same rows one token further on until a member finishes, whatever arrives
            steady=True, steady_through_arrivals=True,
        )

    def _launch(self, view: ReplicaView, free: int) -> BatchPlan:
        """Start a batch if the launch rule says so and its head fits the cache."""
        n, idle_until = self.launch_size(view)
        members = fit_prefix(view.kv, list(islice(view.waiting, n)), free) if n else []
        if not members:
            return BatchPlan(idle_until=idle_until)
        longest = max(s.prompt_tokens for s in members)
        target = reserve_tokens(members)
        return BatchPlan(
            num_tokens={s.rid: s.pending for s in members},
            reserve={s.rid: target for s in members},
            padding=tuple((longest - s.prompt_tokens, s.prompt_tokens, False)
                          for s in members if s.prompt_tokens < longest),
            hold_finished=True,
        )
