"""One look for every plot: colours per policy, fonts, grids, PNG rendering.

Figures are built with :class:`matplotlib.figure.Figure` and rendered by the
Agg canvas directly, never through ``pyplot``.
NOTE: skipping pyplot means no global backend switch, no figure registry to
leak memory across a sweep, and plotting that is safe in worker processes;
the price is that ``plt.show()`` conveniences are unavailable (reports only
write files).
"""

from __future__ import annotations

import functools
import io
import math
from typing import Callable, Sequence, TypeVar

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["policy_color", "policy_colors", "policy_lines", "log_axis", "set_log", "new_figure", "png_bytes", "styled", "RC", "DPI",
           "PERCENTILE_MARKERS"]

DPI = 110

# The four built-in policies always get the same colour; others follow.
_KNOWN = {"static": "#d62728", "dynamic": "#ff7f0e", "continuous": "#1f77b4",
          "chunked_prefill": "#2ca02c"}
_EXTRA = ("#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")

# Dashes tell apart policies whose lines coincide (dynamic often tracks static).
_DASHES = {"static": "-", "dynamic": (0, (5, 2)), "continuous": "-", "chunked_prefill": (0, (7, 2, 1.5, 2))}

# p50 and p99 markers on CDFs and sweep curves.
PERCENTILE_MARKERS = {50: "o", 99: "^"}

RC = {
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "axes.labelsize": 10,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.fontsize": 9,
    "legend.frameon": False,
    "lines.linewidth": 1.6,
    "figure.facecolor": "white",
    "axes.facecolor": "white",
    "savefig.facecolor": "white",
}


def policy_colors(policies: Sequence[str]) -> dict[str, str]:
    """A colour per policy: fixed for the built-ins, a stable cycle for the rest."""
    out, extra = {}, iter(_EXTRA * (1 + len(policies) // len(_EXTRA)))
    for p in policies:
        out[p] = _KNOWN.get(p) or next(extra)
    return out


def policy_lines(policies: Sequence[str]) -> dict[str, dict]:
    """Line keyword arguments (colour and dashes) per policy."""
    return {p: {"color": c, "linestyle": _DASHES.get(p, "-")} for p, c in policy_colors(policies).items()}


def set_log(ax, which: str, values) -> bool:
    """Log-scale ``ax``'s ``which`` ("x"/"y") axis with plain labels, if any value is > 0.

    NOTE: a policy that completed nothing has 0 ms latencies; a log axis of
    only zeros cannot be drawn, so that panel stays linear instead of failing.
    """
    v = np.asarray(values, dtype=float).ravel()
    if not np.any(np.isfinite(v) & (v > 0)):
        return False
    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    log_axis(ax.xaxis if which == "x" else ax.yaxis)
    return True


def log_axis(axis) -> None:
    """Label a log-scaled axis with plain numbers (1, 2, 5, 10, 20, ...), not 10^x.

    Call after ``set_xscale("log")``/``set_yscale("log")`` (which reset tickers).
    """
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    def label(v: float, _pos: int) -> str:
        if v <= 0:
            return ""
        lo, hi = sorted(axis.get_view_interval())
        wide = lo > 0 and math.log10(hi / lo) > 2.2
        exp = math.floor(math.log10(v) + 1e-9)
        mantissa = round(v / 10**exp, 6)
        # NOTE: over more than ~2 decades only powers of ten are labelled; 2 and 5 would collide.
        if wide and mantissa != 1.0:
            return ""
        if v < 1e4:
            return f"{v:g}"
        return f"$10^{{{exp}}}$" if mantissa == 1.0 else f"${mantissa:g}\\times10^{{{exp}}}$"

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(label))
    axis.set_minor_formatter(NullFormatter())


def policy_color(policy: str) -> str:
    """The colour of one built-in policy (grey for unknown ones)."""
    return _KNOWN.get(policy, "#7f7f7f")


F = TypeVar("F", bound=Callable)


def styled(fn: F) -> F:
    """Run a plotting function inside the report style (rcParams are read when
    axes and artists are created, so the whole body needs the context)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with matplotlib.rc_context(RC):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def new_figure(width: float, height: float) -> Figure:
    """A blank figure (inches) attached to an Agg canvas; call inside :func:`styled`."""
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig: Figure) -> bytes:
    """Render a figure to PNG bytes (no timestamps in the metadata)."""
    buf = io.BytesIO()
    with matplotlib.rc_context(RC):
        fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()
