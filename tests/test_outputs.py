"""batchsim run's record files: CSV or Parquet, step rows or a timeline, streamed, as one set.

The step records are written as the run makes them (batchsim.sim.records.StepStream), in
Parquet or CSV; a timeline (TimelineSteps) sums them per replica per bin. Above
AUTO_LARGE_REQUESTS requests the defaults are Parquet and a timeline, and the run says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from batchsim.app import runner
from batchsim.app.config import scenario_from_dict
from batchsim.sim.records import TIMELINE_FIELDS
from tests.cli_helpers import run_cli

SCENARIO = """\
name: out
model: llama-3-8b
hardware: h100-sxm
replicas: 2
router: least_outstanding
policy: {name: chunked_prefill, max_num_batched_tokens: 512}
seed: 2
workload:
  num_requests: 300
  arrival: {process: poisson, rate: 12}
  prompt_tokens: {dist: lognormal, median: 400, p90: 1500, max: 3000}
  output_tokens: {dist: lognormal, median: 120, p90: 400, max: 800}
"""


def cli(capsys, monkeypatch, *args: str) -> tuple[int, str, str]:
    return run_cli(capsys, monkeypatch, *args, columns=200)


@pytest.fixture(scope="module")
def scenario_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("sc") / "out.yaml"
    p.write_text(SCENARIO)
    return p


@pytest.fixture(scope="module")
def csv_rows(scenario_file, tmp_path_factory):
    """The run with CSV step rows (the small-run default)."""
    out = tmp_path_factory.mktemp("csv") / "o"
    sc = scenario_from_dict(__import__("yaml").safe_load(SCENARIO))
    result, written = runner.run_to_folder(sc, out)
    assert written["format"] == "csv" and written["steps"] == "rows"
    return out, result


def test_parquet_holds_what_csv_holds(csv_rows, scenario_file, tmp_path, capsys, monkeypatch):
    out_csv, _ = csv_rows
    code, text, err = cli(capsys, monkeypatch, "run", str(scenario_file), "--out", str(tmp_path / "p"),
                          "--format", "parquet")
    assert code == 0, err
    assert "requests.parquet, steps.parquet; steps: a row per step" in text
    for name in ("requests", "steps"):
        a = pd.read_csv(out_csv / f"{name}.csv", keep_default_na=False, na_values=[""])
        b = pd.read_parquet(tmp_path / "p" / f"{name}.parquet")
        assert list(a.columns) == list(b.columns) and len(a) == len(b) > 100
        for c in a.columns:
            x, y = a[c].to_numpy(), b[c].to_numpy()
            if b[c].dtype.kind == "f":  # (CSV holds 9 significant digits)
                assert np.allclose(x.astype(float), y, rtol=1e-8, equal_nan=True), (name, c)
            else:  # (an empty CSV field reads back as NaN)
                assert [("" if v != v else str(v)) for v in x] == [str(v) for v in y], (name, c)
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert manifest["format"] == "parquet" and manifest["steps"] == "rows"
    assert set(manifest["files"]) == {"summary.json", "requests.parquet", "steps.parquet"}


def test_parquet_files_are_byte_identical_across_runs(scenario_file, tmp_path, capsys, monkeypatch):
    for d in ("a", "b"):
        assert cli(capsys, monkeypatch, "run", str(scenario_file), "--out", str(tmp_path / d), "--format", "parquet")[0] == 0
    for name in ("requests.parquet", "steps.parquet", "summary.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_timeline_sums_the_step_rows_per_replica_per_bin(csv_rows, scenario_file, tmp_path, capsys, monkeypatch):
    out_csv, _ = csv_rows
    code, text, err = cli(capsys, monkeypatch, "run", str(scenario_file), "--out", str(tmp_path / "t"),
                          "--steps", "timeline", "--timeline-s", "2.5")
    assert code == 0, err
    assert "steps: a timeline per 2.5 s" in text
    tl = pd.read_csv(tmp_path / "t" / "steps.csv")
    rows = pd.read_csv(out_csv / "steps.csv")
    rows["t"] = np.floor(rows["end"] / 2.5) * 2.5
    rows["busy_s"] = rows["end"] - rows["start"]
    g = rows.groupby(["t", "replica"], sort=True)
    want = g.size().rename("steps").to_frame()
    for name, _, how in TIMELINE_FIELDS:
        if how in ("sum", "busy"):
            want[name] = g[name].sum()
        elif how == "max":
            want[name] = g[name].max()
    want = want.reset_index()
    assert list(tl.columns) == ["replica", "t", *[f for f, _, _ in TIMELINE_FIELDS]]
    assert tl[["t", "replica"]].to_numpy().tolist() == want[["t", "replica"]].to_numpy().tolist()
    for name, dt, _ in TIMELINE_FIELDS:
        if dt == "i8":
            assert tl[name].tolist() == want[name].tolist(), name
        else:
            assert np.allclose(tl[name], want[name], rtol=1e-7), name
    assert int(tl["steps"].sum()) == len(rows)


def test_large_runs_default_to_parquet_and_a_timeline_and_say_so(scenario_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(runner, "AUTO_LARGE_REQUESTS", 299)
    monkeypatch.setattr(runner, "AUTO_STEP_ROWS", 1000)
    code, text, err = cli(capsys, monkeypatch, "run", str(scenario_file), "--out", str(tmp_path / "big"))
    assert code == 0, err
    flat = " ".join(text.split())
    summary = json.loads((tmp_path / "big" / "summary.json").read_text())
    assert "requests.parquet, steps.parquet" in flat
    assert "parquet (--format auto: 300 requests > 299)" in flat
    assert f"steps as a timeline (--steps auto: {summary['num_steps']:,} steps > 1,000)" in flat
    assert "a timeline row per 1 s (--timeline-s auto" in flat
    manifest = json.loads((tmp_path / "big" / "manifest.json").read_text())
    assert manifest["steps"] == "timeline" and manifest["timeline_s"] == 1.0 and "--format auto" in manifest["why"]
    tl = pd.read_parquet(tmp_path / "big" / "steps.parquet")
    assert tl["steps"].sum() == summary["num_steps"]


def test_auto_steps_keep_rows_up_to_the_limit(scenario_file, tmp_path, capsys, monkeypatch):
    code, text, err = cli(capsys, monkeypatch, "run", str(scenario_file), "--out", str(tmp_path / "r"))
    assert code == 0, err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert f"a row per step (--steps auto: {summary['num_steps']:,} steps <= 250,000)" in " ".join(text.split())
    assert len(pd.read_csv(tmp_path / "r" / "steps.csv")) == summary["num_steps"]
    code, text, err = cli(capsys, monkeypatch, "run", str(scenario_file), "--out", str(tmp_path / "r2"),
                          "--timeline-s", "5")
    assert code == 0 and "--timeline-s unused" in " ".join(text.split()), err


def test_step_files_are_the_same_bytes_from_either_engine(scenario_file, tmp_path, capsys, monkeypatch):
    """Row groups have a fixed size (batchsim.sim.io.ROW_GROUP), however the engine handed the
    rows over (the core in flushes, the Python engine a chunk at a time)."""
    from batchsim.sim import io as io_mod
    from batchsim.sim.records import StepStream

    monkeypatch.setattr(io_mod, "ROW_GROUP", 1000)
    monkeypatch.setattr(StepStream, "CHUNK", 777)
    got = {}
    for engine in ("core", "python"):
        for steps in ("rows", "timeline"):
            d = tmp_path / f"{engine}-{steps}"
            code, _, err = cli(capsys, monkeypatch, "run", str(scenario_file), "--out", str(d), "--format", "parquet",
                               "--steps", steps, "--timeline-s", "0.5", "--set", f"engine={engine}")
            assert code == 0, err
            got[engine, steps] = (d / "steps.parquet").read_bytes()
    assert got["core", "rows"] == got["python", "rows"]
    assert got["core", "timeline"] == got["python", "timeline"]


def test_a_killed_runs_step_file_is_removed_by_the_next_write(scenario_file, tmp_path):
    """The step file streams beside the output folder under a temporary name whose process id
    batchsim.sim.io.clean_orphans reads: a dead writer's is removed by the next run there."""
    import yaml

    from batchsim.sim.io import TableFile

    sc = scenario_from_dict(yaml.safe_load(SCENARIO))
    out = tmp_path / "o"
    t = TableFile(tmp_path / ".o.tmp-999999999-steps.csv", "csv")  # (a pid no process has)
    t.write({"a": np.arange(3)})
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".o.tmp-999999999-steps.csv.")
    runner.run_to_folder(sc, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]


