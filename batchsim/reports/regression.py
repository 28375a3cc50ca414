"""Regression diffs: which metric got worse, by how much, and how to show it.

This module is pure: it compares two flat ``{metric: number}`` mappings (a
baseline's and a fresh run's summary) and renders the result three ways — a
terminal table, JUnit XML (one test case per scenario x metric, for CI test
viewers) and a markdown summary sized for a pull-request comment. Running the
scenarios and reading the baseline file is :mod:`batchsim.app.regress`'s job.

Every metric has a direction. Latencies (``*_ms``) and failure counts are
better lower, throughputs, goodput and ``completed`` are better higher; a
metric with no natural direction (``num_steps``, ``busy_fraction``) is
``either``: any change beyond tolerance fails.

Each side holds one value per seed. With ``tol = max(rtol * |baseline mean|, atol)``
(``rtol`` the user's knob, ``atol`` a per-metric floor so that values near zero do
not flap), each metric asks "did it move beyond ``tol`` the worse way?":

- the same seeds on both sides (common random numbers, the default): a one-sided
  paired t-test of the seed-by-seed differences against ``tol``;
- no shared seed: Welch's t-test of the two means (weaker);
- one shared seed: that seed's difference, exactly (no interval; a deterministic check);
- a single seed on a side and none shared: not evaluable (no interval), a failure.

The p-values of every statistical check of one ``batchsim regress`` run form one family,
decided by Holm's step-down procedure at ``ALPHA`` (:func:`decide`): a run in which
nothing really changed fails with probability at most 5%, however many scenarios and
metrics it checks. Improvements are a second family, reported and never failed.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
import statistics
from dataclasses import dataclass, replace
from typing import Iterable, Literal, Mapping, Sequence, Union

from rich.markup import escape
from rich.table import Table

from batchsim.reports.stats import mean_ci, t975, t_sf

__all__ = ["MetricSpec", "MetricDiff", "ScenarioDiff", "RegressionReport", "DEFAULT_METRICS",
           "FAILING", "metric_spec", "compare", "diff_table", "to_junit", "to_markdown",
           "COMMENT_MARKER"]

Better = Literal["lower", "higher", "either"]
FAILING = ("regressed", "changed", "missing", "unavailable", "not evaluable")
"""Statuses that fail the gate; ``ok`` and ``improved`` pass."""

COMMENT_MARKER = "<!-- batchsim-regress -->"
"""First line of the markdown summary, so a CI job can find and update its own PR comment."""


@dataclass(frozen=True)
class MetricSpec:
    """How to judge one summary key: which way is better and its absolute floor."""

    key: str
    better: Better
    atol: float


# NOTE: the absolute floors are deliberately small. Seed-to-seed noise is
# absorbed by the intervals (a run is deterministic per seed); the floors only
# stop a relative tolerance from collapsing to zero when the baseline is ~0.
_LATENCY_ATOL_MS = 0.1
_COUNT_ATOL = 0.5  # a count must move by at least one request
_RATE_ATOL = 0.01  # req/s

DEFAULT_METRICS: tuple[str, ...] = (
    "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms",
    "median_itl_ms", "p99_itl_ms", "median_e2el_ms", "p99_e2el_ms",
    "output_throughput", "request_throughput", "request_goodput",
    "completed", "rejected",
)
"""What ``batchsim regress`` checks unless ``--metrics`` says otherwise (vLLM bench names)."""

_KNOWN: dict[str, tuple[Better, float]] = {
    "output_throughput": ("higher", 1.0),
    "total_token_throughput": ("higher", 1.0),
    "request_throughput": ("higher", _RATE_ATOL),
    "request_goodput": ("higher", _RATE_ATOL),
    "completed": ("higher", _COUNT_ATOL),
    "rejected": ("lower", _COUNT_ATOL),
    "unfinished": ("lower", _COUNT_ATOL),
    "preemptions": ("lower", _COUNT_ATOL),
    "out_of_range_ops": ("lower", _COUNT_ATOL),
    "mfu": ("higher", 1e-4),
    "mbu": ("higher", 1e-4),
    "token_efficiency": ("higher", 1e-4),
}


def metric_spec(key: str) -> MetricSpec:
    """The spec for a summary key: known table first, then ``*_ms`` latencies, else ``either``."""
    if key in _KNOWN:
        better, atol = _KNOWN[key]
        return MetricSpec(key, better, atol)
    if key.endswith("_ms"):
        return MetricSpec(key, "lower", _LATENCY_ATOL_MS)
    return MetricSpec(key, "either", 1e-9)


RULE_PAIRED = "paired t"
RULE_WELCH = "Welch t"
RULE_EXACT = "exact"
RULE_NONE = "no interval"
"""How a metric was decided: a one-sided paired t-test on the seed-by-seed differences (the
same seeds on both sides), Welch's unpaired t-test (no shared seeds), an exact comparison of
the one seed both sides share (no interval: a deterministic check, outside the family), or
nothing (one side holds a single seed and no seed is shared: not evaluable)."""

ALPHA = 0.05
"""Family-wise false-alarm rate of one ``batchsim regress`` invocation: Holm's step-down
procedure over every statistical check of the run (all scenarios x metrics)."""


@dataclass(frozen=True)
class MetricDiff:
    """One metric of one scenario: both means, the difference the decision used, and the verdict.

    ``baseline``/``current`` are means over the compared seeds; ``baseline_ci``/``current_ci``
    the half-widths of their own 95% t-intervals (shown only for an unpaired comparison);
    ``baseline_n``/``current_n`` how many seeds each holds. ``delta ± delta_ci`` is the
    difference the rule decided on (the mean of the paired differences, or the difference of
    the means) with its 95% half-width; ``p_worse``/``p_better`` the one-sided p-values of
    "beyond the tolerance the worse (better) way" and ``p_adj`` the Holm-adjusted p-value of
    the direction the status reports (the worse one unless improved).
    """

    metric: str
    baseline: float | None
    current: float | None
    tolerance: float
    better: Better
    status: str  # ok | improved | regressed | changed | missing | unavailable | not evaluable | new (by --update)
    baseline_ci: float = 0.0
    current_ci: float = 0.0
    baseline_n: int = 1
    current_n: int = 1
    rule: str = ""
    delta: float | None = None
    delta_ci: float = 0.0
    p_worse: float | None = None
    p_better: float | None = None
    p_adj: float | None = None
    reason: str = ""

    @property
    def failed(self) -> bool:
        return self.status in FAILING

    @property
    def change(self) -> float | None:
        """Relative change (current / baseline - 1); None when undefined."""
        if self.baseline is None or self.current is None or self.baseline == 0:
            return None
        return self.current / self.baseline - 1.0

    @property
    def baseline_text(self) -> str:
        """The baseline mean; ``mean ± 95% CI`` only when the sides were compared unpaired."""
        return fmt_ci(self.baseline, self.baseline_ci, self.baseline_n) if self.rule == RULE_WELCH \
            else fmt(self.baseline)

    @property
    def current_text(self) -> str:
        return fmt_ci(self.current, self.current_ci, self.current_n) if self.rule == RULE_WELCH \
            else fmt(self.current)

    @property
    def rule_text(self) -> str:
        """``paired, 5 seeds``, ``unpaired (Welch), 5 and 3 seeds``, ``exact, 1 shared seed``."""
        if self.rule == RULE_PAIRED:
            return f"paired, {self.baseline_n} seeds"
        if self.rule == RULE_WELCH:
            return f"unpaired (Welch), {self.baseline_n} and {self.current_n} seeds"
        if self.rule == RULE_EXACT:
            return "exact, 1 shared seed, no interval"
        return self.rule

    @property
    def delta_text(self) -> str:
        """``Δ +12.3 ± 4.5 (paired, 5 seeds)``: what the decision used."""
        if self.delta is None:
            return "—"
        ci = f" ± {fmt(self.delta_ci)}" if self.rule in (RULE_PAIRED, RULE_WELCH) else ""
        return f"{_signed(self.delta)}{ci} ({self.rule_text})"

    @property
    def p_text(self) -> str:
        return "—" if self.p_adj is None else f"{self.p_adj:.3g}"

    def describe(self) -> str:
        """``p99_ttft_ms: 120.1 -> 150.3 (+25.1%): Δ +30.2 ± 4.0 (paired, 5 seeds), tolerance ±2.402,
        Holm-adjusted p 0.0012, lower is better``."""
        if self.status == "missing":
            return f"{self.metric}: not in the baseline (current {self.current_text})"
        if self.status == "unavailable":
            return f"{self.metric}: not in this run's summary (baseline {self.baseline_text})"
        if self.status == "not evaluable":
            if self.reason:
                return f"{self.metric}: {self.reason}"
            where = " and ".join(w for w, v in (("the baseline", self.baseline), ("this run", self.current))
                                 if v is None)
            return (f"{self.metric}: null in {where} (no measured request has it): not evaluable, so not a pass "
                    f"(baseline {fmt(self.baseline)}, current {fmt(self.current)})")
        how = f"{self.better} is better" if self.better != "either" else "any change counts"
        p = f", Holm-adjusted p {self.p_text}" if self.p_adj is not None else ""
        return (f"{self.metric}: {self.baseline_text} -> {self.current_text} ({fmt_change(self)}): "
                f"Δ {self.delta_text}, tolerance ±{fmt(self.tolerance)}{p}, {how}")


@dataclass(frozen=True)
class ScenarioDiff:
    """All metric diffs of one scenario, plus scenario-level problems, notes and provenance.

    ``problems`` fail the scenario on their own (its inputs changed since the
    baseline, or it has no baseline entry); ``notes`` only inform (a
    different batchsim version recorded the baseline, another engine ran).
    ``provenance`` is what produced the verdict (model, hardware, knobs, engine,
    version, seeds, ...), ``command`` the one command that reproduces it and
    ``run_commands`` each seed's ``batchsim run``. ``identical``: every recorded value of
    every seed equals the baseline's (a re-record would leave the entry byte-identical).
    """

    key: str
    name: str
    diffs: tuple[MetricDiff, ...]
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    scenario_hash: str = ""
    baseline_hash: str = ""
    seconds: float = 0.0
    provenance: tuple[tuple[str, str], ...] = ()
    command: str = ""
    run_commands: tuple[str, ...] = ()
    identical: bool = False

    @property
    def failed(self) -> bool:
        return bool(self.problems) or any(d.failed for d in self.diffs)

    @property
    def sameness(self) -> str:
        """What its provenance line says of the baseline: identical to it or not."""
        return "identical to the baseline" if self.identical else "not identical to the baseline"


@dataclass(frozen=True)
class RegressionReport:
    """The outcome of one ``batchsim regress`` invocation."""

    scenarios: tuple[ScenarioDiff, ...]
    rtol: float
    baseline: str
    updated: bool = False
    notes: tuple[str, ...] = ()
    seeds: int = 1
    alpha: float = ALPHA
    command: str = ""  # the batchsim regress command that reproduces this report
    baseline_text: str | None = None  # the new baseline file (after --update)

    @property
    def failed(self) -> bool:
        """True when the gate fails (never after ``--update``, which accepts the new values)."""
        return not self.updated and any(s.failed for s in self.scenarios)

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    @property
    def family(self) -> int:
        """How many statistical checks Holm's procedure ran over (those with a p-value)."""
        return sum(d.p_worse is not None for s in self.scenarios for d in s.diffs)

    def rows(self, *statuses: str) -> list[tuple[ScenarioDiff, MetricDiff]]:
        """(scenario, diff) pairs whose status is one of ``statuses``, in run order."""
        return [(s, d) for s in self.scenarios for d in s.diffs if d.status in statuses]


