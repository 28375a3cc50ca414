"""The SimPy kernel: an arrival process, a router and one process per replica.

A replica's loop is the whole engine: ask the policy for a plan, apply its
admission part (release, reject, preempt, admit and grow KV), price the
step's shape, ``yield env.timeout(seconds)``, then apply the result (tokens
advance, first tokens and completions are stamped, KV is freed). There is no
policy logic here; one SimPy event per step, or per run of steps whose plans
are known in advance (fast-forward: sim.runs, a mixin of Replica).
"""

from __future__ import annotations

import math
from collections import deque
from itertools import islice
from typing import Callable, Sequence

import numpy as np
import simpy

from sim.cohort import Cohort
from sim.kv import PagedKVCache
from sim.protocols import CostModel, Policy, PolicyError
from sim.records import ItlLog, StepLog
from sim.runs import Runs, _cohort_shape, _Run, _timeout_at
from sim.state import COMPLETED, REJECTED, Seq
from sim.types import BatchPlan, StepShape, Workload

__all__ = ["Replica", "Cluster", "PolicyError", "too_long", "over_kv", "queue_full"]


# Why the engine rejects a request (the compiled core's records give the same words: sim.core)
def too_long(total: int, max_model_len: int) -> str:
    return f"prompt+output {total} > max_model_len {max_model_len}"


def over_kv(total: int, capacity_tokens: int) -> str:
    return f"prompt+output {total} tokens > KV capacity {capacity_tokens}"


def queue_full(max_queue_len: int) -> str:
    return f"queue full ({max_queue_len} waiting)"


class _View:
    """The read-only window a policy gets onto its replica.

    With a decode cohort (sim.cohort), ``cohort`` is it and ``others`` the
    running sequences outside it (admission order); reading ``running``
    brings the members' attributes up to date first.
    """

    __slots__ = ("_env", "waiting", "_running", "kv", "max_model_len", "cohort", "others")

    def __init__(self, env, waiting, running, kv, max_model_len, cohort=None, others=None) -> None:
        self._env, self.waiting, self._running = env, waiting, running
        self.kv, self.max_model_len = kv, max_model_len
        self.cohort, self.others = cohort, others

    @property
    def now(self) -> float:
        return self._env.now

    @property
    def running(self) -> list:
        if self.cohort is not None and self.cohort.stale:
            self.cohort.sync()
        return self._running


