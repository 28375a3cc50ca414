"""What a plan costs: the price table, replicas for a target rate, $/hour and $/1M tokens.

Prices are USD per GPU-hour from ``batchsim/calibrate/prices.yaml`` (an editable
table of example on-demand figures), overridden per run by ``--price
HW=USD``. A configuration with capacity ``c`` requests/s per replica and
tensor-parallel size ``tp`` needs ``ceil(target / c)`` replicas, i.e.
``replicas x tp`` GPUs, for a target rate; $/1M output tokens divides the
$/hour by the output tokens that target produces in an hour. Without a
target, one replica at its capacity is priced (the best $/token it reaches).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, Sequence

import yaml

from batchsim.sim.errors import InputError

__all__ = ["PRICES_FILE", "load_prices", "parse_prices", "price_of", "cost_columns"]

PRICES_FILE = Path(__file__).resolve().parents[2] / "calibrate" / "prices.yaml"


def load_prices(path: str | Path | None = None) -> dict[str, float]:
    """``{hardware name: USD per GPU-hour}`` from a price table YAML (``prices:`` mapping)."""
    p = Path(path) if path is not None else PRICES_FILE
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise InputError(f"cannot read the price table: {e.strerror or e}", str(p)) from None
    except yaml.YAMLError as e:
        raise InputError(f"not valid YAML: {e}", str(p)) from None
    table = data.get("prices") if isinstance(data, dict) else None
    if not isinstance(table, dict):
        raise InputError("expected a 'prices:' mapping of hardware name -> USD per GPU-hour", str(p))
    return {str(k): _usd(v, f"{p}: prices.{k}") for k, v in table.items()}


def _usd(value: object, where: str) -> float:
    try:
        usd = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InputError(f"not a number: {value!r}", where) from None
    if not (usd > 0 and math.isfinite(usd)):
        raise InputError(f"a price must be a positive number of USD per GPU-hour, got {value!r}", where)
    return usd


def parse_prices(items: Sequence[str] | None) -> dict[str, float]:
    """``["h100-sxm=2.49", "h200=3.5,a100-80gb=1.4"]`` -> ``{name: USD per GPU-hour}``."""
    from batchsim.app.capacity.search import name_values

    return {name: _usd(raw, f"--price {name}") for name, raw in name_values(items, "--price", "HW=USD_PER_GPU_HOUR")}


def price_of(hardware: str, profile_name: str, prices: Mapping[str, float]) -> float:
    """The price of ``hardware`` (as given, then by its profile's name); InputError if none."""
    for key in (hardware, profile_name):
        if key in prices:
            return prices[key]
    raise InputError(f"no price for hardware {hardware!r}; add it to {PRICES_FILE} or pass "
                     f"--price {profile_name}=USD_PER_GPU_HOUR", "--price")


def cost_columns(capacity: float, tp: int, price: float, mean_output_tokens: float,
                 target_rate: float | None) -> dict[str, float | int | None]:
    """Replicas, GPUs, $/hour and $/1M output tokens of one configuration.

    ``capacity`` is requests/s per replica (0 when no rate met the SLO: then
    every column is None). Without ``target_rate`` one replica is priced at
    its capacity.
    """
    if capacity <= 0:
        return {"replicas": None, "gpus": None, "usd_per_hour": None, "usd_per_1m_output_tokens": None}
    load = capacity if target_rate is None else target_rate
    # NOTE: the 1e-9 keeps 10 / 5 = 2.0000000001 from asking for a third replica.
    replicas = 1 if target_rate is None else max(1, math.ceil(target_rate / capacity - 1e-9))
    gpus = replicas * tp
    usd_hour = gpus * price
    tokens_hour = load * mean_output_tokens * 3600.0
    return {"replicas": replicas, "gpus": gpus, "usd_per_hour": usd_hour,
            "usd_per_1m_output_tokens": usd_hour / tokens_hour * 1e6 if tokens_hour > 0 else None}
