"""The configurations a plan searches: hardware x TP x policy x knob values.

Each configuration is the scenario with one replica, its ``hardware``,
``tensor_parallel_size`` and policy swapped (:func:`batchsim.app.compare.with_policy`:
the scenario's own policy keeps its knobs, another gets
``policy_knobs[name]`` or its defaults, and the KV knobs are shared; a policy
named by ``--policies`` is the user's, so an engine preset resolved again for the
configuration keeps it), then every ``--knob dotted.key=v1,v2`` value applied.
Without ``--policies`` the scenario's own policy runs as it resolves for each
configuration, and the row names that policy. A ``policy.*`` knob applies
only to the policies whose config has that field (``max_queue_delay_s``
means nothing to chunked prefill); a knob no chosen policy has is an error.
Every configuration is validated here, before any simulation runs.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from typing import Any, Sequence

import yaml

from batchsim.app.config import Scenario, apply_overrides, scenario_from_dict
from batchsim.sim.errors import InputError

__all__ = ["PlanConfig", "parse_names", "parse_tps", "parse_knobs", "parse_deployments", "build_configs", "knob_label", "is_closed",
           "COLOCATED"]

COLOCATED = "colocated"


@dataclass(frozen=True)
class PlanConfig:
    """One configuration: its label, axes and validated scenario (as a plain dict)."""

    label: str
    hardware: str
    tp: int
    policy: str
    knobs: tuple[tuple[str, Any], ...]
    scenario: dict
    # a disaggregated deployment: (hardware, GPUs) of its prefill and decode pools, what one unit
    # of it costs; empty for a colocated replica (``tp`` GPUs of ``hardware``)
    pools: tuple[tuple[str, int], ...] = ()
    deployment: str = COLOCATED  # colocated, or xPyD
    closed: bool = False  # a closed loop: its plan searches clients, not arrival rates

    @property
    def gpus(self) -> int:
        """GPUs in one unit: a colocated replica's ``tp``, or the deployment's pools'."""
        return sum(g for _, g in self.pools) if self.pools else self.tp


def is_closed(scenario: Scenario) -> bool:
    """A closed-loop scenario (``workload.arrival.process: closed``): its plan searches clients."""
    arrival = scenario.workload.arrival
    return arrival is not None and getattr(arrival, "process", None) == "closed"


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


def parse_deployments(text: str | Sequence[str] | None) -> tuple[str | tuple[int, int], ...]:
    """``"colocated,1P1D,1P2D"`` -> ``("colocated", (1, 1), (1, 2))``: xPyD is x prefill and y decode
    replicas (also written ``x:y``)."""
    out: list[str | tuple[int, int]] = []
    for name in parse_names(text, "--disagg"):
        if name.lower() == COLOCATED:
            out.append(COLOCATED)
            continue
        m = re.fullmatch(r"\s*(\d+)\s*[pP:]\s*(\d+)\s*[dD]?\s*", name)
        if not m or (name.count(":") == 0 and not re.search(r"[pP]", name)):
            raise InputError(f"expected colocated or xPyD such as 1P2D (or 1:2), got {name!r}", "--disagg")
        x, y = int(m.group(1)), int(m.group(2))
        if x < 1 or y < 1:
            raise InputError(f"{name}: a deployment needs at least one prefill and one decode replica", "--disagg")
        out.append((x, y))
    return tuple(dict.fromkeys(out))


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


