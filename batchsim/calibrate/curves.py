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

from batchsim.calibrate.hardware import Efficiency

__all__ = ["Curve", "ClassEfficiency"]


class Curve:
    """Piecewise power law (linear in log-log), clamped; ``curve(size) -> fraction``."""

    __slots__ = ("_lx", "_y", "_slope", "_lo", "_hi", "_ylo", "_yhi")

    def __init__(self, points: Sequence[Sequence[float]]) -> None:
        xs = [float(p[0]) for p in points]
        self._lx = [math.log(x) for x in xs]
        self._y = [math.log(float(p[1])) for p in points]
        self._slope = [(self._y[i + 1] - self._y[i]) / (self._lx[i + 1] - self._lx[i])
                       for i in range(len(xs) - 1)]
        self._lo, self._hi = xs[0], xs[-1]
        self._ylo, self._yhi = float(points[0][1]), float(points[-1][1])

    def table(self):
        """This curve's numbers by name (:class:`batchsim.calibrate.pricing.CurveTable`)."""
        from batchsim.calibrate.pricing import CurveTable

        return CurveTable(log_x=tuple(self._lx), log_y=tuple(self._y), slope=tuple(self._slope), lo=self._lo,
                          hi=self._hi, y_lo=self._ylo, y_hi=self._yhi)

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