Values = Union[float, int, None, Sequence[Union[float, int, None]]]
"""One metric on one side: a value per seed (a bare number is one seed)."""

_PENDING = "pending"  # a statistical check waiting for the family's decision (decide)


def compare(baseline: Mapping[str, Values] | None, current: Mapping[str, Values],
            metrics: Iterable[str], rtol: float, paired: bool = False,
            alpha: float = ALPHA) -> tuple[MetricDiff, ...]:
    """Diff ``current`` against ``baseline`` for each metric, decided as one family.

    :func:`measure` then :func:`decide` over these metrics alone; ``regress`` measures
    every scenario first and decides them together, so that the family is the whole run.
    """
    return decide([measure(baseline, current, metrics, rtol, paired)], alpha)[0]


def measure(baseline: Mapping[str, Values] | None, current: Mapping[str, Values],
            metrics: Iterable[str], rtol: float, paired: bool = False) -> tuple[MetricDiff, ...]:
    """Each metric's comparison, its statistical ones still undecided (see :func:`decide`).

    Each value is a list of per-seed values or a bare number (one seed). ``paired``: the
    two sides hold the same seeds in the same order (common random numbers): 2 or more
    are compared by a one-sided paired t-test of the differences, a single one exactly.
    Unpaired sides are compared by Welch's t-test when each holds 2 or more seeds; a single
    seed on either side has no interval, so the metric is ``not evaluable`` (a failure), not
    an interval of zero width. With ``tol = max(rtol * |baseline mean|, atol)`` the tests ask
    whether the change lies beyond ``tol`` in the worse (better) direction. A metric present
    but null (None or NaN: no measured request had it) in any seed on either side is ``not
    evaluable``: it is neither equal nor better.
    """
    out = []
    for key in metrics:
        spec = metric_spec(key)
        b_vals = [_number(x) for x in _seq(baseline.get(key))] if baseline is not None else []
        c_vals = [_number(x) for x in _seq(current.get(key))]
        base = _interval(b_vals) if baseline is not None and key in baseline else None
        cur = _interval(c_vals) if key in current else None
        tol = max(rtol * abs(base[0]), spec.atol) if base is not None else spec.atol
        null = _null(current, key) or (baseline is not None and _null(baseline, key))
        b_mean, b_ci, b_n = base or (None, 0.0, len(b_vals))
        c_mean, c_ci, c_n = cur or (None, 0.0, len(c_vals))
        d = MetricDiff(key, b_mean, c_mean, tol, spec.better, "", b_ci, c_ci, b_n, c_n)
        if base is None and not null:
            d = replace(d, status="missing")
        elif cur is None and not null:
            d = replace(d, status="unavailable")
        elif null:
            d = replace(d, status="not evaluable")
        elif paired:
            if b_n != c_n:
                raise ValueError(f"{key}: paired sides hold {b_n} and {c_n} seeds")
            d = _paired(spec, d, b_vals, c_vals)
        else:
            d = _unpaired(spec, d, b_vals, c_vals)
        out.append(d)
    return tuple(out)


