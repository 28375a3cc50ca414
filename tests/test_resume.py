"""compare and sweep resume from their stored points, write their outputs as one set, and
stop at once on Ctrl-C saying what they kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from batchsim.app import compare as compare_mod
from batchsim.app import sweep as sweep_mod
from batchsim.app.cli import main
from batchsim.app.compare import POINT_FORMAT, read_point, write_point
from batchsim.app.workers import Interrupted, interrupted, run_tasks
from batchsim.sim.io import MANIFEST
from tests.cli_helpers import ctrl_c_when

PINNED = Path(__file__).parent / "golden" / "compare_pinned.yaml"


def compare_args(seeds: int) -> list[str]:
    return ["compare", str(PINNED), "--policies", "static,continuous", "--seeds", str(seeds),
            "--set", "workload.num_requests=16", "--executor", "serial"]


COMPARE = compare_args(2)
SWEEP = ["sweep", str(PINNED), "--rates", "2,40", "--policies", "continuous,static",
         "--set", "workload.num_requests=12", "--seeds", "1", "--executor", "serial"]


def cli(monkeypatch, capsys, args: list[str]) -> tuple[int, str, str]:
    """Run ``batchsim ARGS`` in-process: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["batchsim", *args])
    code = 0
    try:
        main()
    except SystemExit as e:
        code = e.code or 0
    out, err = capsys.readouterr()
    return code, out, err


def files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (points included), by relative path."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def outputs(folder: Path) -> dict[str, bytes]:
    return {k: v for k, v in files(folder).items() if not k.startswith("points/")}


def point_files(folder: Path) -> list[Path]:
    return sorted((folder / "points").glob("*.json"))


def points_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("points:"))


@pytest.mark.parametrize("args, n, outs", [
    (COMPARE, 4, {"summary.csv", "runs.csv", "report.html", "latency_cdf.png", "timelines.png"}),
    (SWEEP, 4, {"sweep.csv", "sweep_runs.csv", "sweep.png", "report.html"}),
], ids=["compare", "sweep"])
def test_rerun_reuses_points_and_writes_byte_identical_outputs(tmp_path, monkeypatch, capsys, args, n, outs):
    out = tmp_path / "o"
    code, text, err = cli(monkeypatch, capsys, [*args, "--out", str(out)])
    assert code == 0, err
    assert points_line(text) == f"points: {n} simulated, 0 reused from {out / 'points'}"
    first = files(out)
    assert outs <= set(first) and MANIFEST in first and len(point_files(out)) == n
    assert set(json.loads(first[MANIFEST])["files"]) == set(outputs(out)) - {MANIFEST}

    code, text, _ = cli(monkeypatch, capsys, [*args, "--out", str(out)])  # nothing left to simulate
    assert code == 0 and points_line(text) == f"points: 0 simulated, {n} reused from {out / 'points'}"
    assert files(out) == first

    for p in point_files(out)[:2]:  # as if the first run had been killed before these finished
        p.unlink()
        p.with_suffix(".npz").unlink(missing_ok=True)
    code, text, _ = cli(monkeypatch, capsys, [*args, "--out", str(out)])
    assert code == 0 and points_line(text) == f"points: 2 simulated, {n - 2} reused from {out / 'points'}"
    assert files(out) == first  # every output and every point, byte for byte


def test_a_changed_scenario_simulates_again(tmp_path, monkeypatch, capsys):
    out = tmp_path / "o"
    assert cli(monkeypatch, capsys, [*SWEEP, "--out", str(out)])[0] == 0
    code, text, _ = cli(monkeypatch, capsys, [*SWEEP, "--set", "seed=8", "--out", str(out)])
    assert code == 0 and points_line(text).startswith("points: 4 simulated, 0 reused")
    assert len(point_files(out)) == 8


def _interrupt_after(monkeypatch, module, calls: int) -> None:
    """The module's simulate_task raises KeyboardInterrupt (Ctrl-C) on call ``calls + 1``."""
    real, seen = module.simulate_task, []

    def simulate(task):
        if len(seen) == calls:
            raise KeyboardInterrupt
        seen.append(task)
        return real(task)

    monkeypatch.setattr(module, "simulate_task", simulate)


