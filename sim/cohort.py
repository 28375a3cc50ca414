"""The decode cohort: a replica's running plain decodes as numpy columns.

At high load a replica runs hundreds of sequences, and most steps decode
every one of them by one token. Done one :class:`~sim.state.Seq` at a time,
that step costs a handful of Python attribute updates per sequence in the
policy, the KV grant and the advance (~1-3 us each, ~0.3-0.8 ms a step).
The cohort keeps those sequences' counters in arrays instead, so a step that
decodes all of them is a few numpy operations whatever their number.

- Members are running sequences that have generated a token and have one
  pending (plain decodes), in admission order (the order of ``running``).
- While a member is in the cohort its ``Seq`` attributes ``num_computed``,
  ``num_tokens``, ``num_generated``, ``last_token`` and ``max_itl`` lag
  behind the columns (``stale``); :meth:`Cohort.sync` writes them back. The
  engine syncs before anyone else reads them: a policy reading
  ``view.running``, the end of a run, a member leaving.
- A plan decodes the cohort when it says so (``BatchPlan.decode_cohort``:
  its first ``len(cohort)`` rows are the members, one token each, in cohort
  order); :class:`policies.step.StepBuilder` plans that way. A plan that
  names members any other way (a preemption, a partial decode) dissolves
  the cohort first: every member is synced and handled one by one, as
  without a cohort, and decodes rejoin after the step.

Exact: every value is computed with the same integer and float operations
as the per-sequence code, so records are byte-identical with and without
(tests/test_cohort.py).
"""

from __future__ import annotations

import numpy as np

from sim.kv import KVExhausted, PagedKVCache
from sim.state import Seq

__all__ = ["Cohort"]

_I8 = np.int64
_RID, _ORDER, _C0, _END = range(4)  # rows of Cohort.ints
_LAST, _MX = range(2)  # rows of Cohort.floats


