"""Fast-forward: runs of steps priced and applied as one SimPy event.

The engine (sim.engine) asks its policy for one plan per step. When a plan
is steady (nothing can change the batch for a while), the steps that follow
are known without asking: a run of them is priced in one call to the cost
model, waited for as one timeout, and applied in bulk, with every number
computed by the same float operations in the same order as step by step, so
records are bit-identical (tests/test_fast_forward.py, tests/test_cohort.py).

Four kinds of run, each on a promise the policy makes (docs/writing-a-policy.md):

- ``BatchPlan.steady``: decode steps up to the first completion, the next
  arrival, a KV block that would not fit, or the horizon (:meth:`Runs._decode_run`);
- ``steady_through_completions``: the cohort's decodes on through completions
  while nothing waits (:meth:`Runs._cohort_run`);
- ``steady_chunks``: the cohort's decodes plus one prompt's prefill chunks
  (:meth:`Runs._chunk_run`);
- ``steady_dead_slots``: a padded batch's decodes on through completions to
  its end, finished rows billed as dead slots (:meth:`Runs._apply_dead_rows`).

:class:`Runs` is a mixin of :class:`sim.engine.Replica`: these methods read
and write the replica's state; the engine's loop stays the one described in
sim/engine.py. docs/design-notes.md ("Speed") says why each kind exists.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from heapq import heappush
from typing import NamedTuple

import numpy as np
import simpy
from simpy.core import NORMAL

from sim.cohort import Cohort
from sim.protocols import PolicyError
from sim.state import COMPLETED
from sim.types import BatchPlan, StepShape

__all__ = ["Runs"]


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


def _chunk_sums(n: int, tot: int, q: int, c: int) -> tuple:
    """The row sums (StepShape.sums) :func:`_cohort_shape` gives a step of ``n`` cohort rows
    over ``tot`` cached tokens in all plus one row of ``q`` tokens over ``c``: the same
    integers, without building the step's arrays."""
    if q == 1 and c > 0:  # (that row is a decode)
        return (n + q, n + 1, tot + n + c + 1, tot + q * c, n + q * q, tot + c)
    return (n + q, n, tot + n, tot + q * c, n + q * q, tot + c)


def _chunk_shape(kc: np.ndarray, ctx0: int, n: int, j: int, q: int, c: int, num_tokens: int) -> StepShape:
    """Step ``j`` of a chunk run as a StepShape: the cohort (contexts ``kc`` at step 0,
    summing to ``ctx0``) one token on per step, then the prompt's chunk of ``q`` over ``c``."""
    return _cohort_shape(kc + j, ctx0 + n * j, [q], [c], int(c + q == num_tokens))


def _by_finish(done: np.ndarray, ctx: np.ndarray) -> tuple[list, list, list]:
    """Rows ordered by the step they finish in (``done``), for :func:`_stretches`: the
    distinct finishing steps, the sorted steps, and prefix sums of the rows' contexts
    (``ctx``, cached tokens in step 0) in that order."""
    by_done = np.argsort(done, kind="stable")
    done_sorted = done[by_done].tolist()
    return sorted(set(done_sorted)), done_sorted, [0] + np.cumsum(ctx[by_done]).tolist()


def _stretches(count: int, cuts: list, done_sorted: list, ctx_before: list) -> list[tuple[int, int, int]]:
    """A run's first ``count`` steps as stretches with the same rows, ``(rows, context,
    steps)``: a row decodes through the step it finishes in, and ``context`` is the
    stretch's rows' cached tokens in its first step (``_by_finish`` gives the rest)."""
    segs, a, n, total = [], 0, len(done_sorted), ctx_before[-1]
    for c in cuts:
        if a >= count:
            break
        pos = bisect_left(done_sorted, a)  # rows finished before step a
        rows = n - pos
        segs.append((rows, total - ctx_before[pos] + rows * a, min(c, count - 1) - a + 1))
        a = c + 1
    return segs


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
    # through completions of a padded batch (steady_dead_slots): the step each row finishes in
    dead: np.ndarray | None = None