@pytest.mark.parametrize("args, module, n", [(COMPARE, compare_mod, 4), (SWEEP, sweep_mod, 4)],
                         ids=["compare", "sweep"])
def test_interrupted_run_keeps_its_points_and_the_rerun_finishes_it(tmp_path, monkeypatch, capsys, args, module, n):
    fresh = tmp_path / "fresh"
    assert cli(monkeypatch, capsys, [*args, "--out", str(fresh)])[0] == 0
    out = tmp_path / "o"
    with monkeypatch.context() as m:
        _interrupt_after(m, module, 3)
        code, text, err = cli(monkeypatch, capsys, [*args, "--out", str(out)])
    assert code == 130
    assert err.strip() == (f"interrupted: 3 finished points kept in {out / 'points'}; "
                           "rerun the same command to resume")
    assert "Traceback" not in err and len(point_files(out)) == 3
    assert sorted(p.name for p in out.iterdir()) == ["points"]  # no output set: none was finished
    code, text, _ = cli(monkeypatch, capsys, [*args, "--out", str(out)])
    assert code == 0 and points_line(text) == f"points: 1 simulated, 3 reused from {out / 'points'}"
    assert outputs(out) == outputs(fresh)


def test_library_interrupt_says_how_many_points_are_kept(tmp_path, monkeypatch):
    from batchsim.app.config import load_scenario

    sc = load_scenario(PINNED, ["workload.num_requests=10"])
    _interrupt_after(monkeypatch, sweep_mod, 1)
    with pytest.raises(Interrupted, match=r"^interrupted: 1 finished point kept in .*points; rerun"):
        sweep_mod.sweep(sc, [2, 4], ["continuous"], executor="serial", out_dir=tmp_path, show_progress=False)
    with pytest.raises(Interrupted, match="0 finished points not stored"):
        sweep_mod.sweep(sc, [2, 4], ["continuous"], executor="serial", show_progress=False)


def test_interrupted_helper_text():
    assert interrupted(12, "runs/plan-x/points").message == (
        "interrupted: 12 finished points kept in runs/plan-x/points; rerun the same command to resume")
    assert isinstance(interrupted(1, "d"), BaseException) and not isinstance(interrupted(1, "d"), Exception)


def test_outputs_are_one_set_never_a_mix(tmp_path, monkeypatch, capsys):
    out = tmp_path / "o"
    assert cli(monkeypatch, capsys, [*COMPARE, "--out", str(out)])[0] == 0
    two_seeds = outputs(out)
    assert "runs.csv" in two_seeds

    # a writer that dies in the middle of the new set leaves the old set whole, and no temporary folder
    from batchsim.reports import report

    real, calls = report.write_csv, []

    def dying(path, frame):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(path, frame)

    with monkeypatch.context() as m:
        m.setattr(report, "write_csv", dying)
        code, _, err = cli(monkeypatch, capsys, [*compare_args(3), "--out", str(out)])
    assert code == 130 and err.strip().startswith("interrupted: 6 finished points kept in ")
    assert outputs(out) == two_seeds
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]

    # a killed writer's leftovers (its temporary folder beside OUT, a point's temporary file) are cleaned
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = tmp_path / f".o.tmp-{dead.pid}-abc"
    orphan.mkdir()
    (orphan / "summary.csv").write_text("half")
    stale = out / "points" / ".0123.json.xyz.tmp"
    stale.write_text("{")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    code, text, err = cli(monkeypatch, capsys, [*compare_args(1), "--out", str(out)])
    assert code == 0 and points_line(text).startswith("points: 0 simulated, 2 reused"), err
    new = outputs(out)
    assert "runs.csv" not in new  # the old set's file that the new set lacks is gone
    assert set(json.loads(new[MANIFEST])["files"]) == set(new) - {MANIFEST}
    assert not orphan.exists() and not stale.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]
    assert len(point_files(out)) == 6  # the points survive the set swap


