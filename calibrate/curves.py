"""Fast evaluation of a profile's efficiency curves on the pricing hot path.

A curve is a handful of ``(size, fraction)`` points interpolated linearly in
``log(size)``-``log(fraction)`` space (a power law between points) and
clamped at both ends. NOTE: log-log, not linear-in-log-size: time is
``size / fraction(size)``, and between two points where the fraction grows
no faster than the size (true of every measured curve) a power law keeps
time monotone in size, whereas linear-in-log interpolation of a fraction
that grows like the size makes time dip by up to 20% between grid points.

``price()`` evaluates a few dozen curves per step, so this is plain Python
over precomputed logs and slopes: for a ~10-point table, ``bisect`` +
``math.log`` beats ``np.interp`` on scalars by about 5x.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import Sequence

import numpy as np

from calibrate.hardware import Efficiency

__all__ = ["Curve", "ClassEfficiency"]

_MEMO_LIMIT = 1 << 16  # sizes remembered per curve by Curve.many
_LATTICE_X = 1 << 17  # Curve.progression: x below this per lattice (1 MiB of doubles)
_LATTICE_KEYS = 32  # lattices remembered per curve (then all are dropped)


class Curve:
    """Piecewise power law (linear in log-log), clamped; ``curve(size) -> fraction``."""

    __slots__ = ("_lx", "_y", "_slope", "_lo", "_hi", "_ylo", "_yhi", "_memo", "_lattice")

    def __init__(self, points: Sequence[Sequence[float]]) -> None:
        xs = [float(p[0]) for p in points]
        self._lx = [math.log(x) for x in xs]
        self._y = [math.log(float(p[1])) for p in points]
        self._slope = [(self._y[i + 1] - self._y[i]) / (self._lx[i + 1] - self._lx[i])
                       for i in range(len(xs) - 1)]
        self._lo, self._hi = xs[0], xs[-1]
        self._ylo, self._yhi = float(points[0][1]), float(points[-1][1])
        self._memo: dict[float, float] = {}
        self._lattice: dict[tuple[int, int], np.ndarray] = {}

    def __call__(self, size: float) -> float:
        if size <= self._lo:
            return self._ylo
        if size >= self._hi:
            return self._yhi
        lx = math.log(size)
        i = bisect_right(self._lx, lx) - 1
        if i == len(self._slope):  # a size just below the last point with the last point's log
            i -= 1
        return math.exp(self._y[i] + (lx - self._lx[i]) * self._slope[i])

    def many(self, sizes: Sequence[float]) -> list[float]:
        """``[self(x) for x in sizes]``, the same operations inlined (a run of decode steps).

        Values are memoised per size (bounded): the engine prices overlapping
        runs of decode steps (a run cut short by an arrival, a guess doubled),
        so most sizes of a padded batch's run were seen before. ``sizes`` must
        support ``len`` and indexing (a list or a range).
        """
        if not isinstance(sizes, (list, range)):
            sizes = list(sizes)
        memo = self._memo
        out = list(map(memo.get, sizes))
        misses = out.count(None)
        if not misses:
            return out
        lo, hi, ylo, yhi = self._lo, self._hi, self._ylo, self._yhi
        lxs, ys, slopes = self._lx, self._y, self._slope
        log, exp, bis = math.log, math.exp, bisect_right
        last = len(slopes) - 1
        if 2 * misses > len(out):  # mostly new: evaluate all, remember all
            out = []
            push = out.append
            for x in sizes:
                if x <= lo:
                    push(ylo)
                elif x >= hi:
                    push(yhi)
                else:
                    lx = log(x)
                    i = bis(lxs, lx) - 1
                    if i > last:  # (as in __call__)
                        i = last
                    push(exp(ys[i] + (lx - lxs[i]) * slopes[i]))
            if len(memo) > _MEMO_LIMIT:
                memo.clear()
            memo.update(zip(sizes, out))
            return out
        for j, v in enumerate(out):
            if v is None:
                x = sizes[j]
                if x <= lo:
                    v = ylo
                elif x >= hi:
                    v = yhi
                else:
                    lx = log(x)
                    i = bis(lxs, lx) - 1
                    if i > last:
                        i = last
                    v = exp(ys[i] + (lx - lxs[i]) * slopes[i])
                out[j] = memo[x] = v
        return out


    def progression(self, x0: int, step: int, count: int, scale: int, offset: int) -> np.ndarray:
        """``[self(offset + scale * (x0 + step * j)) for j in range(count)]`` as a new array.

        A run of decode steps reads the curve at sizes on one lattice
        (``offset + scale * x``: bytes per kernel over x cached tokens), at x
        stepping by ``step``. Values are remembered per lattice (offset and scale) in an array
        indexed by x, so a run mostly seen before is one slice instead of a
        dictionary lookup per step; the values missing are evaluated by
        :meth:`many` (the same scalar code, so the same doubles).
        """
        if step == 0 or count < 1:
            return np.full(max(count, 0), self(offset + scale * x0))
        last = x0 + step * (count - 1)
        if x0 < 0 or step < 0 or last >= _LATTICE_X:
            return np.array(self.many(range(offset + scale * x0, offset + scale * last + 1, scale * step)),
                            dtype=np.float64)
        grid = self._lattice.get((offset, scale))
        if grid is None:
            if len(self._lattice) >= _LATTICE_KEYS:
                self._lattice.clear()
            grid = self._lattice[offset, scale] = np.full(_LATTICE_X, np.nan)
        vals = grid[x0:last + 1:step]  # (a view: filled in place)
        miss = np.flatnonzero(np.isnan(vals))
        if len(miss):
            xs = (miss * step + x0).tolist()
            vals[miss] = self.many([offset + scale * x for x in xs])
        return vals.copy()


class ClassEfficiency:
    """One operator class: compute and memory curves plus the measured range."""

    __slots__ = ("compute", "memory", "_range")

    def __init__(self, eff: Efficiency) -> None:
        self.compute = Curve(eff.compute)
        self.memory = Curve(eff.memory)
        r = eff.measured_range
        if r is None:
            self._range = None
        else:
            t = r.tokens or (0.0, math.inf)
            b = r.bytes or (0.0, math.inf)
            self._range = (t[0], t[1], b[0], b[1])

    @property
    def measured(self) -> tuple[float, float, float, float] | None:
        """``(tokens_lo, tokens_hi, bytes_lo, bytes_hi)`` measured (inclusive), or None: never out of range."""
        return self._range

    def out_of_range(self, tokens: float, nbytes: float) -> bool:
        """True when a calibrated curve is used outside what was measured."""
        r = self._range
        if r is None:
            return False
        return not (r[0] <= tokens <= r[1] and r[2] <= nbytes <= r[3])

    def out_of_range_many(self, tokens: float, nbytes: np.ndarray) -> np.ndarray:
        """:meth:`out_of_range` (as 0/1) for one token count over an array of byte sizes."""
        r = self._range
        if r is None:
            return np.zeros(len(nbytes), dtype=np.int64)
        inside = (r[0] <= tokens <= r[1]) & (r[2] <= nbytes) & (nbytes <= r[3])
        return (~inside).astype(np.int64)