def test_steps_none_writes_no_step_file(scenario_file, tmp_path, capsys, monkeypatch):
    code, text, err = cli(capsys, monkeypatch, "run", str(scenario_file), "--out", str(tmp_path / "n"), "--steps", "none")
    assert code == 0 and "no step records" in text, err
    assert sorted(p.name for p in (tmp_path / "n").iterdir()) == ["manifest.json", "requests.csv", "summary.json"]


def test_no_step_file_when_the_scenario_keeps_none(scenario_file, tmp_path, capsys, monkeypatch):
    code, text, err = cli(capsys, monkeypatch, "run", str(scenario_file), "--out", str(tmp_path / "n"),
                          "--set", "measure.step_records=false")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "n").iterdir()) == ["manifest.json", "requests.csv", "summary.json"]
    assert json.loads((tmp_path / "n" / "manifest.json").read_text())["steps"] == "none"


@pytest.mark.parametrize("args, where", [
    (["--format", "xlsx"], "--format"), (["--steps", "all"], "--steps"), (["--timeline-s", "0"], "--timeline-s"),
    (["--timeline-s", "nan"], "--timeline-s"), (["--timeline-s", "1e-300"], "--timeline-s"),
])
def test_bad_output_options_are_one_line_exit_2(scenario_file, tmp_path, capsys, monkeypatch, args, where):
    code, text, err = cli(capsys, monkeypatch, "run", str(scenario_file), "--out", str(tmp_path / "x"), *args)
    assert code == 2 and where in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_a_failed_run_leaves_no_partial_step_file(scenario_file, tmp_path, monkeypatch):
    """The step file is streamed beside the output folder; a run that fails midway removes it and
    leaves the previous set as it was."""
    import yaml

    sc = scenario_from_dict(yaml.safe_load(SCENARIO))
    out = tmp_path / "o"
    runner.run_to_folder(sc, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real = runner.simulate

    def broken(scenario, parts, **kw):
        real(scenario, parts, **kw)  # (the steps streamed to the temporary file)
        raise RuntimeError("disk full")

    monkeypatch.setattr(runner, "simulate", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        runner.run_to_folder(sc, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.parametrize("last, want", [(0.0, 1.0), (9_999.0, 1.0), (10_001.0, 2.0), (2.1e6, 300.0), (1e12, 86400.0)])
def test_timeline_bin_covers_the_arrivals_in_at_most_ten_thousand_rows(last, want):
    from batchsim.sim.types import Workload

    wl = Workload(arrival=np.array([0.0, last]), prompt_tokens=np.array([1, 1]), output_tokens=np.array([1, 1]))
    assert runner.timeline_bin(wl) == want


def test_parquet_without_pyarrow_is_a_clear_error_before_the_run(scenario_file, tmp_path, capsys, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_pyarrow(name, *a, **kw):
        if name == "pyarrow" or name.startswith("pyarrow."):
            raise ImportError("No module named 'pyarrow'")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    code, _, err = cli(capsys, monkeypatch, "run", str(scenario_file), "--out", str(tmp_path / "x"), "--format", "parquet")
    assert code == 2 and "Parquet needs pyarrow" in err and "--format csv" in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()


# ------------------------------------------------ the CSV writer and the run without pandas
def _pandas_csv(df: pd.DataFrame, header: bool = True) -> str:
    """What every output CSV was before batchsim.sim.io.csv_text: pandas' own writer."""
    return df.to_csv(index=False, header=header, float_format="%.9g", lineterminator="\n")


def _awkward_frame() -> pd.DataFrame:
    fl = np.array([0.0, -0.0, 1.0, 0.1, 1e-12, 1e20, 1234567890.123, np.nan, np.inf, -np.inf, np.pi, 2.5e-5, -7.0])
    n = len(fl)
    df = pd.DataFrame({
        "f": fl, "i": np.arange(n) - 5, "b": np.arange(n) % 2 == 0, "f32": fl.astype(np.float32),
        "u": np.arange(n, dtype=np.uint8),
        "s": np.array(["a", "b,c", 'q"x', "", None, "line\nbreak", "é", np.nan, "x", "y", "z", "w", "v"], dtype=object),
        "mixed": np.array([1, 2.5, "s", None, True, 0.1, np.nan, 3, 4, 5, 6, 7, 8], dtype=object),
    })
    df["str"] = pd.array(["a", None, "c"] + ["d"] * (n - 3), dtype="str")
    df["nullable"] = pd.array([1, None] + [3] * (n - 2), dtype="Int64")
    return df


@pytest.mark.parametrize("pick", ["all", "none", "empty", "one_column", "blank_cells", "no_columns", "large"])
def test_the_csv_writer_gives_the_bytes_pandas_gave(pick):
    from batchsim.sim.io import csv_text
    from batchsim.sim.table import Table

    rng = np.random.default_rng(0)
    df = {"all": _awkward_frame, "none": lambda: _awkward_frame().iloc[:0], "empty": lambda: _awkward_frame()[["s"]],
          "one_column": lambda: pd.DataFrame({"only": ["a", "b"]}),
          "blank_cells": lambda: pd.DataFrame({"only": ["", "a", ""]}), "no_columns": pd.DataFrame,
          "large": lambda: pd.DataFrame({"x": rng.lognormal(0, 5, 150_000), "y": rng.integers(-5, 5, 150_000),
                                         "z": rng.choice(["completed", "rejected"], 150_000)})}[pick]()
    assert csv_text(df) == _pandas_csv(df)
    assert csv_text(df, header=False) == _pandas_csv(df, header=False)
    if pick in ("large", "one_column", "none"):
        assert csv_text(Table.from_pandas(df)) == _pandas_csv(df)


def test_a_run_on_the_core_writes_its_records_without_importing_pandas(scenario_file, tmp_path):
    # (issue 23's start-up: pandas' import is ~0.2 s of a 0.5 s run of 100 requests)
    import subprocess
    import sys

    from batchsim import core

    if core.library() is None:
        pytest.skip(f"no compiled core here: {core.library_error()}")
    code = ("import sys\nfrom batchsim.app.cli import main\n"
            f"sys.argv = ['batchsim', 'run', {str(scenario_file)!r}, '--out', {str(tmp_path / 'out')!r}, '--json']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print('PANDAS', 'pandas' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert '"engine": "core"' in out and "PANDAS False" in out, out[-500:]
    got = pd.read_csv(tmp_path / "out" / "requests.csv")
    assert len(got) > 0 and set(got["status"]) <= {"completed", "rejected", "unfinished"}


def test_the_csv_writer_takes_repeated_column_names_and_numpy_nans_in_object_columns():
    from batchsim.sim.io import csv_text

    dup = pd.DataFrame([[1, 2.5], [3, np.nan]], columns=["a", "a"])
    obj = pd.DataFrame({"o": np.array([np.float32("nan"), 1, np.float64("nan")], dtype=object)})
    for df in (dup, obj):
        assert csv_text(df) == _pandas_csv(df)


def test_parquet_of_the_records_and_of_their_frame_are_the_same_bytes(tmp_path):
    from batchsim.sim.io import write_parquet

    sc = scenario_from_dict({**__import__("yaml").safe_load(SCENARIO), "horizon_s": 10.0})  # (unfinished: NaN latencies)
    result = runner.run_scenario(sc)
    write_parquet(tmp_path / "t.parquet", result.request_table)
    write_parquet(tmp_path / "f.parquet", result.requests)
    assert (tmp_path / "t.parquet").read_bytes() == (tmp_path / "f.parquet").read_bytes()
    back = pd.read_parquet(tmp_path / "t.parquet")
    pd.testing.assert_frame_equal(back, result.requests)
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "t.parquet").column("completion").null_count == int(result.requests["completion"].isna().sum()) > 0


def test_run_result_records_read_as_frames_and_edits_reach_the_files(tmp_path):
    import dataclasses

    sc = scenario_from_dict(__import__("yaml").safe_load(SCENARIO))
    result = runner.run_scenario(sc)
    assert isinstance(result.requests, pd.DataFrame) and isinstance(result.steps, pd.DataFrame)
    result.requests["tag"] = "x"  # (an annotated frame is what gets written)
    runner.write_outputs(result, tmp_path / "o", "csv")
    assert (tmp_path / "o" / "requests.csv").read_text().splitlines()[0].endswith(",tag")
    head = dataclasses.replace(result, requests=result.requests.head(2))
    assert len(head.requests) == 2 and len(head.request_table) == 2
    again = runner.RunResult(scenario=sc, summary={}, requests=result.requests, steps=result.steps, itl=result.itl, meta={})
    assert again.requests is result.requests
    assert result == result and result != again  # (one run is one object: frames have no truth value)


@pytest.mark.parametrize("engine", ["core", "python"])
def test_a_horizon_before_any_request_leaves_the_frontend_keeps_typed_records(engine, tmp_path):
    from batchsim import core

    if engine == "core" and core.library() is None:
        pytest.skip(f"no compiled core here: {core.library_error()}")
    sc = scenario_from_dict({
        "name": "fe", "model": "llama-3-8b", "hardware": "h100-sxm", "engine": engine,
        "policy": {"name": "chunked_prefill"}, "horizon_s": 0.2, "overheads": {"frontend": {"per_request_us": 250000}},
        "workload": {"num_requests": 50, "arrival": {"process": "poisson", "rate": 50.0},
                     "prompt_tokens": {"dist": "fixed", "value": 400}, "output_tokens": {"dist": "fixed", "value": 50}}})
    result, _ = runner.run_to_folder(sc, tmp_path / "o", fmt="csv")
    req = result.requests
    assert len(req) > 0 and set(req["status"]) == {"unfinished"}
    assert req["rid"].dtype == np.int64 and req["arrival"].dtype == np.float64
    rows = (tmp_path / "o" / "requests.csv").read_text().splitlines()
    assert rows[2].split(",")[4] == "%.9g" % req["arrival"].iloc[1]  # (a float column, written as one)
