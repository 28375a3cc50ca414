"""Small scheduling strategies as plain functions (Ciw style).

A queue order takes the waiting queue (FCFS, preempted sequences at the
front, as the engine keeps it) and returns the order in which a policy tries
to admit; a victim selector picks which running sequence to preempt. Keeping
them as functions lets a policy expose them as a ``Literal`` knob and lets a
plugin reuse them without subclassing.
"""

from __future__ import annotations

from typing import Callable, Literal, Sequence

from batchsim.sim.protocols import SeqView

__all__ = ["QueueOrder", "QUEUE_ORDERS", "RETRACT_FIRST", "VICTIM_RULES", "VictimRule", "fcfs", "shortest_prompt_first", "last_admitted",
           "fewest_decoded"]

QueueOrder = Literal["fcfs", "shortest_prompt_first"]
VictimRule = Literal["last_admitted", "fewest_decoded"]


def fcfs(waiting: Sequence[SeqView]) -> Sequence[SeqView]:
    """First come, first served: the engine's queue order, preempted sequences first."""
    return waiting


def shortest_prompt_first(waiting: Sequence[SeqView]) -> list[SeqView]:
    """Shortest prompt first, ties by queue position.

    Preempted sequences (``num_preemptions > 0``) keep their place at the
    front: they already waited once and hold generated tokens.
    NOTE: sorts the whole queue each step (O(n log n)); fine for the queue
    lengths a replica sustains, and the price of an order the engine does not
    maintain.
    """
    preempted = [s for s in waiting if s.num_preemptions > 0]
    fresh = sorted((s for s in waiting if s.num_preemptions == 0), key=lambda s: s.prompt_tokens)
    return preempted + fresh


QUEUE_ORDERS: dict[str, Callable[[Sequence[SeqView]], Sequence[SeqView]]] = {
    "fcfs": fcfs,
    "shortest_prompt_first": shortest_prompt_first,
}


def last_admitted(running: Sequence[SeqView]) -> SeqView:
    """vLLM's preemption victim: the most recently admitted (last in admission order)."""
    return running[-1]


def fewest_decoded(running: Sequence[SeqView]) -> SeqView:
    """SGLang's retraction victim (``retraction_policy='length'``): the fewest generated tokens, then
    the longest prompt, then the most recently admitted.

    SGLang sorts the batch by ``(len(output_ids), -len(origin_input_ids))``, most-preferred-to-keep
    first (a stable sort, reversed), and retracts from the end
    (``managers/schedule_batch.py`` ``_get_decode_retraction_order``).
    """
    best = running[-1]
    key = (best.num_generated, -best.prompt_tokens)
    for seq in reversed(running):
        k = (seq.num_generated, -seq.prompt_tokens)
        if k < key:
            best, key = seq, k
    return best


VICTIM_RULES: dict[str, Callable[[Sequence[SeqView]], SeqView]] = {
    "last_admitted": last_admitted,
    "fewest_decoded": fewest_decoded,
}

# Victim rules applied as SGLang's retract_decode applies its own: over the whole decode batch, before
# any of it is scheduled, until the rest can grow (the others: vLLM's, over the sequences not yet
# scheduled, when one cannot grow).
RETRACT_FIRST = frozenset({"fewest_decoded"})
