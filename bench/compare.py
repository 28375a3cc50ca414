"""Compare two result files, and check that cost grows linearly with size.

Absolute seconds on a shared machine move with its load, so the compared
number is each case's ``ratio``: its CPU time over that of the fixed
calibration loop timed in the same process (see :mod:`bench.child` for why
CPU, not wall, time). A case is flagged ``slower`` when its ratio
grew by more than the threshold (25% by default), and ``regressed`` when it
finished before and now times out, runs out of memory or fails. Cases are
matched by key; a case in only one file is skipped.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from pathlib import Path
from typing import Iterable

__all__ = ["THRESHOLD", "load_result", "newest_result", "compare", "flagged", "linearity"]

THRESHOLD = 0.25


def load_result(path: Path) -> dict:
    """Read a result file written by :func:`bench.runner.run_suite`."""
    return json.loads(Path(path).read_text())


def _created(path: Path) -> dt.datetime:
    try:
        return dt.datetime.fromisoformat(load_result(path)["created"])
    except (OSError, ValueError, KeyError, TypeError):
        return dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc)


def _keys(path: Path) -> set[str]:
    try:
        return {r["key"] for r in load_result(path).get("results", [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()


def newest_result(folder: Path, exclude: Iterable[Path] = (),
                  keys: Iterable[str] | None = None) -> Path | None:
    """The result file in ``folder`` with the latest ``created`` stamp (file time if it has none).

    With ``keys``, only files holding at least one of those cases count, so
    a one-off 1M trial does not become what a 10k run is compared with.
    NOTE: not the newest file time: a checkout gives every committed result
    the same mtime.
    """
    skip = {Path(p).resolve() for p in exclude}
    files = [p for p in Path(folder).glob("*.json") if p.resolve() not in skip]
    if keys is not None:
        want = set(keys)
        files = [p for p in files if _keys(p) & want]
    return max(files, key=_created) if files else None


def _verdict(prev: dict, cur: dict, threshold: float) -> tuple[float | None, str]:
    ok = ("ok", "timeout")
    if prev["status"] == "ok" and cur["status"] != "ok":
        return None, f"regressed ({cur['status']})"
    if prev["status"] != "ok" and cur["status"] == "ok":
        return None, f"fixed (was {prev['status']})"
    if prev["status"] not in ok or cur["status"] not in ok:
        return None, ""
    if not prev.get("ratio") or not cur.get("ratio"):
        return None, ""
    change = cur["ratio"] / prev["ratio"] - 1
    est = " (est.)" if "timeout" in (prev["status"], cur["status"]) else ""
    if change > threshold:
        return change, "slower" + est
    if change < -threshold:
        return change, "faster" + est
    return change, ""


def compare(prev: dict, cur: dict, threshold: float = THRESHOLD) -> list[dict]:
    """One row per case present in both documents: ratios, change and a flag."""
    if prev.get("calibration", {}).get("version") != cur.get("calibration", {}).get("version"):
        return []  # a different calibration loop: ratios are not comparable
    before = {r["key"]: r for r in prev.get("results", [])}
    rows = []
    for r in cur.get("results", []):
        p = before.get(r["key"])
        if p is None:
            continue
        change, flag = _verdict(p, r, threshold)
        steps_differ = (p["status"] == r["status"] == "ok" and p.get("steps") != r.get("steps"))
        rows.append({"key": r["key"], "prev_status": p["status"], "status": r["status"],
                     "prev_ratio": p.get("ratio"), "ratio": r.get("ratio"),
                     "prev_wall_s": p.get("wall_s"), "wall_s": r.get("wall_s"),
                     "change": change, "flag": flag, "steps_differ": steps_differ})
    return rows


def flagged(rows: Iterable[dict]) -> list[dict]:
    """The rows that count as a slowdown (slower beyond noise, or regressed)."""
    return [r for r in rows if r["flag"].startswith(("slower", "regressed"))]


def _wall(r: dict) -> tuple[float | None, bool]:
    """Wall seconds of a case, or its estimate if it timed out (value, is_estimate)."""
    if r["status"] == "ok":
        return r["wall_s"], False
    if r["status"] == "timeout" and r.get("est_wall_s"):
        return r["est_wall_s"], True
    return None, False


def linearity(doc: dict) -> list[dict]:
    """Per (policy, load, replicas): wall time at each size and the ratio between sizes.

    Linear cost means the wall-time ratio equals the size ratio (x10 for
    10k -> 100k); a ratio well above it is a super-linear hot path.
    """
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in doc.get("results", []):
        groups[(r["policy"], r["load"], r["replicas"])].append(r)
    rows = []
    for (policy, load, replicas), rs in groups.items():
        rs = sorted(rs, key=lambda r: r["size"])
        points = []
        for r in rs:
            wall, est = _wall(r)
            points.append({"size": r["size"], "status": r["status"], "wall_s": wall, "estimate": est})
        for a, b in zip(points, points[1:]):
            ok = a["wall_s"] and b["wall_s"]
            b["ratio"] = b["wall_s"] / a["wall_s"] if ok else None
            b["size_ratio"] = b["size"] / a["size"]
        rows.append({"policy": policy, "load": load, "replicas": replicas, "points": points})
    return rows