def _paired(spec: MetricSpec, d: MetricDiff, base: list[float], cur: list[float]) -> MetricDiff:
    """The same seeds on both sides: each seed's workload is the same, so the differences carry
    the change and not the workload's noise."""
    diffs = [c - b for b, c in zip(base, cur)]
    if len(diffs) == 1:  # one shared seed: its difference, exactly (a deterministic check)
        (x,) = diffs
        return replace(d, rule=RULE_EXACT, delta=x,
                       status=_verdict(spec, x > d.tolerance, -x > d.tolerance))
    mean, ci = mean_ci(diffs)
    se = statistics.stdev(diffs) / math.sqrt(len(diffs))
    up, down = _one_sided(mean, se, len(diffs) - 1, d.tolerance)
    return _pending(spec, replace(d, rule=RULE_PAIRED, delta=mean, delta_ci=ci), up, down)


def _unpaired(spec: MetricSpec, d: MetricDiff, base: list[float], cur: list[float]) -> MetricDiff:
    """No shared seeds: Welch's t-test on the two means (much weaker at the knee, where a
    5-seed interval of median TTFT can be ±50-75% of its mean)."""
    if len(base) < 2 or len(cur) < 2:
        one = "the baseline holds" if len(base) < 2 else "this run holds"
        return replace(d, status="not evaluable", rule=RULE_NONE, reason=(
            f"{one} a single seed and no seed is shared with the other side: a single seed has no interval, "
            "so the two sides cannot be compared by interval; not evaluable, so not a pass (run with the "
            "baseline's seeds, or re-record the baseline with --seeds 2 or more)"))
    vb, vc = statistics.variance(base) / len(base), statistics.variance(cur) / len(cur)
    se = math.sqrt(vb + vc)
    # Welch-Satterthwaite degrees of freedom (at least 1; exact when one side has no spread)
    df = max(1.0, (vb + vc) ** 2 / (vb**2 / (len(base) - 1) + vc**2 / (len(cur) - 1))) if se > 0 else 1.0
    delta = d.current - d.baseline
    up, down = _one_sided(delta, se, df, d.tolerance)
    return _pending(spec, replace(d, rule=RULE_WELCH, delta=delta, delta_ci=t975(int(df)) * se), up, down)