class Runs:
    """The fast-forward half of :class:`sim.engine.Replica` (a mixin: it uses the
    replica's attributes, which ``Replica.__init__`` sets)."""

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
        k, k_live = self._MAX_RUN, None  # (k_live: the first completion, in a run through them)
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
            most = 0
            for s in rows:
                # (with one pending token and one scheduled, every row is q = 1 over
                # kv = num_computed >= 1: it has generated, so num_tokens >= 2)
                if s.num_tokens - s.num_computed != 1 or s.last_token is None:
                    raise PolicyError(f"{self.policy.name}: a steady plan schedules rid {s.rid}, "
                                      "which is not decoding")
                left = s.output_tokens - s.num_generated  # the run ends with the first completion
                if left < k:
                    k = left
                if left > most:
                    most = left
            if self._dead_slots and plan.hold_finished and most > k:
                # ... or, in a padded batch whose finished rows are billed as dead slots,
                # goes on through completions to the batch's end (_apply_dead_run)
                k_live, k = k, min(self._MAX_RUN, most)
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
        if k_live is not None and int(first.min()) < k:  # (dead slots keep their KV: no such runs)
            k, k_live = min(k, k_live), None
            if k < 2:
                return None, costs.step(0)
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
        dead = None
        if k_live is not None and k_live < k:  # (some row finishes before the run's last step)
            dead = np.fromiter((s.output_tokens - s.num_generated - 1 for s in rows), dtype=np.int64,
                               count=len(rows))
            use_flops = self._live_flops(rows, dead, k)
        elif useful is not None:
            n_use = useful.num_rows
            use_flops = self.cost.decode_flops(n_use, int(useful.kv.sum()), k, n_use, useful.sampled)
        else:
            use_flops = costs.flops
        if through:
            self._run_arrivals = []
        return _Run(k, rows, grow, ends[:k], costs, use_flops, start, len(self.waiting), trunc,
                    dead=dead), None

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
        order = _by_finish(done, ctx)
        t_stop = self._price_until(start, t_a, horizon, trunc)
        # (a guess 20% long: pricing twice costs more than a few steps priced in vain; callgrind
        # per request at moderate load, x1.5 + 4 steps: +2.8%)
        guess = k if t_stop == math.inf else min(k, max(8, int((t_stop - start) / est * 1.2) + 2))
        while True:
            costs, ends = self._price_segments(_stretches(guess, *order), start)
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

    def _price_segments(self, segs: list, start: float):
        """Costs and end times of a cohort run's steps, given as stretches of steps with
        the same members (:func:`_stretches`; the cost model's ``price_decode_segments``)."""
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
        upto, top = self._finisher_gaps(co.rid, co.last, done, alive, ends, m)
        co.last[:] = ends[upto]
        np.maximum(co.mx, top, out=co.mx)
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
        self._add_busy(c.seconds[:m])
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
        price, price_sums = self.cost.price, self.cost.price_sums
        costs, sums, end, ends = [], [shape.sums], start, []
        t_stop = self._price_until(start, t_a, horizon, trunc)
        for j in range(k):
            if j:  # (step j's row sums, as the shape _grow_and_shape would give it has them)
                q, cj = qs[j], cs[j]
                sums.append(_chunk_sums(n, ctx0 + n * j, q, cj))
                cost = price_sums(n + 1, sums[j], n + int(cj + q == p.num_tokens))
                if cost is None:
                    cost = price(_chunk_shape(kc, ctx0, n, j, q, cj, p.num_tokens))
            else:
                cost = price(shape)
            if not cost.seconds > 0:
                return (None, costs[0]) if costs else (None, cost)
            end = start + cost.seconds if j == 0 else end + cost.seconds
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
        chunk = (rid, qs[:k], cs[:k], sums[:k], costs[:k], grow[:k], shape, kc.copy(), ctx0)
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
        rid, qs, cs, sums, costs, grow, shape0, kc, ctx0 = run.chunk
        m = k - 1
        p = self.seqs[rid]
        n = len(co)
        if run.truncatable and m:
            self._grant_chunks(rid, k, cs, qs, grow)
        last_plan = BatchPlan(num_tokens={**dict.fromkeys(co.rids, 1), rid: qs[m]}, decode_cohort=True)
        if not m:
            return last_plan, shape0, costs[0], costs[0].flops, run.start
        last_shape = _chunk_shape(kc, ctx0, n, m, qs[m], cs[m], p.num_tokens)
        used = self.kv.used_blocks - grow[m] + np.array(grow[:m])
        cs_m = costs[:m]
        sums = sums[:m]
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
        return last_plan, last_shape, costs[m], costs[m].flops, float(ends[m - 1])

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
        """Apply steps 0..k-2 of ``run`` in bulk; return step k-1's (plan, shape, cost, useful
        flops, start)."""
        k, rows, ends, c = run.k, run.rows, run.ends, run.costs
        m = k - 1  # steps applied here
        if not m:  # cut to its first step (_truncate): nothing to apply in bulk
            return plan, shape, c.step(0), float(run.use_flops[0]), run.start
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
        live, dead = n, run.dead
        if dead is not None:  # rows decode through the step they finish in, then bill as dead slots
            alive = dead[None, :] >= np.arange(m)[:, None]  # (step, row)
            live = alive.sum(axis=1)
        self.steps.extend(
            # every row is a one-token decode (_decode_run checked): n decode
            # tokens, and each padding row bills one token
            self.index, np.concatenate(([run.start], ends[: m - 1])), ends[:m], live, shape.num_rows,
            0, live, shape.num_rows - live, c.flops[:m], run.use_flops[:m], c.bytes[:m],
            c.compute_s[:m], c.memory_s[:m], c.network_s, c.overhead_s, c.out_of_range[:m],
            used, waiting, len(self.running), 0, count=m,
        )
        t_last = float(ends[m - 1])
        if co is not None:
            self._cohort_decoded(co, ends, m)
        elif dead is not None:
            plan = self._apply_dead_rows(plan, rows, dead, alive, ends, m)
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
        self._add_busy(c.seconds[:m])
        self.fast_forward_steps += m
        last_shape = StepShape(q=shape.q, kv=shape.kv + m, sampled=shape.sampled)
        return plan, last_shape, c.step(m), float(run.use_flops[m]), t_last

    # NOTE: runs through completions of a padded batch. A policy that says so
    # (steady_dead_slots: static and dynamic) bills a finished row of a batch
    # that holds its finished sequences as a dead slot, one token over the same
    # padded context as a live row, so the step's billed shape, and its price,
    # do not change when a row finishes. Such a run goes on to the batch's last
    # completion (through arrivals too: the batch ignores them); only the
    # records of useful work change, step by step, and the finishers are
    # stamped at their own steps when the run ends. Their KV stays held
    # (released with the batch), so nothing is freed or granted.
    def _live_flops(self, rows: list, dead: np.ndarray, k: int) -> np.ndarray:
        """Useful FLOPs of a dead-slot run's ``k`` steps: in each, the rows not finished
        before it decode one token over their own contexts (``decode_flops`` per stretch
        of steps with the same rows, as ``price`` of the useful shape step by step)."""
        c = np.fromiter((s.num_computed for s in rows), dtype=np.int64, count=len(rows))
        flops = self.cost.decode_flops
        return np.concatenate([flops(r, ctx, n, r, r) for r, ctx, n in _stretches(k, *_by_finish(dead, c))])

    def _apply_dead_rows(self, plan: BatchPlan, rows: list, dead: np.ndarray, alive: np.ndarray,
                         ends: np.ndarray, m: int) -> BatchPlan:
        """A dead-slot run's ``m`` bulk steps for its rows (``_advance`` as columns): gaps in
        step then row order, counters, last token, longest gap, and completion stamps of
        the rows that finished (held: they stay running). Returns the plan of the last step:
        one token for each row still live."""
        n = len(rows)
        upto, top = self._finisher_gaps(
            np.fromiter(plan.num_tokens, dtype=np.int64, count=n),
            np.fromiter((s.last_token for s in rows), dtype=np.float64, count=n), dead, alive, ends, m)
        live = {}
        for s, j, g, t in zip(rows, upto.tolist(), top.tolist(), ends[upto].tolist()):
            d = j + 1
            s.num_computed += d
            s.num_tokens += d
            s.num_generated += d
            s.last_token = t
            if g > s.max_itl:
                s.max_itl = g
            if s.num_generated >= s.output_tokens:
                s.finished = True
                s.status = COMPLETED
                s.completion = t
            else:
                live[s.rid] = 1
        return BatchPlan(num_tokens=live, hold_finished=True, steady=True,
                         steady_through_arrivals=plan.steady_through_arrivals)

    def _finisher_gaps(self, rids: np.ndarray, last: np.ndarray, done: np.ndarray, alive: np.ndarray,
                       ends: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
        """Record the inter-token gaps of ``m`` bulk steps in which each row decodes through
        the step it finishes in (``done``; ``alive``: the (step, row) mask of that), in step
        then row order. Returns each row's last bulk step and its longest gap in them."""
        n = len(rids)
        gap0 = ends[0] - last
        gaps = ends[1:m] - ends[: m - 1]
        grid = np.empty((m, n))
        grid[0] = gap0
        grid[1:] = gaps[:, None]
        self.itl.extend(np.broadcast_to(rids, (m, n))[alive], grid[alive])
        upto = np.minimum(done, m - 1)
        if m == 1:
            return upto, gap0
        peak = np.maximum.accumulate(gaps)
        return upto, np.maximum(gap0, np.where(upto >= 1, peak[np.maximum(upto - 1, 0)], -math.inf))

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

    def _add_busy(self, seconds) -> None:
        """Add steps' seconds (a list or an array) to the busy time one by one, the order
        step by step adds them. NOTE: numpy's cumsum (add.accumulate) adds in order, never
        pairwise, so its last element is that sum; cheaper than a loop past a few steps."""
        if len(seconds) > 16:
            self.busy_s = float(np.cumsum(np.concatenate(([self.busy_s], seconds)))[-1])
            return
        busy = self.busy_s
        for x in seconds.tolist() if isinstance(seconds, np.ndarray) else seconds:
            busy += x
        self.busy_s = busy
