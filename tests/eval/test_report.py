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
    assert json.loads(js.read_text()) == {"attnrank_record": 1, "a": [1, 2]} and md.read_text() == "# X\n"
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


def test_write_outputs_replaces_only_records(tmp_path):
    """Any <name>.json / <name>.md in the output folder was replaced, the user's own notes too.
    Now such a file stays, and the finished record is written beside it, not lost."""
    import pytest

    from attnrank.errors import InputError

    out = tmp_path / "out"
    write_outputs("x", {"a": 1}, "# X\n", out)
    write_outputs("x", {"a": 2}, "# X again\n", out)  # its own record: replaced
    assert json.loads((out / "x.json").read_text())["a"] == 2 and (out / "x.md").read_text() == "# X again\n"
    for mine in ("my own notes\n", "# My notes\n"):  # a title alone does not make a page a record
        (out / "notes.md").write_text(mine)
        with pytest.raises(InputError, match="notes.md exist.* no benchmark record .* written to .*notes.attnrank-new"):
            write_outputs("notes", {"a": 1}, "# Notes\n", out)
        assert (out / "notes.md").read_text() == mine and not (out / "notes.json").exists()
        assert json.loads((out / "notes.attnrank-new.json").read_text())["a"] == 1
    (out / "data.json").write_text("[1, 2, 3]")  # a JSON list: not a record
    with pytest.raises(InputError, match="no benchmark record"):
        write_outputs("data", {"a": 1}, "# Data\n", out)
    assert (out / "data.json").read_text() == "[1, 2, 3]" and (out / "data.attnrank-new.md").read_text() == "# Data\n"
    # any JSON object passed for a record: a project's package.json (and its page) beside the name
    (out / "package.json").write_text('{"name": "my-app", "version": "1.0.0"}')
    (out / "package.md").write_text("# My app\n")
    with pytest.raises(InputError, match="no benchmark record"):
        write_outputs("package", {"a": 1}, "# Bench\n", out)
    assert json.loads((out / "package.json").read_text())["name"] == "my-app"
    (out / "old.json").write_text('{"environment": {"cpus": 2}, "rows": []}')  # a record from before the mark
    (out / "old.md").write_text("# Old\n")
    write_outputs("old", {"a": 1}, "# New\n", out)
    assert (out / "old.md").read_text() == "# New\n"