def test_points_round_trip_exactly(tmp_path):
    requests = pd.DataFrame({
        "rid": np.arange(4, dtype=np.int64), "status": pd.Series(["completed", "rejected", None, ""], dtype="str"),
        "arrival": [0.1, 0.2, 1e-300, 3.0], "admitted": [0.5, np.nan, np.nan, -0.0],
        "ttft": [np.nan, 1.0, 2.0, np.inf], "tpot": [0.1, 0.2, 0.3, 0.4], "e2el": [1.0, 2.0, 3.0, 4.0]})
    steps = pd.DataFrame({c: np.zeros(0, dtype=np.int32 if c in ("replica", "num_seqs") else float)
                          for c in compare_mod.REPORT_RECORDS["steps"]})
    itl = pd.DataFrame({"gap": [0.01, np.nan, 0.03], "count": np.array([2, 1, 5], dtype=np.int64)})
    summary = {"x": float("nan"), "y": np.float64(0.1) + 0.2, "n": np.int64(3), "w": ("a", "b"), "none": None}
    record, frames = write_point(tmp_path, "k", {"kind": "compare", "summary": summary},
                                 {"requests": requests, "steps": steps, "itl": itl})
    found = read_point(tmp_path, "k", "compare", records=True)
    assert found is not None and found[0]["format"] == POINT_FORMAT
    for name, frame in (("requests", requests), ("steps", steps), ("itl", itl)):
        for got in (frames[name], found[1][name]):
            pd.testing.assert_frame_equal(got, frame, check_exact=True)
            assert list(got.dtypes) == list(frame.dtypes)
    assert np.signbit(found[1]["requests"]["admitted"].iloc[3])
    s = found[0]["summary"]
    assert np.isnan(s["x"]) and s["y"] == 0.1 + 0.2 and s["n"] == 3 and s["w"] == ["a", "b"] and s["none"] is None
    assert found[0] == {**record, "summary": found[0]["summary"]} and record["summary"]["y"] == s["y"]
    assert read_point(tmp_path, "k", "sweep") is None  # another kind's point is not this one
    (tmp_path / "k.npz").write_bytes(b"damaged")
    assert read_point(tmp_path, "k", "compare", records=True) is None  # simulated again
    assert read_point(tmp_path, "missing", "compare") is None


def _slow_task(x: float) -> float:
    time.sleep(x)
    return x


def test_stopping_early_kills_the_pool_at_once():
    t0 = time.monotonic()
    it = run_tasks(_slow_task, [0.05, 30.0, 30.0], "local", workers=2)
    assert next(it) == (0, 0.05)
    it.close()  # (a Ctrl-C or any error in the consumer, with contextlib.closing)
    assert time.monotonic() - t0 < 10.0


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_ctrl_c_on_a_process_pool_sweep_exits_at_once(tmp_path):
    """A terminal's Ctrl-C (SIGINT to the whole process group) on a sweep with two pool workers:
    one point finished (500 req/s is quick), two running that would take ~10 s more (0.5 req/s),
    one waiting; batchsim exits within a few seconds (generous: a 2-core machine is noisy),
    130, with one line saying what it kept."""
    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "batchsim", "sweep", str(PINNED), "--rates", "0.5,500", "--policies", "continuous,static",
           "--set", "workload.num_requests=3000", "--set", "engine=python", "--seeds", "1", "--executor", "local",
           "--workers", "2", "--out", str(out)]
    t0 = time.monotonic()

    def started(p):  # (the fast point (500 req/s) is in; the slow one is running)
        return time.monotonic() - t0, Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()

    p, stdout, err, took, (first, workers) = ctrl_c_when(cmd, lambda: bool(point_files(out)), started)
    assert p.returncode == 130, err
    kept = len(point_files(out))  # (the fast points: how many finished before the signal varies with load)
    noun = "point" if kept == 1 else "points"
    assert err.strip() == f"interrupted: {kept} finished {noun} kept in {out / 'points'}; rerun the same command to resume"
    assert "Traceback" not in err and "Traceback" not in stdout
    assert took < 3.0, f"exit took {took:.1f} s after Ctrl-C (the first point took {first:.1f} s)"
    assert 1 <= kept < 4 and not (out / "sweep.csv").exists()
    assert len(workers) == 2
    deadline = time.monotonic() + 5
    while any(_alive(int(w)) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(int(w)) for w in workers)  # the pool's workers were killed, not left running


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_an_edited_input_file_is_simulated_again_not_read_from_a_stale_point(tmp_path, monkeypatch, capsys):
    """A point's name covers the contents of the files its scenario names (here a hardware
    profile given as a path), not only the scenario's text."""
    hw = tmp_path / "myhw.yaml"
    shipped = Path(__file__).parents[1] / "batchsim" / "calibrate" / "profiles" / "h100-sxm.yaml"
    hw.write_text(shipped.read_text())
    args = ["compare", str(PINNED), "--policies", "continuous", "--seeds", "1", "--set", "workload.num_requests=16",
            "--set", f"hardware={hw}", "--executor", "serial"]
    out = tmp_path / "o"
    assert cli(monkeypatch, capsys, [*args, "--out", str(out)])[0] == 0
    code, stdout, _ = cli(monkeypatch, capsys, [*args, "--out", str(out)])
    assert code == 0 and points_line(stdout).startswith("points: 0 simulated, 1 reused"), stdout
    hw.write_text(shipped.read_text().replace("hbm_bandwidth_gbs: 3350.0", "hbm_bandwidth_gbs: 1000.0"))
    code, stdout, _ = cli(monkeypatch, capsys, [*args, "--out", str(out)])
    assert code == 0 and points_line(stdout).startswith("points: 1 simulated, 0 reused"), stdout