class Replica(Runs):
    """One model replica: a policy, a KV cache and a cost model."""

    def __init__(self, env: simpy.Environment, index: int, policy: Policy, cost: CostModel,
                 kv: PagedKVCache, max_model_len: int, steps: StepLog, itl: ItlLog) -> None:
        self.env, self.index, self.policy, self.cost, self.kv = env, index, policy, cost, kv
        self.max_model_len = max_model_len
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.seqs: dict[int, Seq] = {}
        self.steps, self.itl = steps, itl
        # NOTE: a policy that plans BatchPlan.decode_cohort (StepBuilder's) gets its running
        # decodes kept as columns (sim.cohort); not for subclasses that price steps themselves
        # (the reference executor reads every row) nor with a prefix cache
        self._cohort: Cohort | None = None
        self._others: list[Seq] = []  # running, not in the cohort, admission order
        if getattr(policy, "decode_cohort", False) and type(kv) is PagedKVCache and type(self).price is Replica.price:
            self._cohort = Cohort(kv)
        self._admissions = 0
        # the policy's word that, while nothing waits and only the cohort runs, a completion
        # changes its steady plan only by dropping the finished rows (_cohort_run)
        self._through_completions = self._cohort is not None and bool(
            getattr(policy, "steady_through_completions", False))
        # ... and that, while nothing waits and one partial prefill runs beside the cohort, it
        # plans the cohort's decodes plus the prefill's next chunk in the budget left (_chunk_run)
        self._chunk_runs = self._cohort is not None and bool(getattr(policy, "steady_chunks", False))
        # ... and that a batch holding its finished sequences bills each as a dead slot like its
        # live row, so a completion leaves the step's price unchanged (_apply_dead_rows)
        self._dead_slots = bool(getattr(policy, "steady_dead_slots", False))
        self.view = _View(env, self.waiting, self.running, kv, max_model_len, self._cohort,
                          self._others if self._cohort is not None else None)
        self._wake: simpy.Event | None = None
        self.busy_s = 0.0
        self._outstanding = 0  # admitted to this replica and not yet done (see outstanding)
        self._fin_ends: np.ndarray | None = None  # a run through completions: its finishers' step ends
        # fast-forward (off until enable_fast_forward says when requests arrive)
        self._next_arrival: Callable[[], float] | None = None
        self._arrival_times: Callable[[float, float], np.ndarray] | None = None
        self._run_arrivals: list[float] | None = None  # enqueue times during a run through arrivals
        self._horizon = math.inf
        # set by Cluster: how many replicas share the arrivals, and whether its
        # router reads replicas' KV (then runs cannot span other replicas' arrivals)
        self._share = 1
        self._kv_observed = True
        self._run: _Run | None = None  # the run in flight (see _truncate)
        self._run_event: simpy.Event | None = None
        self._step_s: float | None = None  # the last steady step's time (guesses a run's length)
        self.fast_forward_steps = 0  # steps applied in bulk, for the benchmark's report
        self.process = env.process(self._loop())

    @property
    def outstanding(self) -> int:
        """Requests admitted to this replica and not yet done (what routers balance).
        During a run through completions, its members count as done from the end of
        the step they finish in, as step by step."""
        fin = self._fin_ends
        if fin is None:
            return self._outstanding
        return self._outstanding - int(np.searchsorted(fin, self.env.now, "right"))

    def enable_fast_forward(self, next_arrival: Callable[[], float], horizon: float | None,
                            arrival_times: Callable[[float, float], np.ndarray] | None = None) -> None:
        """Let runs of steady decode steps be priced and applied in one event.

        ``next_arrival()`` is the time of the next request not yet delivered
        to any replica (inf when none); ``horizon`` is when the simulation
        stops; ``arrival_times(lo, hi)`` the arrival times in ``(lo, hi]``
        (lets runs of plans that ignore arrivals go through them). Exact:
        records are bit-identical with and without (see
        :meth:`_decode_run`). Stays off when a subclass prices steps itself
        (the reference executor times every step for real), when the cost
        model cannot price runs of decodes, and with a prefix cache.
        """
        if (type(self).price is not Replica.price or type(self.kv) is not PagedKVCache
                or not hasattr(self.cost, "price_decodes") or not hasattr(self.cost, "decode_flops")):
            return
        self._next_arrival = next_arrival
        self._arrival_times = arrival_times
        self._horizon = math.inf if horizon is None else horizon

    # -- arrivals -------------------------------------------------------------
    def enqueue(self, seq: Seq) -> None:
        """Accept a routed request (or reject one that can never fit)."""
        seq.replica = self.index
        total = seq.prompt_tokens + seq.output_tokens
        if total > self.max_model_len:
            return self.reject(seq, too_long(total, self.max_model_len))
        if self.kv.blocks_needed(seq, total) > self.kv.total_blocks:
            return self.reject(seq, over_kv(total, self.kv.total_blocks * self.kv.block_size))
        self.seqs[seq.rid] = seq
        self.waiting.append(seq)
        if self._run_arrivals is not None:
            self._run_arrivals.append(self.env.now)
        elif self._run is not None and self._run.truncatable:
            self._truncate()
        self._outstanding += 1
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def reject(self, seq: Seq, reason: str) -> None:
        """Mark ``seq`` rejected: it leaves without running."""
        seq.status, seq.reason = REJECTED, reason

    # -- the loop -------------------------------------------------------------
    def _loop(self):
        env = self.env
        admin_only = 0
        while True:
            if self.kv.prefix_caching:
                self._peek()
            plan = self.policy.schedule(self.view)
            preempted = self._admit(plan)
            if not plan.num_tokens:
                if plan.release or plan.reject or plan.preempt:
                    # The plan changed state without a step: ask again now.
                    admin_only += 1
                    if admin_only > 100_000:
                        raise PolicyError(f"{self.policy.name}: no step after 100000 plans")
                    continue
                yield from self._idle(plan)
                continue
            admin_only = 0
            shape, useful = self._grow_and_shape(plan)
            start = env.now
            run = cost = None
            if plan.steady and self._next_arrival is not None:
                run, cost = self._decode_run(plan, shape, useful, start)
            elif (self._chunk_runs and plan.decode_cohort and self._next_arrival is not None
                  and not self.waiting and not plan.preempt and not plan.release):
                run, cost = self._chunk_run(plan, shape, start)
            if run is None:
                if cost is None:
                    cost = self.price(plan, shape)
                    if plan.steady:  # keep the run-length guess fresh (_decode_run)
                        self._step_s = cost.seconds
                useful_flops = self.cost.price(useful).flops if useful is not None else cost.flops
                yield env.timeout(cost.seconds)
            else:
                self._run = run
                self._run_event = _timeout_at(env, float(run.ends[-1]))
                yield self._run_event
                run, self._run, self._run_event = self._run, None, None
                if run.done is not None:
                    plan, shape, cost, useful_flops, start = self._apply_cohort_run(run)
                elif run.chunk is not None:
                    plan, shape, cost, useful_flops, start = self._apply_chunk_run(run, plan)
                else:
                    plan, shape, cost, useful_flops, start = self._apply_run(run, plan, shape)
                preempted = 0
            self.busy_s += cost.seconds
            self._advance(plan)
            self._record(plan, shape, cost, useful_flops, start, preempted)

    def price(self, plan: BatchPlan, shape: StepShape):
        """What the step costs. The reference executor (calibrate.executor)
        overrides this to run the plan on a real model and time it."""
        return self.cost.price(shape)

    def _peek(self, depth: int = 256) -> None:
        # NOTE: only the head of the queue is looked up each round: policies
        # admit from the front, and a deep lookup per step would cost O(queue).
        kv = self.kv
        for i, seq in enumerate(self.waiting):
            if i >= depth:
                break
            seq.num_computed = 0  # waiting sequences hold no KV; re-count their cached prefix
            kv.peek(seq)

    def _idle(self, plan: BatchPlan):
        now = self.env.now
        self._wake = self.env.event()
        events = [self._wake]
        if plan.idle_until is not None:
            if plan.idle_until <= now:
                raise PolicyError(f"{self.policy.name}: idle_until {plan.idle_until} is not after now {now}")
            events.append(self.env.timeout(plan.idle_until - now))
        yield self.env.any_of(events)
        self._wake = None

    def sync(self) -> None:
        """Bring every running sequence's attributes up to date (sim.cohort)."""
        if self._cohort is not None:
            self._cohort.sync()

    def _dissolve_if_named(self, plan: BatchPlan) -> None:
        """Dissolve the cohort when a plan names a member other than by decoding the
        cohort; a plan that decodes it takes its preempted members out first."""
        co, seqs = self._cohort, self.seqs

        def names_member(rids) -> bool:
            return any(seqs[rid].in_cohort for rid in rids)

        if plan.decode_cohort:
            out = [rid for rid in plan.preempt if seqs[rid].in_cohort]
            if out:
                self._others.extend(co.remove(np.isin(co.rid, out)))  # (the preemption takes them out)
            if len(plan.num_tokens) < len(co):
                raise PolicyError(f"{self.policy.name}: a decode_cohort plan has fewer rows than the cohort")
            if names_member(islice(plan.num_tokens, len(co), None)) or names_member(plan.release):
                raise PolicyError(f"{self.policy.name}: a decode_cohort plan names a member twice")
            return
        if names_member(plan.num_tokens) or names_member(plan.preempt) or names_member(plan.release):
            co.clear()
            self._others[:] = self.running

    def _admit(self, plan: BatchPlan) -> int:
        """Apply release, reject, preempt, then admit and grow KV."""
        now, seqs, kv = self.env.now, self.seqs, self.kv
        co = self._cohort
        if co is not None and co.seqs:
            self._dissolve_if_named(plan)
        for rid in plan.release:
            seq = seqs.pop(rid)
            if not seq.finished:
                raise PolicyError(f"{self.policy.name}: released rid {rid} has not finished")
            self.running.remove(seq)
            if co is not None:
                self._others.remove(seq)
            seq.is_running = False
            kv.free(rid)
            if plan.complete_on_release:
                seq.completion = now
            self._outstanding -= 1
        if plan.reject:
            for rid, reason in plan.reject.items():
                seq = seqs.pop(rid)
                self.waiting.remove(seq)
                self.reject(seq, reason)
                self._outstanding -= 1
        if plan.preempt:
            victims = [seqs[rid] for rid in plan.preempt]
            for seq in victims:
                if not seq.is_running:
                    raise PolicyError(f"{self.policy.name}: preempted rid {seq.rid} is not running")
                seq.is_running = False
                self.running.remove(seq)
                if co is not None:
                    self._others.remove(seq)
                kv.free(seq.rid)
                seq.num_computed = 0
                seq.num_preemptions += 1
            self.waiting.extendleft(reversed(victims))
        rows = islice(plan.num_tokens, len(co), None) if plan.decode_cohort else plan.num_tokens
        admitted = [s for s in map(seqs.__getitem__, rows) if not s.is_running]
        self._take_from_waiting(admitted)
        order = self._admissions
        for seq in admitted:
            seq.is_running = True
            seq.order = order
            order += 1
            if seq.admitted is None:
                seq.admitted = now
        self._admissions = order
        if co is not None:
            self._others.extend(admitted)
        if kv.prefix_caching:
            # NOTE: pin every admission's cached prefix before any allocation,
            # so one admission's eviction can't take what peek promised another.
            for seq in admitted:
                kv.pin(seq)
        self.running.extend(admitted)
        return len(plan.preempt)

    def _take_from_waiting(self, admitted: list[Seq]) -> None:
        if not admitted:
            return
        waiting = self.waiting
        # NOTE: FCFS admissions are a prefix of the queue: pop them in O(k);
        # any other order falls back to one O(n) rebuild.
        k = len(admitted)
        if all(waiting[i] is admitted[i] for i in range(min(k, len(waiting)))) and k <= len(waiting):
            for _ in range(k):
                waiting.popleft()
            return
        ids = {id(s) for s in admitted}
        keep = [s for s in waiting if id(s) not in ids]
        if len(keep) + k != len(waiting):
            raise PolicyError(f"{self.policy.name}: scheduled a sequence that is neither waiting nor running")
        waiting.clear()
        waiting.extend(keep)

    def _grow_and_shape(self, plan: BatchPlan) -> tuple[StepShape, StepShape | None]:
        """Check each row, grow its KV, and build the step's shape (one pass)."""
        seqs, kv, reserve = self.seqs, self.kv, plan.reserve
        # NOTE: the plain allocator's no-growth case is inlined: most decode
        # steps grow nothing, and a method call per row is the hot path.
        held = kv._held if type(kv) is PagedKVCache else None
        bs = kv.block_size
        ctx, sampled = [], 0
        rows = plan.num_tokens.items()
        co = self._cohort if plan.decode_cohort else None
        if co is not None:  # the cohort's rows: one token each over its contexts
            k = len(co)
            if reserve or plan.padding or plan.context:
                raise PolicyError(f"{self.policy.name}: a decode_cohort plan reserves KV or pads")
            co.grant_step()
            rows = islice(rows, k, None)
        for rid, q in rows:
            seq = seqs[rid]
            c = seq.num_computed
            total = c + q
            if q < 1 or total > seq.num_tokens:
                raise PolicyError(f"{self.policy.name}: rid {rid} scheduled {q} tokens with "
                                  f"{seq.pending} pending")
            if reserve:
                total = max(reserve.get(rid, 0), total)
            if held is None or held.get(rid, 0) * bs < total:
                kv.grow(rid, total)
            ctx.append(c)
            if c + q == seq.num_tokens:
                sampled += 1
        n, pad, billed = len(ctx), plan.padding, plan.context
        if co is not None:
            # NOTE: the rows' sums come from the cohort's and the other rows' own numbers, so
            # the cost model skips its reductions (StepShape.sums); members decode one token
            kc = co.ctx
            return _cohort_shape(kc, int(kc.sum()), list(islice(plan.num_tokens.values(), k, None)), ctx,
                                 sampled), None
        q_arr = np.fromiter(plan.num_tokens.values(), dtype=np.int64, count=n)
        kv_arr = np.array(ctx, dtype=np.int64)
        if not pad and not billed:
            return StepShape(q=q_arr, kv=kv_arr, sampled=sampled), None
        useful = StepShape(q=q_arr, kv=kv_arr, sampled=sampled)
        if billed:
            kv_arr = np.array([billed.get(rid, c) for rid, c in zip(plan.num_tokens, ctx)], dtype=np.int64)
        q_all = np.concatenate([q_arr, np.array([p[0] for p in pad], dtype=np.int64)])
        kv_all = np.concatenate([kv_arr, np.array([p[1] for p in pad], dtype=np.int64)])
        return StepShape(q=q_all, kv=kv_all, sampled=sampled + sum(1 for p in pad if p[2])), useful

    def _advance(self, plan: BatchPlan) -> None:
        """Apply a finished step: tokens advance, stamps, completions."""
        now, seqs = self.env.now, self.seqs
        prefix = self.kv.prefix_caching
        done, gap_rids, gaps = [], [], []
        rows = plan.num_tokens.items()
        co = self._cohort
        if co is not None and plan.decode_cohort:
            k = len(co)
            if k:
                self._advance_cohort(co, now, done, plan.hold_finished)
            rows = islice(rows, k, None)
        joined = [] if co is not None else None
        for rid, q in rows:
            seq = seqs[rid]
            c = seq.num_computed + q
            seq.num_computed = c
            if prefix and c - q < seq.prompt_tokens:
                self.kv.register(seq)
            if c != seq.num_tokens:
                continue
            g = seq.num_generated + 1
            seq.num_generated = g
            seq.num_tokens = c + 1
            last = seq.last_token
            if last is None:
                seq.first_token = now
            else:
                gap = now - last
                gap_rids.append(rid)
                gaps.append(gap)
                if gap > seq.max_itl:
                    seq.max_itl = gap
            seq.last_token = now
            if g >= seq.output_tokens:
                seq.finished = True
                seq.status = COMPLETED
                seq.completion = now
                if not plan.hold_finished:
                    done.append(seq)
            elif joined is not None:
                joined.append(seq)  # a plain decode from now on
        if gaps:
            self.itl.extend(gap_rids, gaps)
        if done:
            for seq in done:
                seq.is_running = False
                self.running.remove(seq)
                self.kv.free(seq.rid)
                del seqs[seq.rid]
            self._outstanding -= len(done)
            if co is not None:
                self._others[:] = [s for s in self._others if s.is_running]
        if joined:
            co.join(joined)  # (any that hold extra KV stay outside)
            self._others[:] = [s for s in self._others if not s.in_cohort]

    def _advance_cohort(self, co: Cohort, now: float, done: list, hold: bool) -> None:
        """A step decoded the whole cohort: ``_advance``'s per-row updates, as columns."""
        gaps = now - co.last
        self.itl.extend(co.rid, gaps)
        np.maximum(co.mx, gaps, out=co.mx)
        co.last.fill(now)
        co.advance(1)
        if co.d >= co.min_end:
            if hold:
                raise PolicyError(f"{self.policy.name}: a decode_cohort plan holds finished sequences")
            for seq in co.finish():
                seq.finished = True
                seq.status = COMPLETED
                seq.completion = now
                done.append(seq)

    def _record(self, plan, shape, cost, useful_flops, start, preempted) -> None:
        sums = shape.sums
        if sums is not None:  # (no padding rows then)
            decode = sums[1]
            prefill = sums[0] - decode
            padding = 0
        else:
            useful_q = shape.q[: len(plan.num_tokens)]
            kv_ctx = shape.kv[: len(plan.num_tokens)]
            decode = int(((useful_q == 1) & (kv_ctx > 0)).sum())
            prefill = int(useful_q.sum()) - decode
            padding = int(shape.q.sum()) - prefill - decode
        self.steps.append(
            self.index, start, self.env.now, len(plan.num_tokens), shape.num_rows,
            prefill, decode, padding, cost.flops, useful_flops,
            cost.bytes, cost.compute_s, cost.memory_s, cost.network_s, cost.overhead_s,
            cost.out_of_range, self.kv.used_blocks, len(self.waiting), len(self.running), preempted,
        )


