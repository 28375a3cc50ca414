"""The narrow interfaces between the engine, the policies and the cost model.

Policies see a replica only through :class:`ReplicaView`: read-only lists of
:class:`SeqView` plus a :class:`KVView` handle to ask how many blocks a
sequence would need. They return a :class:`batchsim.sim.types.BatchPlan`; the engine
applies it. The cost model is one call, :meth:`CostModel.price`.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from batchsim.sim.types import BatchPlan, StepCost, StepShape

__all__ = ["SeqView", "KVView", "ReplicaView", "Policy", "CostModel", "PolicyError"]


class PolicyError(RuntimeError):
    """A plan broke the engine contract (a bug in the policy, not bad input)."""


class SeqView(Protocol):
    """A sequence as a policy sees it. Treat every attribute as read-only.

    ``max_tokens`` is the output-token bound a real server would know (the
    request's ``max_tokens``); batchsim sets it to the request's true output
    length, as if each client asked for exactly what it got. Policies may use
    it for reservations only.
    """

    rid: int
    arrival: float
    prompt_tokens: int
    max_tokens: int
    num_tokens: int  # known tokens: prompt + generated
    num_computed: int  # tokens whose KV is cached
    num_generated: int
    num_preemptions: int
    finished: bool  # generated every output token (held by a static batch)

    @property
    def pending(self) -> int:
        """Tokens still to compute before the next sample (1 for a decode)."""
        ...

    @property
    def in_prefill(self) -> bool:
        """True until the (re)computed prompt catches up: not a plain decode."""
        ...


class KVView(Protocol):
    """The paged KV cache behind a handle: policies never see block tables."""

    block_size: int
    total_blocks: int

    @property
    def free_blocks(self) -> int: ...

    def blocks_held(self, seq: SeqView) -> int:
        """Blocks ``seq`` holds now (what preempting or releasing it frees,
        less any blocks shared through the prefix cache)."""
        ...

    def blocks_needed(self, seq: SeqView, total_tokens: int) -> int:
        """Extra blocks ``seq`` needs to hold ``total_tokens`` tokens of KV
        (0 when it already holds enough). Prefix-cache hits are counted."""
        ...


# KV handles may also offer ``growth_needed(seqs, extra) -> int``: the sum of
# ``blocks_needed(s, s.num_computed + extra)`` over ``seqs`` in one call (the
# engine's allocators do; policies fall back to the sum when it is absent).


class ReplicaView(Protocol):
    """What a policy may read about one replica at a scheduling point."""

    now: float
    waiting: Sequence[SeqView]  # FCFS order; preempted sequences at the front
    running: Sequence[SeqView]  # admission order (oldest first)
    kv: KVView
    max_model_len: int


@runtime_checkable
class Policy(Protocol):
    """A batching policy: one decision method returning a value."""

    name: str

    def schedule(self, view: ReplicaView) -> BatchPlan: ...


@runtime_checkable
class CostModel(Protocol):
    """Prices one step; peaks are per replica (all tensor-parallel shards)."""

    peak_flops: float  # FLOP/s
    peak_bandwidth: float  # bytes/s

    def price(self, shape: StepShape, breakdown: bool = False) -> StepCost: ...
