"""The SimPy kernel: an arrival process, a router and one process per replica.

A replica's loop is the whole engine: ask the policy for a plan, apply its
admission part (release, reject, preempt, admit and grow KV), price the
step's shape, ``yield env.timeout(seconds)``, then apply the result (tokens
advance, first tokens and completions are stamped, KV is freed). There is no
policy logic here; one SimPy event per step.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import deque
from heapq import heappush
from itertools import islice
from typing import Callable, NamedTuple, Sequence

import numpy as np
import simpy
from simpy.core import NORMAL

from sim.cohort import Cohort
from sim.kv import PagedKVCache
from sim.protocols import CostModel, Policy
from sim.records import ItlLog, StepLog
from sim.state import COMPLETED, REJECTED, Seq
from sim.types import BatchPlan, StepShape, Workload

__all__ = ["Replica", "Cluster", "PolicyError"]


def _timeout_at(env: simpy.Environment, when: float) -> simpy.Event:
    """A timeout that fires at exactly ``when``.

    ``env.timeout(when - env.now)`` lands on ``now + (when - now)``, which
    float rounding can put one ulp off ``when`` (and some ``when`` no delay
    reaches). A run's end must be the time the steps would have reached one
    by one, so when no delay lands exactly, the event is queued at ``when``
    the way ``Environment.schedule`` queues a timeout (simpy 4 internals).
    """
    now = env.now
    delay = when - now
    if now + delay == when:
        return env.timeout(delay)
    ev = simpy.Event(env)
    ev._ok, ev._value = True, None
    heappush(env._queue, (when, NORMAL, next(env._eid), ev))
    return ev


def _cohort_shape(kc: np.ndarray, tot: int, qo: list, ctx: list, sampled: int) -> StepShape:
    """A step's shape: the cohort's rows (one token each over contexts ``kc``, which sum
    to ``tot``), then other rows (``qo`` tokens over ``ctx``, ``sampled`` of them
    sampling), with the row sums (StepShape.sums) from those numbers, so the cost model
    and the step record skip their reductions."""
    k = len(kc)
    T, nd, cd, qkv, qq = k, k, tot + k, tot, k
    for q, c in zip(qo, ctx):
        T += q
        qkv += q * c
        qq += q * q
        tot += c
        if q == 1 and c > 0:
            nd += 1
            cd += c + 1
    q_arr = np.ones(k + len(qo), dtype=np.int64)
    if qo:
        q_arr[k:] = qo
    kv_arr = np.concatenate((kc, np.array(ctx, dtype=np.int64))) if ctx else kc
    return StepShape(q=q_arr, kv=kv_arr, sampled=sampled + k, sums=(T, nd, cd, qkv, qq, tot))


class _Run(NamedTuple):
    """A planned run of k steady decode steps (see :meth:`Replica._decode_run`)."""

    k: int
    rows: list
    grow: np.ndarray | None  # cumulative extra KV blocks through each step (None: none)
    ends: np.ndarray  # when each step ends; the run's event fires at ends[-1]
    costs: object  # the cost model's DecodeRun of steps 0..
    use_flops: np.ndarray  # useful FLOPs of steps 0..
    start: float
    waiting: int  # queue length when the run started
    truncatable: bool  # an arrival routed here cuts the run (KV granted at its end)
    done: np.ndarray | None = None  # through completions: the step each member completes in
    # through completions: (blocks used after each step, blocks added before each step from
    # step 1 on), both relative to those used when the run began
    used: tuple[np.ndarray, np.ndarray] | None = None
    chunk: tuple | None = None  # a run of prefill chunks (_chunk_run): its per-step rows and KV


class PolicyError(RuntimeError):
    """A plan broke the engine contract (a bug in the policy, not bad input)."""


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


class Replica:
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
            return self.reject(seq, f"prompt+output {total} > max_model_len {self.max_model_len}")
        if self.kv.blocks_needed(seq, total) > self.kv.total_blocks:
            return self.reject(seq, f"prompt+output {total} tokens > KV capacity "
                                     f"{self.kv.total_blocks * self.kv.block_size}")
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
                    shape, cost, useful_flops, start = self._apply_run(run, plan, shape)
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
        self.itl.extend(co.rid, gaps.tolist())
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

    # -- fast-forward ---------------------------------------------------------
    # NOTE: a run of k steady steps is one SimPy timeout. Steps 0..k-2 are
    # priced with cost.price_decodes and applied in bulk (numpy); step k-1
    # goes through _advance/_record like any step, so completions, stamps and
    # frees have one implementation. A run never spans an event that could
    # change the plan: it ends at the first completion, at the step during
    # which the next request arrives (that step's plan was made before the
    # arrival, as without fast-forward), before the first step whose KV
    # growth would not fit, and before the horizon. Every number is computed
    # with the same float operations in the same order as step by step, so
    # records are bit-identical (tests/test_fast_forward.py).
    _MAX_RUN = 4096

    def _decode_run(self, plan: BatchPlan, shape: StepShape, useful: StepShape | None,
                    start: float):
        """Plan a run of steady decode steps starting with this plan's step.

        Returns ``(run, cost)``: the run or None (step by step), and the
        plan's own step's cost when the run's pricing produced it (None:
        price it with :meth:`price`).
        """
        n_rows = shape.num_rows
        if (plan.padding or plan.context) and (shape.sampled != n_rows or int(shape.q.sum()) != n_rows
                                               or int(shape.kv.min()) < 1):
            return None, None
        # the step during which the next request arrives ends the run (its plan
        # was made before the arrival); steps ending at the horizon never finish
        through = plan.steady_through_arrivals and self._arrival_times is not None
        trunc = not through and self._truncatable()
        horizon = self._horizon
        t_a = math.inf if through or trunc else self._next_arrival()
        t_stop = min(t_a, horizon)
        # NOTE: the last decode step's duration guesses how many steps fit;
        # a wrong guess costs time, never exactness (the run is cut below)
        est, cost0 = self._step_s, None
        if est is None:  # (the first steady step: priced here, and returned if no run follows)
            cost0 = self.price(plan, shape)
            est = self._step_s = cost0.seconds
        if not est > 0 or t_stop - start < 2 * est:
            return None, cost0
        co = self._cohort if plan.decode_cohort else None
        k = self._MAX_RUN
        if co is not None:  # the cohort's columns (sim.cohort); its members' Seqs lag
            if len(co) != n_rows:
                return None, cost0
            if (self._through_completions and not through and hasattr(self.cost, "price_decode_segments")
                    and not self.waiting and len(self.running) == n_rows and co.pending == 1):
                return self._cohort_run(start, t_a, horizon, est, cost0, trunc)
            rows = None
            k = min(k, co.min_end - co.d)
        else:
            seqs = self.seqs
            rows = [seqs[rid] for rid in plan.num_tokens]
            for s in rows:
                # (with one pending token and one scheduled, every row is q = 1 over
                # kv = num_computed >= 1: it has generated, so num_tokens >= 2)
                if s.num_tokens - s.num_computed != 1 or s.last_token is None:
                    raise PolicyError(f"{self.policy.name}: a steady plan schedules rid {s.rid}, "
                                      "which is not decoding")
                left = s.output_tokens - s.num_generated  # the run ends with the first completion
                if left < k:
                    k = left
        if k < 2:
            return None, cost0
        t_price = self._price_until(start, t_a, horizon, trunc)
        # NOTE: price only about as many steps as fit before t_price (doubled
        # until the guess covers it); step 0 is this plan's step (price_decodes
        # equals price bit for bit), so the run's records are plain slices
        guess = k if t_price == math.inf else min(k, max(8, int((t_price - start) / est * 1.25) + 2))
        ctx0, price_decodes = int(shape.kv.sum()), self.cost.price_decodes
        while True:
            costs = price_decodes(n_rows, ctx0, guess, n_rows, n_rows)
            secs = costs.seconds
            s0 = secs[0]
            secs[0] = start + s0  # SimPy's first end: now + delay
            ends = np.cumsum(secs)
            secs[0] = s0
            if guess == k or ends[-1] >= t_price:
                break
            guess = min(k, 2 * guess)
        self._step_s = float(s0)
        if not s0 > 0:
            return None, costs.step(0)
        k = self._cut(ends, guess, start, t_a, horizon, through or trunc)
        if k < 2:
            return None, costs.step(0)
        # KV: step j (j >= 1) needs ceil((c + j + 1) / bs) blocks per row
        kv, bs = self.kv, self.kv.block_size
        if co is not None:  # (members hold exactly their tokens' blocks, step 0's granted)
            first = -(co.ctx + 1) % bs + 1
        else:
            n = len(rows)
            held_of = kv._held
            c = np.fromiter((s.num_computed for s in rows), dtype=np.int64, count=n)
            held = np.fromiter((held_of[s.rid] for s in rows), dtype=np.int64, count=n)
            first = held * bs - c  # first step at which a row outgrows what it holds (>= 1)
        grow = None
        if int(first.min()) < k:
            if through:
                # NOTE: a run's KV is granted when it starts; a router looking
                # at KV during it would see growth not yet due. Padded batches
                # reserve up front and never get here.
                return None, costs.step(0)
            if int(first.max()) <= bs:
                # every row crosses a block boundary at first, first + bs, ...:
                # step j >= 1 grows the rows whose first is (j - 1) % bs + 1
                per = np.bincount(first, minlength=bs + 1)[1:]
                grow = np.zeros(k, dtype=np.int64)
                grow[1:] = per[np.arange(k - 1) % bs]
                np.cumsum(grow, out=grow)
            else:
                late = first < k
                f = first[late]
                counts = (k - 1 - f) // bs + 1
                pos = np.repeat(f, counts) + bs * (np.arange(int(counts.sum()))
                                                   - np.repeat(np.cumsum(counts) - counts, counts))
                grow = np.cumsum(np.bincount(pos, minlength=k)[:k])
            fits = int(np.searchsorted(grow, kv.free_blocks, "right"))  # steps 0..fits-1 fit
            if fits < k:
                k = fits
                if k < 2:
                    return None, costs.step(0)
            grow = grow[:k]
            if not grow[k - 1]:
                grow = None
        if co is not None:
            if not trunc:  # (as below)
                co.grant(k, int(grow[k - 1]) if grow is not None else 0)
        elif grow is not None and not trunc:
            # grant the whole run's KV now (step k-1 holds c + k tokens): without
            # fast-forward, a request arriving during the last step would see it
            # all granted too
            self._grant(rows, k)
        if useful is not None:
            n_use = useful.num_rows
            use_flops = self.cost.decode_flops(n_use, int(useful.kv.sum()), k, n_use, useful.sampled)
        else:
            use_flops = costs.flops
        if through:
            self._run_arrivals = []
        return _Run(k, rows, grow, ends[:k], costs, use_flops, start, len(self.waiting), trunc), None

    # NOTE: runs through completions. While nothing waits (an arrival ends a
    # run) and every running sequence is in the cohort, a policy that says so
    # (steady_through_completions) plans the same decodes after a completion,
    # minus the finished rows. Such a run goes on to the next arrival: its
    # steps are priced in segments of equal rows, KV grows only for members
    # still running and a finished member's blocks are free for the steps
    # after it; the completions are applied in order when the run ends. The
    # last step goes through _advance/_record like any step, with a plan of
    # the rows left.
    def _cohort_run(self, start: float, t_a: float, horizon: float, est: float, cost0, trunc: bool):
        """:meth:`_decode_run` for a cohort whose members may finish during the run."""
        co, kv = self._cohort, self.kv
        bs = kv.block_size
        ctx = co.ctx  # each member's cached tokens in step 0
        done = co.ints[3] - co.d - 1  # the run step in which each member generates its last token
        k = min(self._MAX_RUN, int(done.max()) + 1)
        if k < 2:
            return None, cost0
        by_done = np.argsort(done, kind="stable")
        done_sorted = done[by_done].tolist()
        ctx_before = [0] + np.cumsum(ctx[by_done]).tolist()  # context of the members finishing first
        cuts = sorted(set(done_sorted))
        t_stop = self._price_until(start, t_a, horizon, trunc)
        # (a guess 20% long: pricing twice costs more than a few steps priced in vain; callgrind
        # per request at moderate load, x1.5 + 4 steps: +2.8%)
        guess = k if t_stop == math.inf else min(k, max(8, int((t_stop - start) / est * 1.2) + 2))
        while True:
            costs, ends = self._price_segments(guess, cuts, done_sorted, ctx_before, start)
            if guess == k or ends[-1] >= t_stop:
                break
            guess = min(k, 2 * guess)
        s0 = costs.seconds[0]
        self._step_s = float(s0)
        if not s0 > 0:
            return None, costs.step(0)
        k = self._cut(ends, guess, start, t_a, horizon, trunc)
        if k < 2:
            return None, costs.step(0)
        # KV: member i needs a block at steps first_i, first_i + bs, ... while it runs
        # (through done_i); a member that finished frees its blocks for the steps after
        last = np.minimum(done, k - 1)
        first = -(ctx + 1) % bs + 1
        cnt = np.maximum((last - first) // bs + 1, 0)
        grow = np.zeros(k, dtype=np.int64)
        total = int(cnt.sum())
        if total:
            f, c = first[cnt > 0], cnt[cnt > 0]
            pos = np.repeat(f, c) + bs * (np.arange(total) - np.repeat(np.cumsum(c) - c, c))
            grow += np.bincount(pos, minlength=k)[:k]
        np.cumsum(grow, out=grow)
        frees = np.zeros(k, dtype=np.int64)
        fin = done < k - 1
        np.add.at(frees, done[fin], -(-(ctx[fin] + done[fin] + 1) // bs))
        np.cumsum(frees, out=frees)
        need = grow[1:] - frees[:-1]  # blocks step j >= 1 adds to those used when the run began
        over = np.flatnonzero(need > kv.free_blocks)
        if len(over):
            k = int(over[0]) + 1  # (step over[0] + 1 would not fit: one by one, it would preempt)
            if k < 2:
                return None, costs.step(0)
        if not trunc:  # (a run an arrival may cut is granted when it ends: _apply_cohort_run)
            co.grant(k, int(need[k - 2]), kv.used_blocks + int(need[: k - 1].max()))
        fin = done < k - 1
        if fin.any():  # (outstanding counts them done from their steps' ends)
            self._fin_ends = np.sort(ends[done[fin]])
        run = _Run(k, None, None, ends[:k], costs, costs.flops, start, 0, trunc, done,
                   (grow[: k - 1] - frees[: k - 1], need[: k - 1]))
        return run, None

    def _truncatable(self) -> bool:
        """Whether runs go on through arrivals routed to other replicas, cut by one
        routed here (_truncate): several replicas, and a router blind to KV."""
        return self._share > 1 and not self._kv_observed and self._arrival_times is not None

    def _price_until(self, start: float, t_a: float, horizon: float, trunc: bool) -> float:
        """Until when a run starting at ``start`` is worth pricing: the next arrival, or
        (``trunc``: arrivals routed elsewhere do not cut it) about as many arrivals as
        there are replicas, and never past the horizon."""
        if trunc:
            ahead = self._arrival_times(start, math.inf)
            return min(float(ahead[self._share - 1]) if len(ahead) >= self._share else math.inf, horizon)
        return min(t_a, horizon)

    def _cut(self, ends: np.ndarray, k: int, start: float, t_a: float, horizon: float,
             through_arrivals: bool) -> int:
        """How many of a run's ``k`` priced steps (ending at ``ends``) it may take: up to
        the step during which the next arrival ``t_a`` comes, before the horizon, and,
        for a run that goes on through arrivals, before any step ending exactly at one."""
        if t_a < math.inf:
            j = int(np.searchsorted(ends, t_a, "left"))
            if j < k:  # ending exactly at the arrival: stop a step earlier, as scheduled one by one
                k = j if (ends[j] == t_a and j >= 1) else j + 1
        if horizon < math.inf:
            k = min(k, int(np.searchsorted(ends, horizon, "left")))
        if through_arrivals and k >= 2:
            # NOTE: an arrival at exactly a step's end is processed before or
            # after that step's event depending on when each was scheduled;
            # a run cannot reproduce that, so it stops before such a step
            arr = self._arrival_times(start, float(ends[k - 1]))
            if len(arr):
                at = np.searchsorted(ends[:k], arr, "left")
                hit = at[ends[np.minimum(at, k - 1)] == arr]
                if len(hit):
                    k = min(k, int(hit.min()))
        return k

    def _price_segments(self, count: int, cuts: list, done_sorted: list, ctx_before: list, start: float):
        """Costs and end times of a cohort run's first ``count`` steps, in stretches of
        steps with the same members (the cost model's ``price_decode_segments``)."""
        segs, a, n, total = [], 0, len(done_sorted), ctx_before[-1]
        for c in cuts:
            if a >= count:
                break
            pos = bisect_left(done_sorted, a)  # members finished before step a
            rows = n - pos
            segs.append((rows, total - ctx_before[pos] + rows * a, min(c, count - 1) - a + 1))
            a = c + 1
        costs = self.cost.price_decode_segments(segs)
        secs = costs.seconds
        s0 = secs[0]
        secs[0] = start + s0  # SimPy's first end: now + delay
        ends = np.cumsum(secs)
        secs[0] = s0
        return costs, ends

    def _apply_cohort_run(self, run: "_Run"):
        """:meth:`_apply_run` for a run through completions: steps 0..k-2 in bulk, the
        members that finished in them completed in order. Returns the last step's plan
        (the members left), shape, cost, useful FLOPs and start."""
        co, k, ends, c = self._cohort, run.k, run.ends, run.costs
        m = k - 1
        done = run.done
        n = len(done)
        self._fin_ends = None
        if not m:  # cut to its first step (_truncate): nothing to apply in bulk, nobody finished
            return (*self._cohort_step(), c.step(0), float(run.use_flops[0]), run.start)
        # KV: blocks used after each step and before each step's growth, relative to the run's start
        delta, need = run.used
        used0 = self.kv.used_blocks
        if run.truncatable:  # granted now, through the step an arrival may have cut it at
            self._cohort.grant(k, int(need[m - 1]), used0 + int(need[:m].max()))
        else:
            used0 -= int(need[m - 1])
        steps = np.arange(m)
        alive = done[None, :] >= steps[:, None]  # (step, member): still running in that step
        rows = alive.sum(axis=1)
        fin = done < m  # (members that finished in the bulk steps)
        finished = np.bincount(done[fin], minlength=m)[:m] if fin.any() else 0
        net = c.network_s[:m] if isinstance(c.network_s, np.ndarray) else c.network_s
        over = c.overhead_s[:m] if isinstance(c.overhead_s, np.ndarray) else c.overhead_s
        self.steps.extend(
            self.index, np.concatenate(([run.start], ends[: m - 1])), ends[:m], rows, rows,
            0, rows, 0, c.flops[:m], run.use_flops[:m], c.bytes[:m],
            c.compute_s[:m], c.memory_s[:m], net, over, c.out_of_range[:m],
            delta[:m] + used0, 0, rows - finished, 0, count=m,
        )
        # inter-token gaps, step by step, members in cohort order
        gap0 = ends[0] - co.last
        gaps = ends[1:m] - ends[: m - 1]
        grid = np.empty((m, n))
        grid[0] = gap0
        grid[1:] = gaps[:, None]
        self.itl.extend(np.broadcast_to(co.rid, (m, n))[alive], grid[alive])
        # each member's last token and longest gap, through the step it finished in
        upto = np.minimum(done, m - 1)
        co.last[:] = ends[upto]
        top = np.maximum(co.mx, gap0)
        if m > 1:
            peak = np.maximum.accumulate(gaps)
            np.maximum(top, np.where(upto >= 1, peak[np.maximum(upto - 1, 0)], -math.inf), out=top)
        co.mx[:] = top
        # the members that finished: out of the cohort at once, then stamped as of
        # the step each finished in (its counters: every output token generated)
        if fin.any():
            seqs, held, running = self.seqs, self.kv._held, self.running
            steps_done = done[fin].tolist()
            out = co.remove(fin)
            for seq, j in zip(out, steps_done):
                del held[seq.rid]  # (its blocks were counted free when the run was granted)
                got = seq.num_computed + j + 1  # (synced as of the run's first step)
                seq.num_computed, seq.num_tokens, seq.num_generated = got, got + 1, seq.num_generated + j + 1
                seq.finished = True
                seq.status = COMPLETED
                seq.completion = float(ends[j])
                seq.is_running = False
                running.remove(seq)
                del seqs[seq.rid]
            self._outstanding -= len(out)
        co.advance(m)
        self._add_busy(c.seconds[:m].tolist())
        self.fast_forward_steps += m
        return (*self._cohort_step(), c.step(m), float(run.use_flops[m]), float(ends[m - 1]))

    def _cohort_step(self) -> tuple[BatchPlan, StepShape]:
        """The plan and shape of a step that decodes the cohort and nothing else."""
        co = self._cohort
        k = len(co)
        plan = BatchPlan(num_tokens=dict.fromkeys(co.rids, 1), steady=True, decode_cohort=True)
        return plan, StepShape(q=np.ones(k, dtype=np.int64), kv=co.ctx, sampled=k)

    # NOTE: runs of prefill chunks. While nothing waits and the running
    # sequences are the cohort and one partial prefill, a policy that says so
    # (steady_chunks: chunked prefill) plans the cohort's decodes plus the
    # prefill's next chunk, min(pending, the budget the decodes leave), while
    # its KV fits. The first chunk shows that budget (a chunk smaller than the
    # pending tokens filled it). Such a run goes on until the prefill's last
    # chunk, the first completion, the next arrival or the horizon; each step
    # is priced by price() with the row sums _grow_and_shape would give it.
    def _chunk_run(self, plan: BatchPlan, shape: StepShape, start: float):
        """A run of cohort-plus-chunk steps starting with this plan's step, or ``(None, cost)``."""
        co, kv, seqs = self._cohort, self.kv, self.seqs
        n = len(co)
        if len(plan.num_tokens) != n + 1 or len(self.running) != n + 1 or not n:
            return None, None
        rid, q0 = next(reversed(plan.num_tokens.items()))
        p = seqs[rid]
        c0 = p.num_computed  # (before step 0)
        budget = q0  # the budget the decodes left: the first chunk filled it
        left = p.num_tokens - c0 - q0  # pending after step 0
        if left <= 0 or q0 < 1 or p.num_generated:  # (step 0 is the last chunk, or not a prompt)
            return None, None
        k = min(self._MAX_RUN, 1 + -(-left // budget), co.min_end - co.d)
        horizon = self._horizon
        trunc = self._truncatable()
        t_a = math.inf if trunc else self._next_arrival()
        if k < 2:
            return None, None
        # the steps' rows: chunk j of the prefill over its computed tokens, the cohort one token on
        qs, cs, c = [q0], [c0], c0 + q0
        for _ in range(k - 1):
            q = min(p.num_tokens - c, budget)
            qs.append(q)
            cs.append(c)
            c += q
        kc = co.ctx
        ctx0 = int(kc.sum())
        price = self.cost.price
        costs, shapes, end, ends = [], [], start, []
        t_stop = self._price_until(start, t_a, horizon, trunc)
        for j in range(k):
            if j:  # (the shape _grow_and_shape would give step j)
                q, cj = qs[j], cs[j]
                sh = _cohort_shape(kc + j, ctx0 + n * j, [q], [cj], int(cj + q == p.num_tokens))
            else:
                sh = shape
            cost = price(sh)
            if not cost.seconds > 0:
                return (None, costs[0]) if costs else (None, cost)
            end = start + cost.seconds if j == 0 else end + cost.seconds
            shapes.append(sh)
            costs.append(cost)
            ends.append(end)
            if end >= t_stop:
                break
        ends = np.array(ends)
        k = self._cut(ends, len(ends), start, t_a, horizon, trunc)
        if k < 2:
            return None, costs[0]
        # KV: the cohort's block phases and the prefill's chunks, step by step (nothing frees)
        bs, counts = co.bs, co.counts
        held = kv._held.get(rid, 0)
        grow = [0]
        for j in range(1, k):
            want = -(-(cs[j] + qs[j]) // bs)
            g = counts[(co.d + j) % bs] + (want - held if want > held else 0)
            held = max(held, want)
            grow.append(grow[-1] + g)
        fits = bisect_right(grow, kv.free_blocks)  # (steps 0..fits-1 fit: one by one, the next would not)
        k = min(k, fits)
        if k < 2:
            return None, costs[0]
        if not trunc:
            self._grant_chunks(rid, k, cs, qs, grow)
        chunk = (rid, qs[:k], cs[:k], shapes[:k], costs[:k], grow[:k])
        return _Run(k, None, None, ends[:k], None, None, start, 0, trunc, chunk=chunk), None

    def _grant_chunks(self, rid: int, k: int, cs: list, qs: list, grow: list) -> None:
        """A chunk run's KV through its step k-1: the cohort's growth, then the prefill's."""
        co, kv = self._cohort, self.kv
        p_growth = -(-(cs[k - 1] + qs[k - 1]) // kv.block_size)
        co.grant(k, grow[k - 1] - max(p_growth - kv._held.get(rid, 0), 0))
        kv.grow(rid, cs[k - 1] + qs[k - 1])

    def _apply_chunk_run(self, run: "_Run", plan: BatchPlan):
        """Apply steps 0..k-2 of a chunk run in bulk; return step k-1's plan, shape, cost,
        useful FLOPs and start."""
        co, k, ends = self._cohort, run.k, run.ends
        rid, qs, cs, shapes, costs, grow = run.chunk
        m = k - 1
        p = self.seqs[rid]
        n = len(co)
        if run.truncatable and m:
            self._grant_chunks(rid, k, cs, qs, grow)
        last_plan = BatchPlan(num_tokens={**dict.fromkeys(co.rids, 1), rid: qs[m]}, decode_cohort=True)
        if not m:
            return last_plan, shapes[0], costs[0], costs[0].flops, run.start
        used = self.kv.used_blocks - grow[m] + np.array(grow[:m])
        cs_m = costs[:m]
        sums = [sh.sums for sh in shapes[:m]]
        decode = np.array([x[1] for x in sums])
        prefill = np.array([x[0] for x in sums]) - decode
        self.steps.extend(
            self.index, np.concatenate(([run.start], ends[: m - 1])), ends[:m], n + 1, n + 1,
            prefill, decode, 0, np.array([x.flops for x in cs_m]), np.array([x.flops for x in cs_m]),
            np.array([x.bytes for x in cs_m]), np.array([x.compute_s for x in cs_m]),
            np.array([x.memory_s for x in cs_m]), np.array([x.network_s for x in cs_m]),
            np.array([x.overhead_s for x in cs_m]), np.array([x.out_of_range for x in cs_m]),
            used, 0, n + 1, 0, count=m,
        )
        self._cohort_decoded(co, ends, m)
        p.num_computed = cs[m]
        self._add_busy([x.seconds for x in cs_m])
        self.fast_forward_steps += m
        return last_plan, shapes[m], costs[m], costs[m].flops, float(ends[m - 1])

    def _truncate(self) -> None:
        """A request was routed here during a run: end the run with the step in flight.

        Step by step, the plan after that step would be the first to see the
        request. The run planned no step ending exactly at an arrival, so the
        step in flight is the first ending after now. The process stops
        waiting for the run's event (left to fire unheard) and waits for the
        new end instead (simpy 4 internals, as _timeout_at).
        """
        run, env = self._run, self.env
        j = int(np.searchsorted(run.ends, env.now, "right"))
        if j + 1 >= run.k:
            return
        ev = _timeout_at(env, float(run.ends[j]))
        resume = self.process._resume
        self._run_event.callbacks.remove(resume)
        ev.callbacks.append(resume)
        self.process._target = ev
        self._run_event = ev
        self._run = run._replace(k=j + 1, ends=run.ends[: j + 1],
                                 grow=None if run.grow is None else run.grow[: j + 1])

    def _grant(self, rows: list, k: int) -> None:
        """Grant a run of k steps its KV through its last step (rows not yet
        advanced: step k-1 holds num_computed + k tokens)."""
        kv = self.kv
        for s in rows:
            kv.grow(s.rid, s.num_computed + k)

    def _apply_run(self, run: "_Run", plan: BatchPlan, shape: StepShape):
        """Apply steps 0..k-2 of ``run`` in bulk; return step k-1's (shape, cost, useful flops, start)."""
        k, rows, ends, c = run.k, run.rows, run.ends, run.costs
        m = k - 1  # steps applied here
        if not m:  # cut to its first step (_truncate): nothing to apply in bulk
            return shape, c.step(0), float(run.use_flops[0]), run.start
        co = self._cohort if rows is None else None
        n = len(rows) if co is None else len(co)
        # NOTE: KV for the whole run was granted when it started (_decode_run),
        # or is now for a run that arrivals could cut.
        if run.truncatable:
            if co is not None:
                co.grant(k, int(run.grow[k - 1]) if run.grow is not None else 0)
            elif run.grow is not None:
                self._grant(run.rows, run.k)
        used = self.kv.used_blocks
        if run.grow is not None:
            used = used - int(run.grow[m]) + run.grow[:m]
        waiting = run.waiting
        if self._run_arrivals is not None:  # requests queued during a run through arrivals
            if self._run_arrivals:
                waiting = waiting + np.searchsorted(np.array(self._run_arrivals), ends[:m], "right")
            self._run_arrivals = None
        self.steps.extend(
            # every row is a one-token decode (_decode_run checked): n decode
            # tokens, and each padding row bills one token
            self.index, np.concatenate(([run.start], ends[: m - 1])), ends[:m], n, shape.num_rows,
            0, n, shape.num_rows - n, c.flops[:m], run.use_flops[:m], c.bytes[:m],
            c.compute_s[:m], c.memory_s[:m], c.network_s, c.overhead_s, c.out_of_range[:m],
            used, waiting, len(self.running), 0, count=m,
        )
        t_last = float(ends[m - 1])
        if co is not None:
            self._cohort_decoded(co, ends, m)
        else:
            gap0, top = self._run_gaps(np.fromiter(plan.num_tokens, dtype=np.int64, count=n),
                                       np.fromiter((s.last_token for s in rows), dtype=np.float64, count=n),
                                       ends, m)
            for s, g in zip(rows, gap0.tolist()):
                s.num_computed += m
                s.num_tokens += m
                s.num_generated += m
                s.last_token = t_last
                if top > g:
                    g = top
                if g > s.max_itl:
                    s.max_itl = g
        self._add_busy(c.seconds[:m].tolist())
        self.fast_forward_steps += m
        last_shape = StepShape(q=shape.q, kv=shape.kv + m, sampled=shape.sampled)
        return last_shape, c.step(m), float(run.use_flops[m]), t_last

    def _run_gaps(self, rids: np.ndarray, last: np.ndarray, ends: np.ndarray, m: int):
        """Record the inter-token gaps of ``m`` bulk steps in which every row decodes:
        step 0's from each row's last token, then one per step for all. Returns step 0's
        gaps and the longest later one."""
        gap0 = ends[0] - last
        gaps = ends[1:m] - ends[: m - 1]
        self.itl.extend(np.tile(rids, m), np.concatenate((gap0, np.repeat(gaps, len(rids)))))
        return gap0, (float(gaps.max()) if len(gaps) else -math.inf)

    def _cohort_decoded(self, co: Cohort, ends: np.ndarray, m: int) -> None:
        """``m`` bulk steps decoded every member: gaps, counters, last token, longest gap."""
        gap0, top = self._run_gaps(co.rid, co.last, ends, m)
        co.advance(m)
        co.last.fill(float(ends[m - 1]))
        np.maximum(co.mx, np.maximum(gap0, top), out=co.mx)

    def _add_busy(self, seconds: list) -> None:
        """Add steps' seconds to the busy time one by one (the order step by step adds them)."""
        busy = self.busy_s
        for x in seconds:
            busy += x
        self.busy_s = busy

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
                replica.reject(seq, f"queue full ({self.max_queue_len} waiting)")
                continue
            replica.enqueue(seq)
        self.next_arrival = math.inf