class Cluster:
    """Replicas behind a router, fed by the workload's arrivals."""

    def __init__(self, env: simpy.Environment, replicas: Sequence[Replica],
                 route: Callable[[Sequence[Replica], Seq], int], workload: Workload,
                 max_queue_len: int | None = None) -> None:
        self.env, self.replicas, self.route = env, list(replicas), route
        self.workload, self.max_queue_len = workload, max_queue_len
        self.requests: list[Seq] = []
        self.next_arrival = float(workload.arrival[0]) if len(workload) else math.inf
        for r in self.replicas:
            r._share = len(self.replicas)
            r._kv_observed = getattr(route, "reads_kv", True)
        env.process(self._arrivals())

    def sync(self) -> None:
        """Bring every request's attributes up to date (after ``env.run``: sim.cohort keeps
        running decodes' counters as columns until asked)."""
        for r in self.replicas:
            r.sync()

    def arrival_times(self, lo: float, hi: float) -> np.ndarray:
        """Arrival times in ``(lo, hi]`` (for runs that go through arrivals)."""
        a = self.workload.arrival
        return a[np.searchsorted(a, lo, "right"):np.searchsorted(a, hi, "right")]

    def _arrivals(self):
        env, w = self.env, self.workload
        arrival = w.arrival.tolist()
        prompt = w.prompt_tokens.tolist()
        output = w.output_tokens.tolist()
        hashes = w.prefix_hashes
        for rid in range(len(arrival)):
            t = arrival[rid]
            self.next_arrival = t
            if t > env.now:
                yield env.timeout(t - env.now)
            seq = Seq(rid, t, prompt[rid], output[rid], hashes[rid] if hashes is not None else None)
            self.requests.append(seq)
            replica = self.replicas[self.route(self.replicas, seq)]
            if self.max_queue_len is not None and len(replica.waiting) >= self.max_queue_len:
                seq.replica = replica.index
                replica.reject(seq, queue_full(self.max_queue_len))
                continue
            replica.enqueue(seq)
        self.next_arrival = math.inf
