"""What a stored point's name must cover: the one key rule of compare, sweep and plan.

A finished simulation is stored under ``OUT/points/<key>.json`` and reused by a
rerun into the same folder. Reuse is only right when the rerun would simulate
exactly the same thing, so :func:`point_key` hashes everything that decides
the numbers:

- the point's whole scenario (plus what made it: the command kind, a label);
- the *contents* of every file the scenario names (a hardware profile or model
  config given as a path, a trace, empirical lengths or gaps), by absolute
  path: relative names resolve against ``base_dir`` (the scenario's folder),
  then the working directory, as the run resolves them;
- the code: every file of the installed ``batchsim`` package (sources, the
  compiled core, the shipped catalogs and profiles), hashed once per process,
  and the module file of a policy that is not batchsim's (a plugin).

So an edited profile, trace, policy or engine gets new points instead of a
stale answer. (A cost: editing any batchsim file invalidates every stored point.)
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
from pathlib import Path
from typing import Any

__all__ = ["point_key", "code_hash", "files_hash"]

_SKIP_DIRS = {"__pycache__"}


@functools.lru_cache(maxsize=1)
def code_hash() -> str:
    """sha256 of every file of the batchsim package (relative path and contents)."""
    import batchsim

    root = Path(batchsim.__file__).resolve().parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if not p.is_file() or _SKIP_DIRS.intersection(p.relative_to(root).parts) or p.suffix == ".pyc":
            continue
        h.update(str(p.relative_to(root)).encode())
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def _strings(obj: Any):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _strings(v)


def _file(text: str, base_dir: str | None) -> Path | None:
    if not text or len(text) > 4096 or "\n" in text or "\0" in text:
        return None
    for cand in ([Path(base_dir) / text] if base_dir else []) + [Path(text)]:
        try:
            if cand.is_file():
                return cand.resolve()
        except (OSError, ValueError):
            continue
    return None


def _plugin_file(scenario: dict) -> Path | None:
    """The module file of the scenario's policy when it is not one of batchsim's."""
    policy = scenario.get("policy")
    name = policy.get("name") if isinstance(policy, dict) else policy
    if not isinstance(name, str):
        return None
    try:
        from batchsim.policies.registry import policy_class

        cls = policy_class(name)
        if cls.__module__.partition(".")[0] == "batchsim":
            return None
        return Path(inspect.getfile(cls)).resolve()
    except Exception:  # noqa: BLE001 - an unknown policy fails in the run itself, with its own error
        return None


def files_hash(scenario: dict, base_dir: str | None) -> dict[str, str]:
    """``{absolute path: sha256}`` of every existing file the scenario's strings name, and of a
    plugin policy's module."""
    found = {p for p in (_file(s, base_dir) for s in _strings(scenario)) if p is not None}
    plugin = _plugin_file(scenario)
    if plugin is not None and plugin.is_file():
        found.add(plugin)
    out = {}
    for p in sorted(found):
        st = p.stat()
        out[str(p)] = _sha(str(p), st.st_mtime_ns, st.st_size)
    return out


@functools.lru_cache(maxsize=256)
def _sha(path: str, mtime_ns: int, size: int) -> str:
    """A file's sha256 (memoised per process by path, mtime and size: a plan asks for a trace's
    hash once per point)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def point_key(scenario: dict, base_dir: str | None, **what: Any) -> str:
    """The name of a stored point: a hash of its scenario, the files it reads, the code and
    ``what`` (the command kind, the point format, a label, ...)."""
    blob = json.dumps({"scenario": scenario, "files": files_hash(scenario, base_dir), "code": code_hash(),
                       **what}, sort_keys=True, allow_nan=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:24]