class Cohort:
    """Running plain decodes as columns, in admission order.

    A member's context is ``c0 + d`` (``d``: cohort steps so far) and it
    completes when ``d`` reaches its ``end``. It holds exactly the blocks of
    its granted tokens, ``ceil((c0 + d + pending) / block_size)``, so it
    needs a new block in the step where ``c0 + d`` is a multiple of the
    block size: ``counts[d % block_size]`` members (its *phase*). Blocks
    are counted in the cache's ``used`` as they are granted; members'
    ``blocks_held`` entries are written back with their attributes.
    """

    __slots__ = ("kv", "bs", "seqs", "rids", "ints", "floats", "d", "counts", "min_end", "pending", "stale")

    def __init__(self, kv: PagedKVCache) -> None:
        self.kv, self.bs = kv, kv.block_size
        self.seqs: list[Seq] = []
        self.rids: list[int] = []  # (a policy builds its plan's rows from this list)
        # NOTE: two 2-D arrays, not six columns: a join or a removal is then two numpy calls
        self.ints = np.empty((4, 0), dtype=_I8)  # rid, admission order, c0, end
        self.floats = np.empty((2, 0))  # last token time, max inter-token gap
        self.d = 0  # cohort steps so far
        self.counts = [0] * self.bs  # members by phase: (-c0) % block_size
        self.min_end = _NEVER
        self.pending = 0  # steps granted and not yet advanced (the step in flight, a run)
        self.stale = False

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def ctx(self) -> np.ndarray:
        """Members' computed tokens (a new array)."""
        return self.ints[_C0] + self.d

    @property
    def rid(self) -> np.ndarray:
        return self.ints[_RID]

    @property
    def last(self) -> np.ndarray:
        """Members' last token times (a view: written in place)."""
        return self.floats[_LAST]

    @property
    def mx(self) -> np.ndarray:
        """Members' longest inter-token gaps (a view: written in place)."""
        return self.floats[_MX]

    # -- membership -------------------------------------------------------------
    def join(self, new: list[Seq]) -> list[Seq]:
        """Sequences that just became plain decodes (their attributes current) enter,
        placed by admission order. Returns those that cannot (holding more KV than their
        tokens need: they stay outside)."""
        bs, d, held_of, counts = self.bs, self.d, self.kv._held, self.counts
        fit, rest = [], []
        for s in new:
            (fit if held_of[s.rid] == -(-s.num_computed // bs) else rest).append(s)
        if not fit:
            return rest
        c0 = [s.num_computed - d for s in fit]
        end = [d + s.output_tokens - s.num_generated for s in fit]
        for c in c0:
            counts[-c % bs] += 1
        self.min_end = min(self.min_end, min(end))
        rids = [s.rid for s in fit]
        order = [s.order for s in fit]
        ints = np.concatenate((self.ints, np.array([rids, order, c0, end], dtype=_I8)), axis=1)
        floats = np.concatenate((self.floats, np.array([[s.last_token for s in fit], [s.max_itl for s in fit]])),
                                axis=1)
        for s in fit:
            s.in_cohort = True
        if all(a < b for a, b in zip(order, order[1:])) and (not self.seqs or order[0] > self.ints[_ORDER, -1]):
            self.ints, self.floats = ints, floats
            self.seqs += fit
            self.rids += rids
            return rest
        # NOTE: a sequence admitted earlier may finish its prompt later (chunks): insert in order
        seqs = self.seqs + fit
        perm = np.argsort(ints[_ORDER], kind="stable")
        self.ints, self.floats = ints[:, perm], floats[:, perm]
        self.seqs = [seqs[i] for i in perm.tolist()]
        self.rids = self.ints[_RID].tolist()
        return rest

    def remove(self, mask: np.ndarray) -> list[Seq]:
        """Take out the members where ``mask``; returns them, synced, in cohort order."""
        idx, keep = np.flatnonzero(mask), ~mask
        return self._take(idx.tolist(), idx, lambda a: a[:, keep])

    def finish(self) -> list[Seq]:
        """Take out the members that have generated their whole output (``d >= end``)."""
        done = self.ints[_END] <= self.d
        at = np.flatnonzero(done)
        if len(at) != 1:
            return self.remove(done)
        # NOTE: the usual case, one at a time: slices instead of a mask (~3x cheaper)
        i = int(at[0])
        return self._take([i], slice(i, i + 1), lambda a: np.concatenate((a[:, :i], a[:, i + 1:]), axis=1))

    def _take(self, at: list[int], idx, keep) -> list[Seq]:
        """Members at positions ``at`` (ascending; ``idx`` indexes the same columns) leave,
        synced; ``keep`` cuts them from a 2-D array."""
        out = [self.seqs[i] for i in at]
        self._write(out, idx)
        bs, counts = self.bs, self.counts
        for c in self.ints[_C0, idx].tolist():
            counts[-c % bs] -= 1
        self.ints, self.floats = keep(self.ints), keep(self.floats)
        for i in reversed(at):
            del self.seqs[i]
            del self.rids[i]
        self.min_end = int(self.ints[_END].min()) if self.seqs else _NEVER
        for s in out:
            s.in_cohort = False
        return out

    def clear(self) -> list[Seq]:
        """Every member leaves (synced); returns them in cohort order."""
        out = self.seqs
        self.sync()
        for s in out:
            s.in_cohort = False
        pending = self.pending
        self.__init__(self.kv)
        self.pending = pending
        return out

    def sync(self) -> None:
        """Write the columns back to the members' ``Seq`` attributes and held blocks."""
        if self.stale:
            self._write(self.seqs, None)
            self.stale = False

    def _write(self, seqs: list[Seq], idx) -> None:
        d, bs, p = self.d, self.bs, self.pending
        ints, floats = (self.ints, self.floats) if idx is None else (self.ints[:, idx], self.floats[:, idx])
        held_of = self.kv._held
        for s, c0, e, t, m in zip(seqs, ints[_C0].tolist(), ints[_END].tolist(), floats[_LAST].tolist(),
                                  floats[_MX].tolist()):
            c = c0 + d
            s.num_computed = c
            s.num_tokens = c + 1
            s.num_generated = s.output_tokens - (e - d)
            s.last_token = t
            s.max_itl = m
            held_of[s.rid] = -(-(c + p) // bs)

    # -- steps ---------------------------------------------------------------------
    def growth(self, extra: int = 1) -> int:
        """Blocks the members need to grow by ``extra`` tokens each (``KVView.growth_needed``)."""
        if extra == 1 and not self.pending:
            return self.counts[self.d % self.bs]
        ctx = self.ints[_C0] + self.d
        need = -(-(ctx + extra) // self.bs) - -(-(ctx + self.pending) // self.bs)
        return int(need[need > 0].sum())

    def grant(self, steps: int, blocks: int, peak: int | None = None) -> None:
        """Count ``blocks`` more blocks held: the members' growth through ``steps`` steps
        from now (``PagedKVCache.grow`` for all of them). For a run through completions
        (``Replica._cohort_run``) ``blocks`` is the net change (growth of the members
        still running, less the blocks of those that finish before its last step, whose
        entries the engine drops when it applies them) and ``peak`` the most used before
        any of its steps; by default the peak is the blocks used after the grant."""
        kv = self.kv
        if blocks > kv.total_blocks - kv._used:
            raise KVExhausted(f"the running decodes need {blocks} more KV blocks but only "
                              f"{kv.total_blocks - kv._used} are free")
        kv._used += blocks
        top = kv._used if peak is None else peak
        if top > kv.peak_used:
            kv.peak_used = top
        self.pending = steps
        self.stale = True

    def grant_step(self) -> None:
        """Grant the next step (every member one token)."""
        self.grant(1, self.counts[self.d % self.bs])

    def advance(self, steps: int = 1) -> None:
        """``steps`` granted steps are done: contexts and outputs grow by ``steps``."""
        self.d += steps
        self.pending -= steps
        self.stale = True


_NEVER = 1 << 62