def _one_sided(mean: float, se: float, df: float, tol: float) -> tuple[float, float]:
    """One-sided p-values of "the true change is above +tol" and "below -tol".

    (No spread at all: the change is known exactly, and each p-value is 0 or 1.)"""
    if se == 0:
        return (0.0 if mean > tol else 1.0), (0.0 if -mean > tol else 1.0)
    return t_sf((mean - tol) / se, df), t_sf((-mean - tol) / se, df)


def _pending(spec: MetricSpec, d: MetricDiff, up: float, down: float) -> MetricDiff:
    """A statistical check's p-values, oriented to the metric's direction; decided by :func:`decide`."""
    if spec.better == "either":  # any change counts: both directions, Bonferroni within the check
        return replace(d, status=_PENDING, p_worse=min(1.0, 2 * min(up, down)), p_better=None)
    worse, better = (up, down) if spec.better == "lower" else (down, up)
    return replace(d, status=_PENDING, p_worse=worse, p_better=better)


def decide(groups: Sequence[Sequence[MetricDiff]], alpha: float = ALPHA) -> list[tuple[MetricDiff, ...]]:
    """Decide every pending check of ``groups`` (one per scenario) as one family.

    Holm's step-down procedure over the "worse" p-values of every statistical check keeps
    the chance that a run with no real change fails anywhere at most ``alpha``; the
    "better" p-values form a second family (improvements are reported, never failed)."""
    flat = [(g, i) for g, group in enumerate(groups) for i, d in enumerate(group) if d.status == _PENDING]
    worse = _holm([groups[g][i].p_worse for g, i in flat])
    better = _holm([groups[g][i].p_better for g, i in flat])
    out = [list(group) for group in groups]
    for (g, i), pw, pb in zip(flat, worse, better):
        d = groups[g][i]
        if pw is not None and pw <= alpha:
            status, p = ("changed" if d.better == "either" else "regressed"), pw
        elif pb is not None and pb <= alpha:
            status, p = "improved", pb
        else:
            status, p = "ok", pw
        out[g][i] = replace(d, status=status, p_adj=p)
    return [tuple(group) for group in out]


