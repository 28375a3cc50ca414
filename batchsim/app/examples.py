"""The example scenarios and pinned baselines shipped inside the package.

``batchsim/examples/`` holds one scenario per policy, the built-in example of
``batchsim compare`` and ``ci/`` (an example policy plugin and its CI
workflow); ``batchsim/baselines/`` holds the regression gate's pinned
scenarios and ``baseline.json``. A checkout links them as the top-level
``examples/`` and ``baselines/``; an installed wheel has only the packaged
copies, found here with :func:`importlib.resources.files`, and
:func:`write_all` lays them out in a folder so the README's commands work there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

from batchsim.sim.errors import InputError
from batchsim.sim.io import atomic_write_bytes, require_folder

if TYPE_CHECKING:
    from importlib.abc import Traversable  # importlib.resources.abc from Python 3.11

__all__ = ["Example", "examples_dir", "list_examples", "list_baselines", "other_files",
           "example_text", "write_example", "write_all"]

BASELINE_PREFIX = "baselines/"
# Build and cache litter (an in-place `pip install -e`, an import of the plugin) is not an example.
_SKIP = re.compile(r"(^__pycache__$|\.pyc$|\.egg-info$|^build$|^dist$|^\.)")


@dataclass(frozen=True)
class Example:
    """One packaged scenario: its name for ``batchsim examples NAME`` and what it is."""

    name: str
    file: str  # path relative to the folder --all writes: examples/x.yaml or baselines/x.yaml
    description: str


def _root(kind: str) -> Traversable:
    return files("batchsim") / kind


def examples_dir() -> Path:
    """The packaged examples folder (a real folder for a wheel or an editable install)."""
    return Path(str(_root("examples")))


def _walk(node: Traversable, rel: str = "") -> list[tuple[str, Traversable]]:
    """Every file under ``node`` as (posix path relative to it, file), sorted."""
    out: list[tuple[str, Traversable]] = []
    for child in sorted(node.iterdir(), key=lambda c: c.name):
        if _SKIP.search(child.name):
            continue
        path = f"{rel}{child.name}"
        if child.is_dir():
            out.extend(_walk(child, path + "/"))
        elif child.is_file():
            out.append((path, child))
    return out


def _describe(text: str) -> str:
    """The first sentence of the leading comment block, else the scenario's ``name:``."""
    lines: list[str] = []
    for line in text.splitlines():
        s = line.strip()
        if not s.startswith("#"):
            break
        lines.append(s.lstrip("#").strip())
    comment = " ".join(x for x in lines if x)
    if comment:
        return re.split(r"(?<=\.)\s+", comment, maxsplit=1)[0]
    m = re.search(r"^name:\s*(.+?)\s*$", text, re.MULTILINE)
    return m.group(1).strip("'\"") if m else ""


def _scenarios(kind: str, prefix: str) -> list[tuple[Example, Traversable]]:
    out = []
    for rel, f in _walk(_root(kind)):
        if "/" in rel or not rel.endswith(".yaml"):
            continue
        ex = Example(prefix + rel[: -len(".yaml")], f"{kind}/{rel}", _describe(f.read_text(encoding="utf-8")))
        out.append((ex, f))
    return out


def list_examples() -> list[Example]:
    """The example scenarios (``examples/*.yaml``), by name."""
    return [e for e, _ in _scenarios("examples", "")]


def list_baselines() -> list[Example]:
    """The pinned regression scenarios (``baselines/*.yaml``), named ``baselines/<stem>``."""
    return [e for e, _ in _scenarios("baselines", BASELINE_PREFIX)]


def other_files() -> list[str]:
    """The packaged files that are not scenarios listed above (``examples/ci/...``, ``baseline.json``)."""
    listed = {e.file for e in list_examples() + list_baselines()}
    return [f"{kind}/{rel}" for kind in ("examples", "baselines") for rel, _ in _walk(_root(kind))
            if f"{kind}/{rel}" not in listed]


def _find(name: str) -> tuple[Example, Traversable]:
    known = _scenarios("examples", "") + _scenarios("baselines", BASELINE_PREFIX)
    key = name[: -len(".yaml")] if name.endswith(".yaml") else name
    for ex, f in known:
        if key == ex.name:
            return ex, f
    names = ", ".join(e.name for e, _ in known)
    raise InputError(f"unknown example {name!r}; known: {names}", "batchsim examples")


def example_text(name: str) -> str:
    """The YAML of the example (or ``baselines/<stem>``) called ``name``."""
    return _find(name)[1].read_text(encoding="utf-8")


def _check_dir(out: Path) -> None:
    require_folder(out, "--out")


def _refuse_clashes(targets: list[Path], force: bool) -> None:
    for t in targets:
        if t.exists() and (not force or t.is_dir()):
            what = "is a folder" if t.is_dir() else "already exists"
            raise InputError(f"{t} {what}; not overwritten" + ("" if t.is_dir() else " (--force overwrites)"))
        for parent in t.parents:
            if parent.exists() and not parent.is_dir():
                raise InputError(f"{parent} is a file; expected a folder")


def write_example(name: str, out: Path, *, force: bool = False) -> Path:
    """Write the example ``name`` as ``out/<stem>.yaml``; refuse to overwrite unless ``force``."""
    _check_dir(out)
    ex, f = _find(name)
    dest = out / Path(ex.file).name
    _refuse_clashes([dest], force)
    atomic_write_bytes(dest, f.read_bytes())
    return dest


def write_all(out: Path, *, force: bool = False) -> list[Path]:
    """Write every packaged file as ``out/examples/...`` and ``out/baselines/...``.

    From ``out`` the README's commands then work as in a checkout. Every
    target is checked before anything is written, so a clash writes nothing.
    """
    _check_dir(out)
    plan = [(out / kind / rel, f) for kind in ("examples", "baselines") for rel, f in _walk(_root(kind))]
    _refuse_clashes([dest for dest, _ in plan], force)
    for dest, f in plan:
        atomic_write_bytes(dest, f.read_bytes())
    return [dest for dest, _ in plan]
