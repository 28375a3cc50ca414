"""What a report is made of: per-policy records and run-wide facts, as plain values.

``batchsim/reports/`` never runs a simulation. The orchestration (``batchsim.app.compare``,
``batchsim.app.sweep``) hands it :class:`PolicyRun` values holding the records of one
policy's run (the frames of ``batchsim.sim.records``) and its summaries, plus a
:class:`ReportInfo` for the header. Tests build both by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from batchsim.reports.stats import aggregate

__all__ = ["PolicyRun", "ReportInfo", "RUN_META_KEYS"]

# Run facts the plots need beyond the records (all per replica but ``replicas``).
RUN_META_KEYS = ("replicas", "kv_blocks", "peak_flops", "peak_bandwidth", "warmup_s", "cooldown_s",
                 "warmup_requests", "cooldown_requests")


@dataclass(frozen=True)
class PolicyRun:
    """One policy's records (from its first seed) and every seed's summary.

    ``meta`` carries :data:`RUN_META_KEYS`. ``summaries`` has one dict per seed,
    in seed order; ``summaries[0]`` belongs to the records.
    """

    policy: str
    requests: pd.DataFrame
    steps: pd.DataFrame
    itl: pd.DataFrame
    summaries: tuple[dict, ...]
    meta: dict = field(default_factory=dict)

    @property
    def summary(self) -> dict:
        """The summary of the run whose records these are (the first seed)."""
        return self.summaries[0]

    @property
    def seeds(self) -> int:
        """How many seeds this policy ran."""
        return len(self.summaries)

    def stats(self) -> dict:
        """Mean (and ``_ci95`` half-widths when seeds > 1) of every metric."""
        if self.seeds == 1:
            return dict(self.summaries[0])
        return aggregate(self.summaries)


@dataclass(frozen=True)
class ReportInfo:
    """The report header: what was simulated, on what, by which batchsim."""

    title: str
    scenario: str
    model: str
    hardware: str
    calibrated: bool
    version: str
    seeds: int = 1
    details: tuple[tuple[str, str], ...] = ()  # extra (label, value) header rows