def _holm(ps: list[float | None]) -> list[float | None]:
    """Holm-adjusted p-values (None stays None and is not part of the family)."""
    idx = sorted((i for i, p in enumerate(ps) if p is not None), key=lambda i: (ps[i], i))
    m, run, out = len(idx), 0.0, list(ps)
    for rank, i in enumerate(idx):
        run = max(run, min(1.0, (m - rank) * ps[i]))
        out[i] = run
    return out


def _seq(v: object) -> list:
    """A side's per-seed values as a list (a bare value is one seed, absent is none)."""
    if v is None:
        return []
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _interval(values: list[float | None]) -> tuple[float, float, int] | None:
    """``(mean, 95% CI half-width, seeds)``; None when any seed's value is not a number.

    The half-width is 0.0 for one seed (and never used: a single seed has no interval).
    """
    if not values or any(x is None for x in values):
        return None
    mean, ci = mean_ci(values)
    return mean, (0.0 if math.isnan(ci) else ci), len(values)


def _null(values: Mapping, key: str) -> bool:
    """``key`` is there but has no value (None, NaN) in some seed."""
    if key not in values:
        return False
    vs = _seq(values[key])
    return not vs or any(v is None or (isinstance(v, float) and math.isnan(v)) for v in vs)


def _number(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _verdict(spec: MetricSpec, up: bool, down: bool) -> str:
    """ok, changed, regressed or improved, from whether the metric moved up or down beyond the tolerance."""
    if not (up or down):
        return "ok"
    if spec.better == "either":
        return "changed"
    worse = up if spec.better == "lower" else down
    return "regressed" if worse else "improved"


# ------------------------------------------------------------------ rendering


def fmt(v: float | None) -> str:
    """Compact, stable number formatting for tables and messages."""
    if v is None:
        return "—"
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    a = abs(v)
    if a >= 100:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.3f}"
    return f"{v:.4g}"


