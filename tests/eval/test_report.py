from __future__ import annotations

import json

from attnrank.eval.report import environment, md_table, write_outputs


def test_md_table_formats_and_marks_unmeasured():
    rows = [{"method": "a", "nDCG@10": 0.123456, "Δ": 1.25}, {"method": "b", "nDCG@10": float("nan"), "n": 3}]
    out = md_table(rows, ["method", "nDCG@10", "Δ", "n"], {"Δ": "+.1f"})
    assert out.splitlines() == [
        "| method | nDCG@10 | Δ | n |",
        "|---|---|---|---|",
        "| a | 0.1235 | +1.2 |  |",
        "| b | — |  | 3 |",
    ]


def test_write_outputs(tmp_path):
    js, md = write_outputs("x", {"a": [1, 2]}, "# X\n", tmp_path / "out")
    assert json.loads(js.read_text()) == {"a": [1, 2]} and md.read_text() == "# X\n"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["x.json", "x.md"]  # no temporary left


def test_environment_fields():
    env = environment()
    assert {"date", "python", "torch", "cpus", "threads", "machine"} <= set(env) and env["cpus"] >= 1


def test_md_table_formats_numpy_floats_and_their_nan():
    """np.float32 (a NumPy mean of float32 scores) was printed unformatted, its NaN as "nan"."""
    import numpy as np

    rows = [{"m": np.float32(0.123456), "n": np.int64(3)}, {"m": np.float32("nan"), "n": np.int64(4)}]
    assert md_table(rows, ["m", "n"]).splitlines()[2:] == ["| 0.1235 | 3 |", "| — | 4 |"]


def test_the_environment_records_the_command_line_that_ran(tmp_path, monkeypatch):
    """Records stored no command: the page printed one typed by hand, which dropped flags the run
    was made with (bench_confirm's --scifact-queries, bench_likelihood's --dtype)."""
    from attnrank.eval.report import command_line, environment

    monkeypatch.chdir(tmp_path)
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "bench_x.py"
    assert command_line([str(script), "--offset", "400", "--note", "a b"]) == (
        "python scripts/bench_x.py --offset 400 --note 'a b'"
    )
    monkeypatch.setattr("sys.argv", [str(script), "--k", "3"])
    assert environment()["command"] == "python scripts/bench_x.py --k 3"
