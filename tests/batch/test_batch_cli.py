"""`attnrank batch --index NAME | --index-dir DIR`, resolved as every other command resolves them
(the run itself replaced: no Ray starts)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnrank.cli import app
from attnrank.index.retriever import HybridRetriever
from attnrank.types import Document

runner = CliRunner()


def _text(r) -> str:
    """The output without the rich panel's borders and line breaks."""
    return re.sub(r"[\s│╭╮╰╯─]+", " ", r.output)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A folder holding ./indexes/scifact (as `attnrank index corpus --index scifact` leaves it),
    a folder index ./folder-idx outside ./indexes and a queries file; the run is recorded, not started."""
    import attnrank.batch

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ATTNRANK_INDEX_DIR", raising=False)
    docs = [Document("d1", "apples are red"), Document("d2", "pears are green")]
    built = HybridRetriever().index(docs, show_progress=False)
    built.save(tmp_path / "indexes" / "scifact")
    built.save(tmp_path / "folder-idx")
    (tmp_path / "q.tsv").write_text("q1\tred apples\n")
    runs: list = []

    def run_batch(queries, config, **kw):
        runs.append(config)
        return {"rows": 1, "resumed_skipped": 0, "queries_per_second": None}

    monkeypatch.setattr(attnrank.batch, "run_batch", run_batch)
    return runs


def _batch(*args: str):
    return runner.invoke(app, ["batch", "q.tsv", *args, "-o", "r.trec", "-q"])


def test_batch_takes_an_index_name_as_every_other_command(workdir, tmp_path):
    """After `attnrank index corpus --index scifact`, `batch --index scifact` failed: "index
    'scifact' is not a folder" (batch alone read --index as a path)."""
    r = _batch("--index", "scifact")
    assert r.exit_code == 0, _text(r)
    assert [Path(c.index).resolve() for c in workdir] == [(tmp_path / "indexes" / "scifact").resolve()]
    r = _batch("--index-dir", str(tmp_path / "folder-idx"))
    assert r.exit_code == 0, _text(r)
    assert workdir[-1].index == str(tmp_path / "folder-idx")


def test_batch_index_refusals_name_the_fix(workdir, tmp_path):
    r = _batch("--index", "scifact", "--index-dir", "folder-idx")
    assert r.exit_code == 2 and "give --index scifact or --index-dir folder-idx, not both" in _text(r)
    r = _batch("--index", "folder-idx")  # a folder here, not a name under ./indexes
    assert r.exit_code == 2 and "no index named 'folder-idx'" in _text(r)
    assert "give --index-dir folder-idx" in _text(r)
    r = _batch("--index", "./none")
    assert r.exit_code == 2 and "is not a folder" in _text(r) and "--index-dir" in _text(r)
    r = _batch()
    assert (
        r.exit_code == 2
        and "give --index NAME (stored under ./indexes, or $ATTNRANK_INDEX_DIR) or --index-dir DIR" in _text(r)
    )
    assert not workdir


def test_batch_index_still_takes_a_folder_path_with_a_warning(workdir, tmp_path, caplog):
    """Scripts written when `batch --index` took a folder path keep working, told of --index-dir."""
    for given in ("./folder-idx", str(tmp_path / "folder-idx")):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="attnrank.cli.batch"):
            r = _batch("--index", given)
        assert r.exit_code == 0, _text(r)
        assert Path(workdir[-1].index).resolve() == (tmp_path / "folder-idx").resolve()
        assert f"give the folder as --index-dir {given}" in caplog.text


def test_batch_takes_the_devices_a_rerank_actor_can_use(workdir):
    """Ray shows a rerank actor only the one GPU it declares: --device cuda:1 failed in every actor
    (retried without end), and --device auto declared no GPU and ran on the CPU."""
    for device in ("cuda:1", "auto", "gpu"):
        r = _batch("--index", "scifact", "--rerank", "5", "--device", device)
        assert r.exit_code == 2 and f"--device '{device}' is not cpu or cuda" in _text(r), _text(r)
    assert not workdir


def test_ray_address_local_is_a_local_ray(workdir):
    """`--ray-address local` (as `index` takes it) started a local Ray, yet was checked as a
    cluster's address: --num-cpus was refused and the local Ray's checks were skipped."""
    r = _batch("--index", "scifact", "--ray-address", "local", "--num-cpus", "1")
    assert r.exit_code == 0, _text(r)
    r = _batch("--index", "scifact", "--ray-address", "local", "--actor-cpus", "64", "--num-cpus", "2")
    assert r.exit_code == 2 and "more than the 2 CPUs of the local Ray" in _text(r), _text(r)