def fmt_ci(mean: float | None, ci: float, n: int) -> str:
    """``mean ± ci`` for several seeds, the bare value for one (or none)."""
    if mean is None or n < 2:
        return fmt(mean)
    return f"{fmt(mean)} ± {fmt(ci)}"


def fmt_change(d: MetricDiff) -> str:
    c = d.change
    if c is None:
        return "n/a" if d.baseline is None or d.current is None else f"{d.current - d.baseline:+g}"
    return f"{c:+.1%}"


def _signed(v: float) -> str:
    return fmt(v) if v < 0 else "+" + fmt(v)


_STYLE = {"ok": "green", "improved": "cyan", "regressed": "bold red", "changed": "bold red",
          "missing": "bold yellow", "unavailable": "bold yellow", "not evaluable": "bold red", "new": "cyan"}


def _size(report: RegressionReport) -> str:
    return (f"rtol {report.rtol:g}, {report.seeds} seed{'s' * (report.seeds != 1)}, Holm over "
            f"{report.family} check{'s' * (report.family != 1)} at α={report.alpha:g}")


def diff_table(report: RegressionReport, only_changes: bool = False) -> Table:
    """A rich table, one row per scenario x metric (``only_changes``: hide ``ok`` rows)."""
    t = Table(title=f"batchsim regress vs {report.baseline} ({_size(report)})")
    for col, just in (("scenario", "left"), ("metric", "left"), ("baseline", "right"),
                      ("current", "right"), ("change", "right"), ("Δ ± 95% CI (rule)", "right"),
                      ("tolerance", "right"), ("p (Holm)", "right"), ("status", "left")):
        t.add_column(col, justify=just, no_wrap=col != "scenario")
    for s in report.scenarios:
        for d in s.diffs:
            if only_changes and d.status == "ok":
                continue
            t.add_row(escape(s.key), d.metric, d.baseline_text, d.current_text, fmt_change(d),
                      escape(d.delta_text), f"±{fmt(d.tolerance)}", d.p_text, f"[{_STYLE[d.status]}]{d.status}[/]")
    return t


def provenance_text(s: ScenarioDiff) -> str:
    """One line: ``model llama-3-8b, hardware h100-sxm, ...``."""
    return ", ".join(f"{k} {v}" for k, v in s.provenance)


def to_junit(report: RegressionReport) -> str:
    """JUnit XML: a testsuite per scenario, a testcase per scenario x metric.

    A failing case's ``<failure>`` message names the scenario, the metric and
    the difference the decision used. Scenario-level problems (changed inputs, no
    baseline entry) fail every case of the scenario, since none of its comparisons
    is valid. The suite's properties hold the verdict's provenance (model, hardware,
    knobs, engine, version, seeds), the command that reproduces it and each seed's run.
    """
    root = ET.Element("testsuites", name="batchsim regress")
    total = failures = 0
    for s in report.scenarios:
        suite = ET.SubElement(root, "testsuite", name=s.key, time=f"{s.seconds:.3f}")
        props = ET.SubElement(suite, "properties")
        for name, value in (("scenario_name", s.name), ("scenario_hash", s.scenario_hash),
                            ("baseline_hash", s.baseline_hash), ("rtol", f"{report.rtol:g}"),
                            ("seeds", str(report.seeds)), ("alpha", f"{report.alpha:g}"),
                            ("holm_family", str(report.family)),
                            ("identical_to_baseline", "true" if s.identical else "false"),
                            *s.provenance, ("reproduce", s.command),
                            *((f"run_seed_{i}", c) for i, c in enumerate(s.run_commands))):
            ET.SubElement(props, "property", name=name, value=value)
        n_fail = 0
        for d in s.diffs:
            case = ET.SubElement(suite, "testcase", classname=s.key, name=d.metric, time="0")
            if not report.updated and (d.failed or s.problems):
                n_fail += 1
                kind = d.status if d.failed else "scenario-changed"
                msg = f"{s.key}: {d.describe()}"
                if s.problems:
                    msg += " [" + "; ".join(s.problems) + "]"
                fail = ET.SubElement(case, "failure", type=kind, message=msg)
                fail.text = "\n".join((msg, *s.problems, *s.notes, f"reproduce: {s.command}"))
            else:  # a passing case shows what was compared too
                out = ET.SubElement(case, "system-out")
                out.text = "\n".join([f"{d.status}: {d.describe()}", *s.notes])
        suite.set("tests", str(len(s.diffs)))
        suite.set("failures", str(n_fail))
        suite.set("errors", "0")
        suite.set("skipped", "0")
        total += len(s.diffs)
        failures += n_fail
    root.set("tests", str(total))
    root.set("failures", str(failures))
    root.set("errors", "0")
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_rows(pairs: list[tuple[ScenarioDiff, MetricDiff]]) -> list[str]:
    lines = ["| scenario | metric | baseline | current | change | Δ ± 95% CI (rule) | tolerance | p (Holm) |",
             "|---|---|--:|--:|--:|--:|--:|--:|"]
    for s, d in pairs:
        lines.append(f"| `{_md_cell(s.key)}` | `{d.metric}` | {d.baseline_text} | {d.current_text} "
                     f"| {fmt_change(d)} | {_md_cell(d.delta_text)} | ±{fmt(d.tolerance)} | {d.p_text} |")
    return lines


