"""`batchsim plan` with seeds: pooled points judged at an interval's upper end, capacity
intervals, interval-width sizing, common random numbers and the reproducing command."""

from __future__ import annotations

import json
import re
import shlex
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from batchsim.app.cli import app
from batchsim.app.config import load_scenario
from batchsim.app.capacity.planner import PlanSpec, plan, problem_lines, write_plan
from batchsim.app.capacity.search import FAIL, PASS, judge
from batchsim.app.capacity.worker import pool
from batchsim.sim.errors import InputError
from tests.test_plan_runs import TINY

ROOT = Path(__file__).resolve().parent.parent

# the tiny chat scenario of the plan tests (seed 3)
SLOS = {"p99_ttft_ms": 500.0, "p99_tpot_ms": 40.0}


def _file(tmp: Path, text: str = TINY) -> Path:
    path = tmp / "tiny.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _seed(value: float, **extra) -> dict:
    return {"p99_ttft_ms": value, "completed": 200, "measured_requests": 200, "num_requests": 200, **extra}


def test_a_pooled_point_is_judged_at_its_intervals_upper_end():
    runs = [_seed(80.0), _seed(90.0), _seed(100.0)]
    p = pool(runs, [0, 1, 2], {"p99_ttft_ms": 100.0})
    assert p["p99_ttft_ms"] == pytest.approx(90.0) and p["p99_ttft_ms_ci95"] == pytest.approx(24.84, abs=0.01)
    status, why = judge(p, {"p99_ttft_ms": 100.0})
    assert status == FAIL and "upper end 114.8" in why, why
    assert judge(p, {"p99_ttft_ms": 100.0}, bound="mean")[0] == PASS
    assert judge(p, {"p99_ttft_ms": 70.0}, bound="lower")[0] == PASS  # 90 - 24.8 < 70
    assert p["binding_metric"] == "p99_ttft_ms" and p["binding_ci_rel"] == pytest.approx(24.84 / 90, abs=1e-3)
    # one seed: no interval, every bound judges the value
    one = pool(runs[:1], [0], {"p99_ttft_ms": 100.0})
    assert one["binding_ci_rel"] is None
    assert {judge(one, {"p99_ttft_ms": 85.0}, bound=b)[0] for b in ("upper", "mean", "lower")} == {PASS}


def test_one_seed_that_drops_requests_fails_the_pooled_point_whatever_the_mean():
    runs = [_seed(10.0), _seed(10.0, all_unfinished=3), _seed(10.0)]
    status, why = judge(pool(runs, [0, 1, 2], {"p99_ttft_ms": 100.0}), {"p99_ttft_ms": 100.0})
    assert status == FAIL and why == "seed 1: 3 requests unfinished at the horizon"


@pytest.mark.parametrize("field, value, message", [
    ("seeds", 0, "--seeds"), ("max_seeds", 2, "--max-seeds"), ("ci_width", 0.0, "--ci-width"),
    ("seeds", True, "--seeds")])
def test_bad_seed_options_name_the_option(field, value, message):
    spec = PlanSpec(slos=SLOS, **{"seeds": 3, field: value})
    with pytest.raises(InputError) as e:
        spec.check()
    assert e.value.where == message


