"""docs/benchmarks.md is assembled from the committed records (scripts/make_benchmarks_doc.py) and
its "At a glance" section is computed from their JSON (scripts/benchmarks_glance.py)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import benchmarks_glance
import make_benchmarks_doc


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A copy of docs/results (markdown and JSON only) a test may change."""
    out = tmp_path / "results"
    out.mkdir()
    for f in (REPO / "docs" / "results").iterdir():
        if f.suffix in (".md", ".json"):
            shutil.copy(f, out / f.name)
    return out


def _row(text: str, start: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(start))


def test_committed_page_is_what_the_records_assemble_to():
    page = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert page == make_benchmarks_doc.assemble(), "run python scripts/make_benchmarks_doc.py and commit the page"


def test_every_record_is_listed_and_an_unlisted_one_is_refused(results: Path):
    page = make_benchmarks_doc.assemble(results)
    assert "## Dense index build by embed backend" in page  # once left out of ORDER, and of the page
    (results / "new_bench.md").write_text("# New\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="new_bench"):
        make_benchmarks_doc.assemble(results)


def test_glance_reads_the_figures_from_the_json(results: Path):
    text = benchmarks_glance.glance(results)
    assert "**missed** on DL19 (met on 3 of 4)" in _row(text, "| #14 | default ≥ best first stage")
    assert "| DL19 | 43 | first stage's dense 0.5932 | 0.5790 | **0.5849** | -0.83 | 19/20 |" in text

    record = results / f"{benchmarks_glance.LIKELIHOOD}.json"
    payload = json.loads(record.read_text(encoding="utf-8"))
    for row in payload["rows"]:
        if row["dataset"] == "DL19" and row["method"] == benchmarks_glance.DEFAULT:
            row["nDCG@10"], row["Δ"] = 0.6032, 1.0
    record.write_text(json.dumps(payload), encoding="utf-8")
    text = benchmarks_glance.glance(results)
    assert _row(text, "| #14 | default ≥ best first stage").endswith("| met |")
    assert "| DL19 | 43 | first stage's dense 0.5932 | 0.5790 | **0.6032** | +1.00 |" in text


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "scripts").glob("bench_*.py")))
def test_every_benchmark_script_loads_against_the_package(script):
    """A script is thin over the package: its imports must resolve against the package as it is
    (bench_sharded imported a module removed days before, and its documented command failed at once)."""
    import runpy

    runpy.run_path(str(REPO / "scripts" / script), run_name="loaded by a test")  # module level only
