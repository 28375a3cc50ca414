"""docs/fidelity.md states each engine preset's knobs as the preset files hold them."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchsim.engines import PRESETS, preset_markdown
from tests.script_helpers import load_script

DOC = Path(__file__).resolve().parents[1] / "docs" / "fidelity.md"


@pytest.mark.parametrize("name", PRESETS)
def test_the_doc_shows_each_preset_as_its_file_holds_it(name):
    assert preset_markdown(name) in DOC.read_text(encoding="utf-8"), (
        f"docs/fidelity.md's table of {name} differs from batchsim/engines/{name}.yaml; "
        f"paste batchsim.engines.preset_markdown({name!r})")


def _script():
    return load_script("published_check")


@pytest.mark.parametrize("case", ["M06", "M23b", "M43", "M46b"])
def test_the_docs_results_are_what_the_script_prints(case):
    mod = _script()
    row = mod.run_case(next(c for c in mod.CASES if c[0] == case))
    line = next(ln for ln in DOC.read_text(encoding="utf-8").splitlines() if ln.startswith(f"| {case} |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert float(cells[7]) == pytest.approx(row["published"], abs=0.05)
    assert float(cells[8]) == pytest.approx(row["batchsim"], rel=0.005), (
        f"docs/fidelity.md's {case} says {cells[8]}, the script now gives {row['batchsim']:.1f}: rerun "
        "python scripts/published_check.py and update section 4")


@pytest.mark.parametrize("key", ["S2-8bh1-202/214@2", "S2-70bh2-467/256@16", "S2-8bh2-467/16@inf"])
def test_the_docs_serving_rows_are_what_the_script_prints(key):
    mod = _script()
    rows = [mod.run_case(c) for c in mod.CASES if c[0].rsplit(":", 1)[0] == key and c[0].endswith((":ttft", ":itl"))]
    line = next(ln for ln in DOC.read_text(encoding="utf-8").splitlines() if ln.startswith(f"| {key} |"))
    assert line == mod.serving_markdown(rows).splitlines()[2], (
        f"docs/fidelity.md's {key} row differs from the script's: rerun "
        "python scripts/published_check.py --only-source S2 --markdown and update section 4")
