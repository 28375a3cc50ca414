"""One benchmark run end to end: pick the previous result, run, write, compare.

:func:`benchmark` is the library call behind ``python -m bench``; the CLI
only parses options into its arguments and prints what it returns.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from bench.compare import THRESHOLD, compare, flagged, linearity, load_result, newest_result
from bench.report import render
from bench.runner import Limits, run_suite
from bench.scenarios import BenchCase

__all__ = ["BenchReport", "benchmark", "default_label"]


@dataclass
class BenchReport:
    """What a run wrote and found."""

    json_path: Path
    markdown_path: Path
    markdown: str
    document: dict
    previous: Path | None
    comparison: list[dict]
    slowdowns: list[dict]


def default_label() -> str:
    """A UTC timestamp, e.g. ``20250101T120000Z`` (sorts with time)."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def benchmark(cases: Sequence[BenchCase], out_dir: Path, limits: Limits = Limits(),
              label: str | None = None, compare_to: Path | None = None,
              threshold: float = THRESHOLD, echo: Callable[[str], None] = print) -> BenchReport:
    """Run ``cases``, write ``<label>.json`` and ``<label>.md`` under ``out_dir``, compare.

    The previous result is ``compare_to`` or else the newest file already in
    ``out_dir`` that shares a case with this run (chosen before this run
    writes its own).
    """
    label = label or default_label()
    json_path, md_path = out_dir / f"{label}.json", out_dir / f"{label}.md"
    previous = compare_to or newest_result(out_dir, exclude=[json_path], keys=[c.key for c in cases])
    doc = run_suite(cases, limits, json_path, label, echo)
    rows: list[dict] = []
    prev_label = None
    if previous is not None:
        prev_doc = load_result(previous)
        prev_label = f"{prev_doc.get('label', previous.stem)} ({previous.name})"
        rows = compare(prev_doc, doc, threshold)
    text = render(doc, rows if previous is not None else None, prev_label, linearity(doc))
    md_path.write_text(text)
    return BenchReport(json_path, md_path, text, doc, previous, rows, flagged(rows))