def _headline(report: RegressionReport) -> str:
    n_s, n_m = len(report.scenarios), sum(len(s.diffs) for s in report.scenarios)
    bad = report.rows(*FAILING)
    broken = [s for s in report.scenarios if s.problems]
    size = f"{n_s} scenario{'s' * (n_s != 1)}, {n_m} metrics, {_size(report)}"
    if report.updated:
        return f"## batchsim regress: baseline updated ({size})"
    if not report.failed:
        return f"## batchsim regress: :white_check_mark: no regressions ({size})"
    parts = []
    if bad:
        parts.append(f"{len(bad)} failing metric{'s' * (len(bad) != 1)}")
    if broken:
        parts.append(f"{len(broken)} scenario{'s' * (len(broken) != 1)} changed, new or not evaluable")
    return f"## batchsim regress: :x: {', '.join(parts)} ({size})"


def to_markdown(report: RegressionReport) -> str:
    """A pull-request comment: headline, problems, regressions, improvements, notes, provenance
    with the commands that reproduce each verdict, the full table folded."""
    lines = [COMMENT_MARKER, _headline(report), ""]
    problems = [(s, p) for s in report.scenarios for p in s.problems]
    notes = list(report.notes) + [f"`{s.key}`: {n}" for s in report.scenarios for n in s.notes]
    if problems:
        lines += ["### Scenario problems", ""]
        lines += [f"- `{_md_cell(s.key)}`: {_md_cell(p)}" for s, p in problems] + [""]
    bad = report.rows(*FAILING)
    if bad:
        lines += ["### Regressions" if not report.updated else "### Worse than the old baseline", ""]
        lines += _md_rows(bad) + [""]
    good = report.rows("improved")
    if good:
        lines += ["### Improvements", ""] + _md_rows(good) + [""]
    if notes:
        lines += ["### Notes", ""] + [f"- {_md_cell(n)}" for n in notes] + [""]
    if any(s.provenance or s.command for s in report.scenarios):
        lines += ["### Provenance and reproduction", ""]
        for s in report.scenarios:
            lines += [f"- `{_md_cell(s.key)}` ({s.sameness}): {_md_cell(provenance_text(s))}",
                      f"  - reproduce: `{s.command}`"]
            lines += [f"  - seed run: `{c}`" for c in s.run_commands]
        lines += [""]
    lines += ["<details><summary>All metrics</summary>", ""]
    lines += _md_rows([(s, d) for s in report.scenarios for d in s.diffs])
    lines += ["", "</details>", ""]
    if report.failed:
        how = (f"`{report.command} --update`" if report.command
               else f"`batchsim regress ... --baseline {report.baseline} --update`")
        lines += [f"If the change is intended, re-record the baseline with {how} and commit it.", ""]
    return "\n".join(lines)
