"""The executor replica: the simulator's engine and policies driving the reference model.

:class:`ExecutorReplica` is a :class:`batchsim.sim.engine.Replica` whose ``price``
hook runs the plan's rows through :class:`batchsim.calibrate.executor.ReferenceModel`
and returns the measured time (wall time on a GPU, the thread's CPU time on a CPU:
:func:`batchsim.calibrate.kernels.clock`), so SimPy's clock advances by real step
times and the request and step records come from the very same engine and policy
objects as a simulation. Padding rows of a static batch are executed too: a
member's padding extends its prompt row (a real padded batch), dead decode slots
run as scratch rows. Every step leaves a :class:`StepRecord`, which says whether
it replayed a CUDA graph (``mode``).
"""

from __future__ import annotations

import time
from typing import NamedTuple

from batchsim.calibrate.executor import ReferenceModel, Row
from batchsim.sim.engine import Replica
from batchsim.sim.types import BatchPlan, StepCost, StepShape

__all__ = ["ExecutorReplica", "StepRecord"]


class StepRecord(NamedTuple):
    """What the executor measured for one step, next to what the cost model predicted.

    ``enqueue_s`` (wall time until the host had queued the whole step), ``wall_s``
    and ``cpu_s`` (this thread's CPU time) tell a host-bound step (enqueue near
    wall) from a device-bound one, and a descheduled host thread (CPU time well
    under wall) from a busy one; ``at_ms`` is the step's start (Unix milliseconds).
    ``mode`` is how the step ran (:data:`batchsim.calibrate.graphs.MODES`): ``eager``;
    ``static`` (the graph path's static layout run eagerly, on a CPU); ``graph``
    (replayed from a CUDA graph); ``capture`` (its graph was captured in this step,
    whose time includes the capture).
    """

    measured_s: float
    predicted_s: float
    rows: int
    tokens: int
    enqueue_s: float = 0.0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    at_ms: int = 0
    mode: str = "eager"


class ExecutorReplica(Replica):
    """A replica whose steps run on :class:`ReferenceModel` and take their measured time."""

    def __init__(self, *args, model: ReferenceModel, log: list[StepRecord], repeats: int = 1, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.model, self.log, self.repeats = model, log, repeats
        self.tokens: dict[int, list[int]] = {}

    def _sync(self) -> None:
        """Free the KV slots and token lists of sequences that stopped running or left."""
        live = {s.rid for s in self.running}
        self.model.release([k for k in self.model.slot_of if k not in live])
        for rid in [r for r in self.tokens if r not in self.seqs]:
            del self.tokens[rid]

    def _rows(self, plan: BatchPlan) -> list[Row]:
        """The plan's rows; a padding row (q, kv=p) extends the member prompt row (p, 0)."""
        rows, vocab = [], self.model.spec.vocab_size
        for rid, q in plan.num_tokens.items():
            seq = self.seqs[rid]
            toks = self.tokens.get(rid)
            if toks is None:
                toks = self.tokens[rid] = [(rid * 7919 + i * 104729) % vocab for i in range(seq.prompt_tokens)]
            kv = seq.num_computed
            sample = q - 1 if kv + q == seq.num_tokens else None
            rows.append(Row(rid, q, kv, sample, toks[kv:kv + q]))
        for pq, pkv, samples in plan.padding:
            host = next((i for i, r in enumerate(rows) if r.kv == 0 and r.q == pkv and r.key is not None
                         and len(r.ids) == r.q), None)
            if host is not None and not samples and pq > 0:
                r = rows[host]
                rows[host] = r._replace(q=r.q + pq, ids=list(r.ids) + [0] * pq)
            elif pq > 0:
                rows.append(Row(None, pq, pkv, pq - 1 if samples else None))
        return rows

    def price(self, plan: BatchPlan, shape: StepShape) -> StepCost:
        """Run the step for real; its cost is the measured time (work and split from the cost model).

        With ``repeats`` > 1 the step runs that many times (a re-run is
        idempotent: same tokens, same KV positions) and costs the median run.
        """
        times = []
        for _ in range(self.repeats):
            at, c0, w0 = int(time.time() * 1000), time.thread_time(), time.perf_counter()
            t0 = self.model.clock()
            self._sync()
            rows = self._rows(plan)
            sampled = self.model.step(rows)
            t1 = self.model.clock()
            times.append((t1 - t0, self.model.enqueued - w0, time.perf_counter() - w0, time.thread_time() - c0, at,
                          self.model.last_mode))
        seconds, enqueue, wall, cpu, at, mode = sorted(times)[len(times) // 2]
        for r, tok in zip(rows, sampled):
            if tok is not None and r.key is not None:
                self.tokens[r.key].append(tok)
        pred = self.cost.price(shape)
        self.log.append(StepRecord(seconds, pred.seconds, shape.num_rows, shape.num_tokens, enqueue, wall, cpu, at,
                                   mode))
        k = seconds / pred.seconds if pred.seconds > 0 else 0.0
        return StepCost(seconds=seconds, flops=pred.flops, bytes=pred.bytes, compute_s=pred.compute_s * k,
                        memory_s=pred.memory_s * k, network_s=pred.network_s * k, overhead_s=pred.overhead_s * k,
                        out_of_range=pred.out_of_range)