def test_seeded_plan_gives_an_interval_around_the_estimate_and_sizes_on_its_low_end(tmp_path):
    path = _file(tmp_path)
    sc = load_scenario(path)
    one = plan(sc, PlanSpec(slos=SLOS, seeds=1), tmp_path / "one", executor="serial", show_progress=False)
    many = plan(sc, PlanSpec(slos=SLOS, seeds=3, target_rate=50.0), tmp_path / "many", executor="serial",
                show_progress=False)
    r1, r = one.frame.iloc[0], many.frame.iloc[0]
    assert r1["seeds"] == 1 and r1["capacity_estimate_rps"] is None and r1["capacity_high_rps"] is None
    assert r["status"] == "ok" and r["seeds"] >= 3
    assert 0 < r["capacity_rps"] <= r["capacity_estimate_rps"] <= r["capacity_high_rps"]
    assert r["replicas"] == -(-50.0 // r["capacity_rps"])  # sized on the low end
    for k in SLOS:  # the metrics at capacity carry their half-widths, and meet the SLO at the upper end
        assert r[f"{k}_ci95"] > 0 and r[k] + r[f"{k}_ci95"] <= SLOS[k]
    # the same seeds for every configuration and rate: seed 3 + i, stored one file each
    seeds = {json.loads(p.read_text())["seed"] for p in (tmp_path / "many" / "points").glob("*.json")}
    assert {3, 4, 5} <= seeds <= set(range(3, 13))
    info = dict(many.info.details)
    assert "common random numbers" in info["seeds"] and "upper end" in info["seeds"]
    assert "no interval" in dict(one.info.details)["seeds"]


def test_seeds_grow_until_the_binding_interval_is_narrow_or_say_it_is_wide(tmp_path):
    path = _file(tmp_path)
    sc = load_scenario(path)
    tight = plan(sc, PlanSpec(slos=SLOS, seeds=2, max_seeds=4, ci_width=0.001), tmp_path / "t",
                 executor="serial", show_progress=False).frame.iloc[0]
    assert tight["seeds"] == 4 and not bool(tight["interval_ok"])
    lines = problem_lines(pd.DataFrame([tight.to_dict()]), 0.001)
    assert any(re.match(rf"WIDE {re.escape(tight['config'])}: at its capacity p99_\w+_ms is known to ±\d+% "
                        r"after 4 seeds \(asked ±0%\)", line) for line in lines), lines
    # (with 2 seeds t is 12.7: only 3 or more give a usable interval)
    loose = plan(sc, PlanSpec(slos=SLOS, seeds=3, max_seeds=8, ci_width=0.9), tmp_path / "t",
                 executor="serial", show_progress=False).frame.iloc[0]
    assert 3 <= loose["seeds"] < 8 and bool(loose["interval_ok"]) and loose["widest_ci_rel"] <= 0.9


def _points(out: Path) -> dict[tuple, dict]:
    """Each (configuration, rate, seed)'s point: the longest run of it (a point too short for a
    steady state is stored, then run again with more requests)."""
    recs = [json.loads(p.read_text()) for p in (out / "points").glob("*.json")]
    recs.sort(key=lambda r: r["scenario"]["workload"].get("num_requests") or 0)
    return {(r["config"], r["rate"], r["seed"]): r for r in recs}


def test_configurations_share_their_seeds_common_random_numbers(tmp_path):
    from batchsim.app.config import scenario_from_dict
    from batchsim.app.runner import build_parts

    path = _file(tmp_path)
    res = plan(load_scenario(path), PlanSpec(slos=SLOS, seeds=3, max_seeds=4, policies=("continuous", "chunked_prefill"),
                                             hardware=("h100-sxm", "h200")),
               tmp_path / "o", executor="serial", show_progress=False)
    assert set(res.frame["status"]) == {"ok"}
    pts = _points(tmp_path / "o")
    cfgs = sorted({c for c, _, _ in pts})
    assert len(cfgs) == 4
    for c in cfgs:  # every rate of every configuration: seeds 3, 4, ... in order, none skipped
        for rate in {r for cc, r, _ in pts if cc == c}:
            seeds = sorted(s for cc, r, s in pts if cc == c and r == rate)
            assert seeds == list(range(3, 3 + len(seeds))) and len(seeds) >= 1
    # the same seed gives every configuration the same requests (lengths; arrivals scale with the rate)
    def lengths(c: str, seed: int):
        rec = next(r for (cc, _, s), r in sorted(pts.items(), key=lambda kv: kv[0][1]) if cc == c and s == seed)
        wl = build_parts(scenario_from_dict(rec["scenario"]), path.parent).workload
        return list(wl.prompt_tokens), list(wl.output_tokens)
    # (a point lengthened for its short span runs more requests: the same first ones, then more)
    def same_start(a, b):
        k = min(len(a[0]), len(b[0]))
        return a[0][:k] == b[0][:k] and a[1][:k] == b[1][:k] and k >= 100

    for seed in (3, 4, 5):
        first = lengths(cfgs[0], seed)
        assert all(same_start(lengths(c, seed), first) for c in cfgs[1:])
    assert not same_start(lengths(cfgs[0], 3), lengths(cfgs[0], 4))


def test_a_scenario_without_a_seed_plans_with_seed_0(tmp_path):
    path = _file(tmp_path, TINY.replace("seed: 3\n", ""))
    res = plan(load_scenario(path), PlanSpec(slos=SLOS, seeds=3, max_seeds=3), tmp_path / "o", executor="serial",
               show_progress=False)
    assert res.frame.iloc[0]["status"] == "ok"
    assert {s for _, _, s in _points(tmp_path / "o")} == {0, 1, 2}


def test_one_seed_to_start_still_sizes_up_to_max_seeds(tmp_path):
    row = plan(load_scenario(_file(tmp_path)), PlanSpec(slos=SLOS, seeds=1, max_seeds=5), tmp_path / "o",
               executor="serial", show_progress=False).frame.iloc[0]
    assert row["seeds"] >= 2 and row["widest_ci_rel"] is not None and row["capacity_estimate_rps"] is not None


def test_a_configuration_failing_only_at_the_upper_ends_is_undecided():
    from batchsim.app.capacity.grid import PlanConfig
    from batchsim.app.capacity.planner import plan_rows
    from batchsim.app.capacity.worker import ConfigOutcome

    spec = PlanSpec(slos={"p99_ttft_ms": 100.0})
    cfg = PlanConfig("h100-sxm tp1 continuous", "h100-sxm", 1, "continuous", (), {})
    out = ConfigOutcome(cfg.label, "SLO not met", limit_reason="p99_ttft_ms 50 ± 74.5: ...", estimate=12.5)
    frame = plan_rows([cfg], [out], spec, {"h100-sxm": 3.0})
    assert problem_lines(frame) == ["UNDECIDED h100-sxm tp1 continuous: no rate meets the SLO at its intervals' "
                                    "upper ends, but the means meet it up to 12.5 req/s; more seeds (--max-seeds) "
                                    "or requests per point would decide"]


def test_each_row_reproduces_with_its_batchsim_run_command(tmp_path, monkeypatch):
    path = _file(tmp_path)
    args = ["plan", str(path), "--slo", "p99_ttft_ms=500", "--slo", "p99_tpot_ms=40", "--policies",
            "continuous,chunked_prefill", "--knob", "policy.max_num_seqs=32,64", "--seeds", "2",
            "--max-seeds", "2", "--executor", "serial", "--set", "workload.num_requests=120", "--out",
            str(tmp_path / "plan")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "reproduce its first seed: batchsim run" in res.output
    rows = json.loads((tmp_path / "plan" / "plan.json").read_text())["configurations"]
    pts = _points(tmp_path / "plan")
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows)
    for i, row in enumerate(rows):
        facts = json.loads(row["policy_knobs"])
        assert facts["name"] == row["policy"] and row["kv_blocks"] > 0 and row["kv_capacity_tokens"] > 0
        cmd = shlex.split(row["reproduce"])
        assert cmd[:3] == ["batchsim", "run", str(path)] and "workload.num_requests=120" in cmd
        out = tmp_path / f"run{i}"
        ran = CliRunner().invoke(app, [*cmd[1:], "--out", str(out)])
        assert ran.exit_code == 0, ran.output
        summary = json.loads((out / "summary.json").read_text())
        point = pts[(row["config"], row["capacity_rps"], 3)]["metrics"]
        for k in ("p99_ttft_ms", "p99_tpot_ms", "output_throughput", "completed"):
            assert summary[k] == point[k], (row["config"], k)
        assert summary["provenance"]["policy"] == facts


def test_plan_outputs_are_one_set_and_keep_the_points(tmp_path):
    path = _file(tmp_path)
    out = tmp_path / "o"
    sc = load_scenario(path)
    first = plan(sc, PlanSpec(slos=SLOS, seeds=2, max_seeds=2), out, executor="serial", show_progress=False)
    write_plan(first, out)
    old = {n: (out / n).read_bytes() for n in ("plan.csv", "plan.json", "plan.html")}
    # a killed writer's leftovers beside the folder are cleaned by the next write
    orphan = tmp_path / f".{out.name}.tmp-999999-x"
    orphan.mkdir()
    (orphan / "plan.csv").write_text("half")
    second = plan(sc, PlanSpec(slos={"p99_ttft_ms": 300.0}, seeds=2, max_seeds=2), out, executor="serial",
                  show_progress=False)
    write_plan(second, out)
    new = {n: (out / n).read_bytes() for n in ("plan.csv", "plan.json", "plan.html")}
    assert all(new[n] != old[n] for n in new)  # every file is the second plan's: no mix
    assert json.loads(new["plan.json"])["slos"] == {"p99_ttft_ms": 300.0}
    assert not orphan.exists() and (out / "points").is_dir() and any((out / "points").iterdir())
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["files"] == {n: len(b) for n, b in new.items()}
    # a resumed plan writes the same bytes (plan.html says nothing about what was reused)
    again = plan(sc, PlanSpec(slos={"p99_ttft_ms": 300.0}, seeds=2, max_seeds=2), out, executor="serial",
                 show_progress=False)
    assert again.simulated == 0
    write_plan(again, out)
    assert {n: (out / n).read_bytes() for n in new} == new


def _plan_chat(seed: int, out: str) -> dict:
    res = CliRunner().invoke(app, ["plan", str(ROOT / "examples" / "plan-chat.yaml"), "--slo", "p99_ttft_ms=1500",
                                   "--slo", "p99_tpot_ms=60", "--target-rate", "40", "--set", f"seed={seed}",
                                   "--executor", "serial", "--out", out])
    assert res.exit_code == 0, res.output
    return json.loads((Path(out) / "plan.json").read_text())["configurations"][0]


@pytest.mark.slow
def test_plan_chat_interval_holds_five_reruns_with_other_base_seeds(tmp_path):
    """docs/capacity-planning.md "Seeds and intervals": the chosen configuration's capacity interval,
    and 5 reruns with other base seeds whose estimates fall inside it."""
    seeds = [0, 1000, 2000, 3000, 4000, 5000]
    with ProcessPoolExecutor(2) as ex:
        rows = list(ex.map(_plan_chat, seeds, [str(tmp_path / f"s{s}") for s in seeds]))
    base, reruns = rows[0], rows[1:]
    lo, hi = base["capacity_rps"], base["capacity_high_rps"]
    assert lo < base["capacity_estimate_rps"] <= hi
    inside = [lo <= r["capacity_estimate_rps"] <= hi for r in reruns]
    assert all(inside), [(r["capacity_estimate_rps"], lo, hi) for r in reruns]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_ctrl_c_on_a_pool_plan_exits_at_once_saying_what_it_kept(tmp_path):
    import sys

    from tests.cli_helpers import ctrl_c_when

    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "batchsim", "plan", str(ROOT / "examples" / "plan-chat.yaml"), "--slo",
           "p99_ttft_ms=1500", "--slo", "p99_tpot_ms=60", "--hardware", "a100-80gb,h100-sxm", "--tp", "1,2",
           "--executor", "local", "--workers", "2", "--out", str(out)]
    points = out / "points"
    p, stdout, err, took, _ = ctrl_c_when(cmd, lambda: points.is_dir() and len(list(points.glob("*.json"))) >= 5)
    assert p.returncode == 130, err
    kept = re.fullmatch(rf"interrupted: (\d+) finished points kept in {re.escape(str(out / 'points'))}; "
                        r"rerun the same command to resume", err.strip())
    assert kept and int(kept[1]) >= 5, err
    assert "Traceback" not in err + stdout and not (out / "plan.csv").exists()
    assert took < 3.0, f"exit took {took:.1f} s after Ctrl-C"