def test_a_resumed_sweep_keeps_each_rows_seed_index(tmp_path, monkeypatch, capsys):
    """Seed 1 of a 2-seed sweep is the same simulation as seed 0 of one with seed + 1, but its
    row says seed_index 1: the index is part of the point's name, so a resume is byte-identical."""
    base = ["sweep", str(PINNED), "--rates", "4", "--policies", "static", "--set", "workload.num_requests=12",
            "--executor", "serial"]
    shared, fresh = tmp_path / "s", tmp_path / "f"
    assert cli(monkeypatch, capsys, [*base, "--seeds", "2", "--out", str(shared)])[0] == 0
    later = [*base, "--seeds", "1", "--set", "seed=1"]
    assert cli(monkeypatch, capsys, [*later, "--out", str(shared)])[0] == 0
    assert cli(monkeypatch, capsys, [*later, "--out", str(fresh)])[0] == 0
    assert outputs(shared) == outputs(fresh)


def test_a_writer_killed_while_carrying_points_across_the_swap_loses_nothing(tmp_path, monkeypatch):
    """points/ is moved into the new set's folder just before the swap; a writer killed right
    there leaves it in an orphan folder, and the next write moves it back."""
    from batchsim.sim import io

    out = tmp_path / "o"
    io.write_set(out, {"a.csv": lambda p: p.write_text("1")})
    (out / "points").mkdir()
    (out / "points" / "k.json").write_text("{}")
    real = os.rename
    calls = []

    def killed(src, dst):
        calls.append((src, dst))
        if Path(src) == out:  # after points/ went into the new folder, before the swap
            raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(io.os, "rename", killed)
    with pytest.raises(KeyboardInterrupt):
        io.write_set(out, {"a.csv": lambda p: p.write_text("2")})
    monkeypatch.setattr(io.os, "rename", real)
    assert (out / "points" / "k.json").exists() and (out / "a.csv").read_text() == "1"  # the old set, whole
    # a kill -9 at the same moment: points/ sits in the orphan temp folder of a dead process
    orphan = tmp_path / ".o.tmp-999999-x"
    orphan.mkdir()
    os.rename(out / "points", orphan / "points")
    io.write_set(out, {"a.csv": lambda p: p.write_text("3")})
    assert (out / "a.csv").read_text() == "3"
    assert (out / "points" / "k.json").read_text() == "{}", "points/ was lost"
    assert json.loads((out / MANIFEST).read_text())["files"] == {"a.csv": 1}
