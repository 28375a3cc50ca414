"""Loading a check script of scripts/ as a module, for the tests that keep the docs equal to what it prints."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


@functools.lru_cache(maxsize=None)
def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as a module (scripts/ is not a package), loaded once per session."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
