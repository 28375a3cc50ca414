"""The configurations a plan searches: hardware x TP x policy x knob values.

Each configuration is the scenario with one replica, its ``hardware``,
``tensor_parallel_size`` and policy swapped (:func:`batchsim.app.compare.with_policy`:
the scenario's own policy keeps its knobs, another gets
``policy_knobs[name]`` or its defaults, and the KV knobs are shared), then
every ``--knob dotted.key=v1,v2`` value applied. A ``policy.*`` knob applies
only to the policies whose config has that field (``max_queue_delay_s``
means nothing to chunked prefill); a knob no chosen policy has is an error.
Every configuration is validated here, before any simulation runs.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any, Sequence

import yaml

from batchsim.app.config import Scenario, apply_overrides, scenario_from_dict
from batchsim.sim.errors import InputError

__all__ = ["PlanConfig", "parse_names", "parse_tps", "parse_knobs", "build_configs", "knob_label"]


@dataclass(frozen=True)
class PlanConfig:
    """One configuration: its label, axes and validated scenario (as a plain dict)."""

    label: str
    hardware: str
    tp: int
    policy: str
    knobs: tuple[tuple[str, Any], ...]
    scenario: dict


def parse_names(text: str | Sequence[str] | None, option: str) -> tuple[str, ...]:
    """``"a,b"`` (or a list) -> unique non-empty names in order."""
    items = text.split(",") if isinstance(text, str) else list(text or [])
    names = tuple(dict.fromkeys(s.strip() for s in items if s.strip()))
    if text is not None and not names:
        raise InputError("give at least one value", option)
    return names


def parse_tps(text: str | Sequence[int] | None) -> tuple[int, ...]:
    """``"1,2,4"`` -> tensor-parallel sizes (positive integers)."""
    out = []
    for s in parse_names([str(x) for x in text] if isinstance(text, (list, tuple)) else text, "--tp"):
        try:
            tp = int(s)
        except ValueError:
            raise InputError(f"not an integer: {s!r}", "--tp") from None
        if tp < 1:
            raise InputError(f"tensor-parallel sizes are >= 1, got {tp}", "--tp")
        out.append(tp)
    return tuple(dict.fromkeys(out))


def parse_knobs(items: Sequence[str] | None) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """``["policy.max_num_batched_tokens=256,512"]`` -> ``(("policy.max_num_batched_tokens", (256, 512)),)``.

    Values are parsed as YAML (``true``, ``0.5``, ``fp8``); a value cannot contain a comma.
    """
    out: dict[str, tuple[Any, ...]] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InputError(f"expected dotted.key=v1,v2,..., got {item!r}", "--knob")
        if key in ("policy", "policy.name", "hardware", "tensor_parallel_size"):
            raise InputError(f"{key} has its own option (--policies, --hardware, --tp)", "--knob")
        if key in out:
            raise InputError(f"{key} is given twice", "--knob")
        values = [_yaml_value(v.strip()) for v in raw.split(",") if v.strip()]
        if not values:
            raise InputError(f"{key}: give at least one value", "--knob")
        out[key] = tuple({json.dumps(v, sort_keys=True): v for v in values}.values())
    return tuple(out.items())


def _yaml_value(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def knob_label(knobs: Sequence[tuple[str, Any]]) -> str:
    """``policy.max_num_batched_tokens=512 dtype=fp8`` -> ``max_num_batched_tokens=512 dtype=fp8``."""
    return " ".join(f"{k.removeprefix('policy.')}={v}" for k, v in knobs)


def _applies(key: str, policy: str) -> bool:
    if not key.startswith("policy."):
        return True
    from batchsim.policies.registry import policy_class

    return key.split(".")[1] in policy_class(policy).Config.model_fields


def _config(base: Scenario, hardware: str, tp: int, policy: str, knobs: tuple) -> PlanConfig:
    from batchsim.app.compare import policy_config, scenario_data
    from batchsim.app.sweep import with_rate

    label = " ".join(x for x in (f"{hardware} tp{tp} {policy}", knob_label(knobs)) if x)
    data = scenario_data(base)
    data.update(hardware=hardware, tensor_parallel_size=tp, replicas=1)
    data.pop("horizon_s", None)  # NOTE: each point sets its own horizon (batchsim.app.capacity.worker)
    data = apply_overrides(data, [f"{k}={json.dumps(v)}" for k, v in knobs])
    sc = scenario_from_dict(data, f"configuration '{label}'")
    policy_config(sc)  # a bad knob value fails here, before any run
    with_rate(sc, 1.0)  # a trace with its own arrival times fails here
    return PlanConfig(label, hardware, tp, policy, tuple(knobs), data)


def build_configs(scenario: Scenario, hardware: Sequence[str] = (), tps: Sequence[int] = (),
                  policies: Sequence[str] = (), knobs: Sequence[tuple[str, Sequence[Any]]] = ()) -> list[PlanConfig]:
    """Every (hardware, TP, policy, knob values) configuration, in that nesting order."""
    from batchsim.app.compare import with_policy

    hws = tuple(hardware) or (scenario.hardware,)
    tp_list = tuple(tps) or (scenario.tensor_parallel_size,)
    names = tuple(policies) or (str(scenario.policy["name"]),)
    for key, _ in knobs:
        if not any(_applies(key, p) for p in names):
            raise InputError(f"{key}: none of the policies ({', '.join(names)}) has this knob", "--knob")
    configs: dict[str, PlanConfig] = {}
    for hw, tp, p in itertools.product(hws, tp_list, names):
        base = with_policy(scenario, p)
        mine = [(k, vals) for k, vals in knobs if _applies(k, p)]
        for combo in itertools.product(*(vals for _, vals in mine)):
            c = _config(base, hw, tp, p, tuple((k, v) for (k, _), v in zip(mine, combo)))
            configs.setdefault(c.label, c)
    return list(configs.values())
