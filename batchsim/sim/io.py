"""Atomic output writing: a temporary file in the same folder, then rename.

A run that is killed mid-write leaves either the old file or the new one,
never half a file, so finished results are never lost or corrupted.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["atomic_write_text", "atomic_write_bytes", "write_json", "write_csv"]


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (creating parent folders)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        # NOTE: mkstemp makes 0600 files; give outputs the usual umask-based mode.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, obj: Any) -> None:
    """Pretty, stable JSON (keys in insertion order, trailing newline)."""
    atomic_write_text(path, json.dumps(obj, indent=2, allow_nan=False, default=_default) + "\n")


def _default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def write_csv(path: str | Path, df: pd.DataFrame) -> None:
    """CSV with a fixed float format, so identical runs give identical bytes."""
    atomic_write_text(path, df.to_csv(index=False, float_format="%.9g", lineterminator="\n"))
