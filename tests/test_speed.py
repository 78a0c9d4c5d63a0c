"""The block-attention benchmark's bookkeeping: cells in grid order, dated quality rows."""

from __future__ import annotations

import json
import math

import pytest

from attnrank.errors import InputError
from attnrank.eval.speed_report import block_targets, blocks_markdown, interleaved_targets
from attnrank.speed.stores import build_store
from attnrank.speed.timing import in_grid_order, probe_gflops, speed_cells

ENV = {"date": "2026-12-02", "cpus": 2, "torch": "2.13.0"}


def _row(dataset: str, k: int, mode: str, dtype: str, secs: float) -> dict:
    return {"dataset": dataset, "K": k, "mode": mode, "dtype": dtype, "s/query": secs, "measured": "2026-12-02"}


def test_resumed_cells_come_back_in_grid_order():
    cells = speed_cells(["bfloat16", "float32"])
    rows = [_row("dl19", 10, "full", "float32", 2.0), _row("dl19", 10, "full", "bfloat16", 1.0)]
    rows.append({**_row("dl19", 10, "block-warm", "bfloat16", 0.1), "dataset": "other"})  # not in the grid
    ordered = in_grid_order(rows, cells)
    assert [(r["dataset"], r["dtype"]) for r in ordered] == [
        ("dl19", "bfloat16"),
        ("dl19", "float32"),
        ("other", "bfloat16"),
    ]


def test_blocks_page_shows_speed_ups_and_when_each_setting_was_measured():
    speed = [_row("dl19", 20, "full", "bfloat16", 1.2), _row("dl19", 20, "block-warm", "bfloat16", 0.1)]
    quality = [{"setting": "DL19", "mode": "full", "nDCG@10": 0.5, "measured": "2026-12-01"}]
    page = blocks_markdown(speed, quality, {}, ENV)
    assert "| dl19 | bfloat16 | 20 | block-warm | 12.0 |  |" in page
    assert "| DL19 | full | 0.5000 |  |  |  | 2026-12-01 |" in page


