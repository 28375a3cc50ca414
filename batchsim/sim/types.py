"""The small value types every package shares.

This module (with :mod:`batchsim.sim.protocols`) is the only part of ``sim`` that
``policies``, ``workloads`` and ``calibrate`` may import. It holds plain,
mostly frozen values: the requests a workload produces, the plan a policy
returns, the step shape the cost model prices and the price it returns.

The token model follows vLLM's v1 scheduler: there is no "prefill phase".
Every sequence has ``num_tokens`` known tokens (prompt plus the output tokens
generated so far) and ``num_computed`` tokens whose KV is already in the cache.
A step schedules ``q`` new tokens for a sequence (``num_computed += q``); when
``num_computed`` catches up with ``num_tokens`` the step samples one output
token (``num_tokens += 1``). A first prefill, a chunk of a prefill, a decode
and a recompute after preemption are all the same operation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

__all__ = [
    "Workload",
    "ClosedLoop",
    "BatchPlan",
    "StepShape",
    "OpCost",
    "StepCost",
    "IDLE",
]


@dataclass(frozen=True, eq=False)
class ClosedLoop:
    """A closed-loop client population (``workload.arrival.process: closed``).

    ``concurrency`` clients start at t = 0; each sends request ``rid`` (the next
    unsent one, in rid order) and, when it ends (completed or rejected), waits
    ``think_s[rid]`` seconds and sends the next. So arrival times are made by the
    run, not given: ``Workload.arrival`` holds zeros until the engine fills them.
    """

    concurrency: int
    think_s: np.ndarray  # float64 >= 0, one per request: the wait after it ends

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("a closed loop needs at least one client")


@dataclass(frozen=True, eq=False)
class Workload:
    """Requests as columns, sorted by arrival time (seconds from t=0).

    Columnar so that a million-request trace costs a few arrays, not a
    million objects. ``prefix_hashes`` is optional: per request, the content
    hashes of its prompt's KV blocks (Mooncake ``hash_ids``) for prefix
    caching; ``None`` when the workload has none.
    """

    arrival: np.ndarray  # float64, non-decreasing
    prompt_tokens: np.ndarray  # int64 >= 1
    output_tokens: np.ndarray  # int64 >= 1
    prefix_hashes: tuple[tuple[int, ...], ...] | None = None
    prefix_block_tokens: int = 0  # tokens per prefix hash block (Mooncake: 512)
    closed: "ClosedLoop | None" = None  # a closed loop: arrivals come from completions (arrival is a placeholder)

    def __post_init__(self) -> None:
        n = len(self.arrival)
        if len(self.prompt_tokens) != n or len(self.output_tokens) != n:
            raise ValueError("workload columns differ in length")
        if self.prefix_hashes is not None and len(self.prefix_hashes) != n:
            raise ValueError("prefix_hashes length differs from the workload")

    def __len__(self) -> int:
        return len(self.arrival)


@dataclass(frozen=True)
class BatchPlan:
    """What a policy wants the replica to do next: a plain value.

    - ``num_tokens``: rid -> tokens to compute this step. A rid that is in the
      waiting queue is admitted by being named here. Iteration order is the
      row order of the step.
    - ``preempt``: running rids to preempt by recompute before the step (their
      KV is freed, ``num_computed`` is reset to 0 and they go back to the
      front of the waiting queue, keeping their generated tokens).
    - ``reserve``: rid -> total tokens of KV to hold for that sequence
      (static batching reserves the padded batch). The engine holds
      ``max(reserve, num_computed + q)`` tokens' worth of blocks.
    - ``padding``: extra rows that are billed but do no useful work, as
      ``(q, kv, samples)``: a static batch's padding to the longest prompt and
      its dead slots.
    - ``context``: rid -> the context length to *bill* for that row instead
      of its own ``num_computed`` (a padded batch attends over the padded
      length); useful-work accounting still uses the real context.
    - ``hold_finished``: sequences that finish in this step stay in the batch
      (KV kept, still listed in ``running`` with ``finished`` true) until the
      policy names them in ``release`` of a later plan.
    - ``release``: finished sequences to let go before the step (KV freed).
      With ``complete_on_release`` their completion time becomes the release
      time (a static batch returns all its requests when the batch ends); on a
      ``hold_finished`` plan it says the same of the sequences it holds (so the
      engine tells a closed loop's client at the release, not at the last token).
    - ``reject``: rid -> reason, for waiting requests this policy can never
      run (a prompt over its token budget); they leave as rejected.
    - ``idle_until``: when the plan schedules nothing, wake at this time at the
      latest (an arrival wakes the replica earlier); ``None`` waits for the
      next arrival.
    - ``ahead``: the replica plans the step after this one while this one runs
      (vLLM's async scheduling, SGLang's and TensorRT-LLM's overlap schedulers):
      requests that reach the replica during the step, and the KV its finished
      sequences free, are seen by the plan after next, not the next one. With
      nothing planned, the replica takes both at once and plans again.
    - ``graph_tokens``: the token count the step's dense operators run at, when the engine
      replays a CUDA graph captured for more tokens than the step has (0: its own count);
      attention and the LM head run on the real rows.
    """

    num_tokens: Mapping[int, int] = field(default_factory=dict)
    preempt: tuple[int, ...] = ()
    reserve: Mapping[int, int] = field(default_factory=dict)
    padding: tuple[tuple[int, int, bool], ...] = ()
    context: Mapping[int, int] = field(default_factory=dict)
    hold_finished: bool = False
    release: tuple[int, ...] = ()
    complete_on_release: bool = False
    reject: Mapping[int, str] = field(default_factory=dict)
    idle_until: float | None = None
    ahead: bool = False
    graph_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Useful tokens scheduled in this step (padding excluded)."""
        return sum(self.num_tokens.values())


IDLE = BatchPlan()


@dataclass(frozen=True, eq=False)
class StepShape:
    """The shape of one forward step, free of any policy config.

    One row per sequence in the batch (padded rows included): ``q`` new tokens
    over ``kv`` tokens already cached. ``sampled`` rows produce a token and so
    run the LM head. Rows with ``q == 1`` and ``kv > 0`` are decodes; the rest
    are (chunks of) prefills. ``dense_tokens``, when set, is the token count the
    dense operators (projections, MLP, norms, all-reduces) run at: a CUDA graph's
    capture size the step is padded to (BatchPlan.graph_tokens).
    """

    q: np.ndarray  # int64 per row
    kv: np.ndarray  # int64 per row
    sampled: int
    dense_tokens: int = 0

    @property
    def num_rows(self) -> int:
        return len(self.q)

    @property
    def num_tokens(self) -> int:
        return int(self.q.sum())

    @classmethod
    def of(cls, rows: list[tuple[int, int]] | tuple[tuple[int, int], ...], sampled: int | None = None) -> "StepShape":
        """Build from ``[(q, kv), ...]``; every row samples unless told."""
        q = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        kv = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
        return cls(q=q, kv=kv, sampled=len(rows) if sampled is None else sampled)


@dataclass(frozen=True)
class OpCost:
    """One operator's price, summed over all layers of one replica."""

    name: str
    seconds: float
    flops: float
    bytes: float
    bound: str  # "compute" | "memory" | "network" | "overhead"


@dataclass(frozen=True)
class StepCost:
    """What a step costs: time and the work behind it.

    ``compute_s`` and ``memory_s`` split the operator time by which roofline
    bound won; ``overhead_s`` is launch and host time; ``network_s`` is
    tensor-parallel communication. ``seconds`` is their sum.
    ``out_of_range`` counts operators priced outside a calibrated profile's
    measured range.
    """

    seconds: float
    flops: float
    bytes: float
    compute_s: float = 0.0
    memory_s: float = 0.0
    network_s: float = 0.0
    overhead_s: float = 0.0
    out_of_range: int = 0
    breakdown: tuple[OpCost, ...] | None = None
