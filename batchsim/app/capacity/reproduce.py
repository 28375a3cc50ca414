"""The ``batchsim run`` command line that reproduces one plan row.

A plan row's numbers come from simulations of a configuration (the scenario
with its hardware, TP, policy and knob values) at one rate, horizon and seed.
:func:`run_command` writes the command that simulates exactly that scenario:
the scenario file, the plan's own ``--set`` overrides, ``--policy`` for a
swapped policy, and one ``--set`` per field that differs. It is checked, not
trusted: the command's arguments are loaded the way ``batchsim run`` loads
them, and the command is returned only when the result is the same scenario.

NOTE: ``batchsim run`` applies ``--set`` before ``--policy`` swaps the policy
in, and the swap replaces ``policy``. So ``--policy P`` is used only when the
swapped policy is exactly what the swap gives (the scenario's
``policy_knobs.P``); when the plan changed one of its knobs, the command spells
the policy out instead (``--set policy.name=P --set policy.<knob>=v``, or the
whole ``policy`` mapping), with no ``--policy``.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, Sequence

__all__ = ["run_command", "scenario_sets"]


def _text(value: Any) -> str:
    """A ``--set`` value that loads back as ``value`` (YAML; JSON is YAML)."""
    from batchsim.sim.safe_yaml import load_yaml

    if isinstance(value, str):
        try:
            if load_yaml(value) == value:
                return value
        except Exception:  # noqa: BLE001 - any text YAML refuses is quoted below
            pass
    return json.dumps(value, sort_keys=True)


def _diff(src: Any, dst: Any, key: str, out: list[tuple[str, Any]]) -> None:
    """Dotted ``(key, value)`` settings that turn ``src`` into ``dst``."""
    if isinstance(src, dict) and isinstance(dst, dict) and key and set(src) <= set(dst):
        for k, v in dst.items():
            _diff(src.get(k, _MISSING), v, f"{key}.{k}", out)
    elif isinstance(src, dict) and isinstance(dst, dict) and not key:
        for k, v in dst.items():
            _diff(src.get(k, _MISSING), v, k, out)
    elif src is _MISSING or src != dst or type(src) is not type(dst):
        out.append((key, dst))


_MISSING = object()


def scenario_sets(base: dict, target: dict) -> list[str]:
    """``dotted.key=value`` settings that turn ``base`` into ``target``."""
    pairs: list[tuple[str, Any]] = []
    _diff(base, target, "", pairs)
    return [f"{key}={_text(value)}" for key, value in pairs]


def _loaded(path: str, policy: str | None, sets: Sequence[str]) -> dict:
    from batchsim.app.compare import load_with_policy, scenario_data

    data = scenario_data(load_with_policy(path, policy, sets))
    if "disaggregation" in data and data["disaggregation"] is None:  # (set to null: as if never set)
        del data["disaggregation"]
    return data


def _field_default(name: str) -> Any:
    """A scenario field's plain default (a number, text, bool), or _MISSING."""
    from batchsim.app.config import Scenario

    field = Scenario.model_fields.get(name)
    d = getattr(field, "default", _MISSING)
    return d if isinstance(d, (int, float, str, bool)) else _MISSING


def _unset_defaults(data: dict) -> dict:
    """``data`` less the top-level fields that hold their plain default (written or not, the same scenario)."""
    return {k: v for k, v in data.items() if (d := _field_default(k)) is _MISSING or v != d or type(v) is not type(d)}


def run_command(path: str | Path, user_sets: Sequence[str], target: dict) -> str | None:
    """``batchsim run PATH [--policy P] --set ...`` whose scenario is ``target``; None if no
    such command is found (it is checked by loading it as ``batchsim run`` does)."""
    path = str(path)
    user = list(user_sets)
    base = _loaded(path, None, user)
    if "disaggregation" in base and "disaggregation" not in target:  # (a colocated row of a disaggregated file)
        user.append("disaggregation=null")
        base = _loaded(path, None, user)
    # (a field the file sets and the row's scenario leaves unset, such as a colocated file's
    # replicas in a disaggregated row: set back to its default, which says nothing)
    defaults = [f"{k}={_text(d)}" for k in base if k not in target
                if (d := _field_default(k)) is not _MISSING]
    user += defaults
    if defaults:
        base = _loaded(path, None, user)
    name = str(target.get("policy", {}).get("name"))
    swap = name if name != str(base.get("policy", {}).get("name")) else None
    tries = []

    def by_name(policy: str) -> None:
        try:
            sets = scenario_sets(_loaded(path, policy, user), target)
        except Exception:  # noqa: BLE001 - no swap gives it (then the policy is spelled out below)
            sets = None
        if sets is not None:  # (checked below: it must load as the row's scenario, --set policy keys too)
            tries.append((policy, user + sets))  # running it by name gives the policy as it ran

    if swap:
        by_name(swap)
    tries.append((None, user + scenario_sets(base, target)))  # the policy spelled out
    if not swap and name != "None":  # (the file's own policy, run by name: a name a preset would re-pick
        by_name(name)                # otherwise, and its policy_knobs entry, as the row ran it)
    for policy, sets in tries:
        try:
            if _unset_defaults(_loaded(path, policy, sets)) != _unset_defaults(target):
                continue
        except Exception:  # noqa: BLE001 - a candidate that does not load is not the command
            continue
        return shlex.join(["batchsim", "run", path, *(["--policy", policy] if policy else []),
                           *[a for s in sets for a in ("--set", s)]])
    return None