def test_build_store_never_removes_a_folder_it_did_not_write(tmp_path):
    """The benchmark rebuilds its passage-state store by removing the previous one: a folder that
    is not such a store (no states.json) is refused before anything is removed or loaded."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match="is not a passage-state store attnrank wrote"):
        build_store(tmp_path / "no-data", folder)
    assert (folder / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("header", ['{"format": "attnrank-passage-states"}', '{"mine": true}'])
def test_build_store_keeps_a_users_files_beside_a_states_json(tmp_path, header):
    """A folder that merely holds a file named states.json (or a store with the user's files added)
    was removed whole, with everything else in it."""
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "states.json").write_text(header)
    (folder / "thesis.tex").write_text("keep me")
    with pytest.raises(InputError, match=r"is not a passage-state store attnrank wrote \(it holds thesis.tex\)"):
        build_store(tmp_path / "no-data", folder)
    assert (folder / "thesis.tex").read_text() == "keep me" and (folder / "states.json").read_text() == header


def test_targets_read_the_cells_they_name():
    rows = [
        _row("dl19", 20, "full", "bfloat16", 1.5),
        _row("dl19", 20, "block-cold", "bfloat16", 1.0),
        _row("dl19", 20, "block-warm", "bfloat16", 0.31),
        _row("dl19", 20, "full", "float32", 3.0),
        _row("dl19", 100, "block-warm", "bfloat16", 0.9),
        _row("dl19", 10, "block-cold", "bfloat16", 0.6),
    ]
    got = {t["target"]: (t["measured"], t["met"]) for t in block_targets(rows, "bfloat16")}
    assert got["warm K=20 <= 0.3 s"] == ("0.31 s", "no") and got["warm K=100 <= 1.0 s"] == ("0.90 s", "yes")
    assert got["cold K=20 >= 1.5x the bfloat16 full prompt"] == ("1.50x", "yes")
    assert got["cold K=20 >= 1.5x the float32 full prompt"] == ("3.00x", "yes")
    assert got["cold grows linearly in K (s per candidate, K=10/20/50/100)"] == ("0.060 / 0.050", "")
    assert "Targets (issue 15), bfloat16 cells:" in blocks_markdown(rows, [], {}, ENV)


def test_the_machine_probe_is_a_positive_rate():
    """A speed cell records the machine's matrix-product rate around its queries."""
    for dtype in ("bfloat16", "float32", "int8"):
        rate = probe_gflops(dtype, n=64, reps=2)
        assert math.isfinite(rate) and rate > 0


def test_the_machine_probe_counts_the_flops_of_its_products_in_the_cells_precision(monkeypatch):
    """Only a positive rate was checked: a probe in float32 for a bfloat16 cell, or one counting n**2
    operations a product, passed. Over a clock that moves 0.5 s a reading, the rate is exact."""
    import itertools

    import torch

    from attnrank.speed import timing

    clock = itertools.count(step=0.5)
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    made = []
    real = torch.randn
    monkeypatch.setattr(timing.torch, "randn", lambda *a, **kw: made.append(kw["dtype"]) or real(*a, **kw))
    for dtype, kind in (("bfloat16", torch.bfloat16), ("float32", torch.float32), ("int8", torch.float32)):
        made.clear()
        assert probe_gflops(dtype, n=64, reps=3) == 2 * 64**3 * 3 / 0.5 / 1e9
        assert made == [kind, kind]


def _interleaved(
    dataset: str, k: int, full: float, cold: float, warm: float, dtype: str = "bfloat16", positions: str | None = None
) -> dict:
    return {
        "dataset": dataset,
        "K": k,
        "dtype": dtype,
        **({} if positions is None else {"positions": positions}),
        "queries": 3,
        "full s/query": full,
        "block-cold s/query": cold,
        "block-warm s/query": warm,
        "cold speed-up": full / cold,
        "cold speed-up per query (min-max)": "1.40-1.60",
        "measured": "2026-12-03",
    }


def test_interleaved_rows_set_the_targets_and_the_cells_stay_beside_them():
    """The interleaved timing is the targets' record; the cells' own targets follow, labelled as such."""
    rows = [
        _interleaved("scifact", 20, 6.0, 4.0, 0.29),
        _interleaved("scifact", 100, 40.0, 30.0, 1.2),
        _interleaved("scifact", 20, 9.0, 3.0, 0.1, dtype="float32"),  # another dtype: not read
    ]
    got = {t["target"]: (t["measured"], t["met"]) for t in interleaved_targets(rows, "bfloat16")}
    assert got["warm K=20 <= 0.3 s"] == ("0.29 s", "yes") and got["warm K=100 <= 1.0 s"] == ("1.20 s", "no")
    assert got["cold K=20 >= 1.5x the bfloat16 full prompt"] == ("1.50x (per query 1.40-1.60)", "yes")
    assert got["cold grows linearly in K (s per candidate, K=20/100)"] == ("0.200 / 0.300", "")
    cells = [_row("scifact", 20, "full", "bfloat16", 6.0), _row("scifact", 20, "block-cold", "bfloat16", 5.0)]
    page = blocks_markdown(cells, [], {}, ENV, rows)
    assert page.index("timed in turn on each query") < page.index("The same targets from the bfloat16 cells")
    assert "| scifact | cold K=20 >= 1.5x the bfloat16 full prompt | 1.20x | no |" in page  # the cells' own
    assert "Targets (issue 15), bfloat16 cells:" not in page
    # an interleaved timing alone (no cells): no empty cell tables on the page
    alone = blocks_markdown([], [], {}, ENV, rows)
    assert "timed in turn on each query" in alone and "| dataset | dtype | K | mode | queries |" not in alone
    assert "Speed-ups against the full-prompt capture" not in alone


def test_interleaved_targets_are_kept_apart_by_block_positions():
    """Rows timed with shared positions (the preset fused) get their own targets; rows that record
    no positions are the rotated default's."""
    rows = [
        _interleaved("scifact", 20, 6.0, 4.0, 0.35),  # from before positions were recorded
        _interleaved("scifact", 20, 6.0, 3.0, 0.25, positions="shared"),
    ]
    rotated = {t["target"]: t["measured"] for t in interleaved_targets(rows, "bfloat16")}
    shared = {t["target"]: t["measured"] for t in interleaved_targets(rows, "bfloat16", "shared")}
    assert rotated["warm K=20 <= 0.3 s"] == "0.35 s" and shared["warm K=20 <= 0.3 s"] == "0.25 s"
    page = blocks_markdown([], [], {}, ENV, rows)
    assert "blocks at rotated positions" in page and "blocks at shared positions" in page
    assert "| scifact | shared | 20 |" in page and "| scifact | rotated | 20 |" in page


def test_a_cell_that_times_out_is_a_row_that_says_so(tmp_path, monkeypatch):
    """One slow cell ended the whole grid with a TimeoutExpired traceback and no results file."""
    import subprocess

    from attnrank.speed import timing

    def slow(cmd, **kwargs):
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"])

    monkeypatch.setattr(timing.subprocess, "run", slow)
    rows = timing.run_cells([("dl19", 10, "full", "auto", 1)], tmp_path, tmp_path / "cells.json", timeout=0.5)
    assert rows[0]["error"] == "timed out after 0.5 s" and (tmp_path / "cells.json").is_file()
    # a rerun measures it again and replaces the row (the failed row was kept as if measured)
    measured = {"dataset": "dl19", "K": 10, "mode": "full", "dtype": "auto", "s/query": 1.5}
    monkeypatch.setattr(
        timing.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, json.dumps(measured), "")
    )
    rows = timing.run_cells([("dl19", 10, "full", "auto", 1)], tmp_path, tmp_path / "cells.json", timeout=60)
    assert len(rows) == 1 and rows[0]["s/query"] == 1.5 and "error" not in rows[0]
    assert len(json.loads((tmp_path / "cells.json").read_text())) == 1