def _config(base: Scenario, hardware: str, tp: int, policy: str | None, knobs: tuple,
            deployment: str | tuple[int, int] = COLOCATED, preset_pick: str | None = None) -> PlanConfig:
    """One configuration; ``policy`` None: the scenario's own, as it resolves for the configuration
    (an engine preset's pick may follow the device, the context or the preset knob). ``preset_pick``:
    the scenario's own policy when its engine preset picked it."""
    from batchsim.app.compare import policy_config, scenario_data
    from batchsim.app.sweep import with_concurrency, with_rate

    data = scenario_data(base)
    data.update(hardware=hardware, tensor_parallel_size=tp)
    data.pop("horizon_s", None)  # NOTE: each point sets its own horizon (batchsim.app.capacity.worker)
    if deployment == COLOCATED:
        data["replicas"] = 1
        data.pop("disaggregation", None)
        name = policy
    else:  # (the scenario's own pools, or its top level, at x prefill and y decode replicas)
        x, y = deployment
        pools = dict(data.get("disaggregation") or {})
        pools["prefill"] = {**pools.get("prefill", {}), "replicas": x}
        pools["decode"] = {**pools.get("decode", {}), "replicas": y}
        data["disaggregation"] = pools
        data.pop("replicas", None)
        data.pop("router", None)
        name = f"{x}P{y}D"
    def titled(what: str) -> str:
        return " ".join(v for v in (f"{hardware} tp{tp} {what}", knob_label(knobs)) if v)

    data = apply_overrides(data, [f"{k}={json.dumps(v)}" for k, v in knobs])
    sc = scenario_from_dict(data, f"configuration '{titled(name or base.policy['name'])}'")
    if name is None:
        name = policy = str(sc.policy["name"])
    elif name == preset_pick and "name" not in sc.engine_preset_values:
        # (asked for by name, the user's choice: with_policy. Where the preset picks it here too, it is
        # recorded as the preset's again, as the scenario loaded for this configuration has it)
        alt = scenario_data(sc)
        alt["engine_preset_values"] = {**alt.get("engine_preset_values", {}), "name": name}
        again = scenario_from_dict(alt, f"configuration '{titled(name)}'")
        if again.policy == sc.policy:
            data, sc = alt, again
    label = titled(name)
    policy_config(sc)  # a bad knob value fails here, before any run
    closed = is_closed(sc)
    if closed:
        with_concurrency(sc, 1)  # (a closed loop: the plan searches its clients)
    else:
        with_rate(sc, 1.0)  # a trace with its own arrival times fails here
    if deployment == COLOCATED:
        return PlanConfig(label, hardware, tp, policy, tuple(knobs), data, closed=closed)
    d = sc.disaggregation
    pools_cost = tuple((p.hardware or sc.hardware, p.replicas * (p.tensor_parallel_size or sc.tensor_parallel_size))
                       for p in (d.prefill, d.decode))
    pol = lambda p: (p.policy or sc.policy)["name"]  # noqa: E731
    return PlanConfig(label, hardware, tp, f"{pol(d.prefill)}/{pol(d.decode)}", tuple(knobs), data,
                      pools=pools_cost, deployment=name, closed=closed)


def build_configs(scenario: Scenario, hardware: Sequence[str] = (), tps: Sequence[int] = (),
                  policies: Sequence[str] = (), knobs: Sequence[tuple[str, Sequence[Any]]] = (),
                  deployments: Sequence[str | tuple[int, int]] = ()) -> list[PlanConfig]:
    """Every (hardware, TP, policy, knob values) configuration, in that nesting order, for each of
    ``deployments`` (colocated, and xPyD ratios: a disaggregated deployment's pools take their
    policies from the scenario's ``disaggregation`` section, else its policy, so the policy axis
    is the colocated configurations'). No ``deployments``: the scenario's own (colocated, or its
    disaggregation's ratio)."""
    from batchsim.app.compare import with_policy

    hws = tuple(hardware) or (scenario.hardware,)
    tp_list = tuple(tps) or (scenario.tensor_parallel_size,)
    names = tuple(policies) or (str(scenario.policy["name"]),)
    for key, _ in knobs:
        if not any(_applies(key, p) for p in names):
            raise InputError(f"{key}: none of the policies ({', '.join(names)}) has this knob", "--knob")
    d = scenario.disaggregation
    kinds = tuple(deployments) or ((COLOCATED,) if d is None else ((d.prefill.replicas, d.decode.replicas),))
    colocated = scenario
    if d is not None and COLOCATED in kinds:  # (the scenario without its pools: its policy is swapped)
        from batchsim.app.compare import scenario_data

        data = scenario_data(scenario)
        data.pop("disaggregation")
        colocated = scenario_from_dict(data, "the scenario, colocated")
    preset_pick = str(colocated.policy["name"]) if "name" in colocated.engine_preset_values else None
    configs: dict[str, PlanConfig] = {}
    for kind in kinds:
        own = (str(scenario.policy["name"]),)  # (a deployment's pools name their policies themselves)
        for hw, tp, p in itertools.product(hws, tp_list, names if kind == COLOCATED else own):
            # (a policy asked for by name is the user's: with_policy; else the scenario's own runs as
            # it resolves for each configuration, and the row names what resolved)
            named = kind == COLOCATED and bool(policies)
            base = with_policy(colocated, p) if named else (colocated if kind == COLOCATED else scenario)
            # (a disaggregation.* knob, such as a pool's hardware, is the deployments' alone)
            mine = [(k, vals) for k, vals in knobs if _applies(k, p)
                    and not (kind == COLOCATED and k.startswith("disaggregation."))]
            for combo in itertools.product(*(vals for _, vals in mine)):
                c = _config(base, hw, tp, p if named or kind != COLOCATED else None,
                            tuple((k, v) for (k, _), v in zip(mine, combo)), kind, preset_pick)
                configs.setdefault(c.label, c)
    return list(configs.values())
