"""Padded batches: the execution shared by static and dynamic batching.

A padded batch is formed once, prefilled once and decoded in lockstep until
its last member finishes, the way a server without iteration-level
scheduling runs (HuggingFace ``generate`` on a batch; Triton's dynamic
batcher in front of such a model). Static and dynamic batching differ only
in *when* a batch launches (their :class:`~batchsim.policies.recipe.PaddedRecipe`,
read by :func:`launch_size`); :func:`run_padded` interprets that recipe and
does everything else:

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
batch), so the policy keeps no state that could drift from the engine's. The
compiled core (batchsim/core/_core.c) interprets the same recipes the same way.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import islice
from typing import Literal, Sequence

from pydantic import Field

from batchsim.policies.base import PolicyConfig, held_blocks
from batchsim.policies.recipe import PaddedRecipe
from batchsim.sim.protocols import KVView, ReplicaView, SeqView
from batchsim.sim.types import BatchPlan

__all__ = ["PaddedBatchConfig", "launch_size", "reserve_tokens", "run_padded"]


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


def launch_size(recipe: PaddedRecipe, view: ReplicaView) -> tuple[int, float | None]:
    """How many waiting requests to launch now (0: not yet) and, if not, when to look again.

    The recipe's rule: ``max_batch_size`` once that many wait; else the
    largest preferred size the queue can fill; else everyone once the oldest
    has waited ``max_queue_delay_s`` (at once when that is 0).
    """
    n, top = len(view.waiting), recipe.max_batch_size
    if n == 0:
        return 0, None
    if n >= top:
        return top, None
    fits = [b for b in recipe.preferred_batch_sizes if b <= n]
    if fits:
        return max(fits), None
    if recipe.max_queue_delay_s == 0:
        return n, None
    deadline = view.waiting[0].arrival + recipe.max_queue_delay_s
    return (n, None) if view.now >= deadline else (0, deadline)


def run_padded(recipe: PaddedRecipe, view: ReplicaView) -> BatchPlan:
    """Decode the batch in flight; once it has finished, release it and launch the next."""
    batch = list(view.running)
    if any(not s.finished for s in batch):
        return _decode(batch, recipe.complete_at == "batch_end")
    if not batch:
        return _launch(recipe, view, view.kv.free_blocks)
    target = reserve_tokens(batch)
    freed = sum(held_blocks(view.kv, s, target) for s in batch)
    plan = _launch(recipe, view, view.kv.free_blocks + freed)
    return replace(plan, release=tuple(s.rid for s in batch),
                   complete_on_release=recipe.complete_at == "batch_end")


def _decode(batch: list[SeqView], on_release: bool) -> BatchPlan:
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
        complete_on_release=on_release,
    )


def _launch(recipe: PaddedRecipe, view: ReplicaView, free: int) -> BatchPlan:
    """Start a batch if the launch rule says so and its head fits the cache."""
    n, idle_until = launch_size(recipe, view)
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
        complete_on_release=recipe.complete_at == "batch_end",
    )