def test_a_cell_measured_over_fewer_queries_than_asked_is_measured_again(tmp_path, monkeypatch):
    """Resuming kept a row of 5 queries after the grid asked 20 (the cell's key held no count)."""
    import subprocess

    from attnrank.speed import timing

    calls = []

    def run(cmd, **kw):
        calls.append(cmd)
        # (a dataset of 8 queries: a cell asking more measures 8, and is not measured again each resume)
        row = {
            "dataset": "dl19",
            "K": 10,
            "mode": "full",
            "dtype": "auto",
            "s/query": 2.0,
            "queries": min(int(cmd[-1]), 8),
        }
        return subprocess.CompletedProcess(cmd, 0, json.dumps(row), "")

    monkeypatch.setattr(timing.subprocess, "run", run)
    results = tmp_path / "cells.json"
    timing.run_cells([("dl19", 10, "full", "auto", 5)], tmp_path, results)
    timing.run_cells([("dl19", 10, "full", "auto", 5)], tmp_path, results)  # as many: kept
    assert len(calls) == 1
    rows = timing.run_cells([("dl19", 10, "full", "auto", 20)], tmp_path, results)
    assert len(calls) == 2 and [(r["queries"], r["asked"]) for r in rows] == [(8, 20)]
    timing.run_cells([("dl19", 10, "full", "auto", 20)], tmp_path, results)
    assert len(calls) == 2


def test_compare_modes_keys_its_cache_by_what_runs_not_by_the_label(tmp_path, llm, monkeypatch):
    """The label "block (shared positions)" kept serving runs made before block attention's
    default positions changed: the cache is keyed by the resolved configuration and the model."""
    from dataclasses import replace
    from types import SimpleNamespace

    from _tiny import RERANK_QUERY, rerank_docs

    from attnrank.speed import quality

    docs = rerank_docs()
    ds = SimpleNamespace(queries={"q": RERANK_QUERY}, qrels={"q": {docs[0].id: 1}}, rel=1)
    ran = []
    real = quality.mode_quality
    monkeypatch.setattr(quality, "mode_quality", lambda rr, *a: ran.append(rr.config.attention) or real(rr, *a))
    cache = tmp_path / "runs.json"
    quality.compare_modes([("toy", ds, {"q": docs})], {"mode": {}}, llm, cache)
    quality.compare_modes([("toy", ds, {"q": docs})], {"mode": {}}, llm, cache)
    assert ran == ["full"]  # read back the second time
    other = replace(llm, fingerprint="e" * 64)  # another model's weights, the same options
    quality.compare_modes([("toy", ds, {"q": docs})], {"mode": {}}, other, cache)
    assert ran == ["full", "full"]


def test_speed_ups_divide_only_cells_of_one_machine_and_day():
    """A resumed run keeps its earlier cells: a Xeon's full prompt of one day was divided by an
    EPYC's warm run of another, labelled "(same run)", and set a target."""
    full = {**_row("dl19", 20, "full", "float32", 5.46), "cpu": "Xeon", "measured": "2026-12-03"}
    cold = {**_row("dl19", 20, "block-cold", "float32", 2.0), "cpu": "EPYC", "measured": "2026-12-02"}
    warm = {**_row("dl19", 20, "block-warm", "float32", 0.117), "cpu": "EPYC", "measured": "2026-12-02"}
    page = blocks_markdown([full, cold, warm], [], {}, ENV)
    assert "| dl19 | float32 | 20 | block-warm |" not in page.split("Speed-ups")[1] and "46.7" not in page
    assert not any("full prompt" in t["target"] for t in block_targets([full, cold, warm], "float32"))
    same_day = {**full, "cpu": "EPYC", "measured": "2026-12-02"}
    assert "| dl19 | float32 | 20 | block-warm | 46.7 | 46.7 |" in blocks_markdown([same_day, cold, warm], [], {}, ENV)
