"""The batch checkpoint without Ray: what a resume may reuse, and which folders it may write into.

The Ray stages are replaced by a fake dataset (one row per query, its document named after the
query text), so a stale row shows as a document of the old text.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import re
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("ray.data", reason="run_batch needs the 'ray' extra")

from _tiny import save_tiny

import attnrank.batch.dataset as dataset
import attnrank.batch.runner as runner
from attnrank.batch import BatchConfig, run_batch
from attnrank.batch.rows import STAGES
from attnrank.batch.sink import CheckpointSink
from attnrank.errors import InputError


def _row(qid: str, query: str, docs: int = 1) -> dict:
    return {
        "qid": qid,
        "query": query,
        "doc_ids": [f"d-{query}-{i}" for i in range(docs)],
        "scores": [float(docs - i) for i in range(docs)],
        **{f"stage_{s}": [math.nan] * docs for s in STAGES},
    }


class FakeDataset:
    def __init__(self, rows, during=None):
        self.rows, self.during = rows, during

    def iter_batches(self, **_):
        for r in self.rows:
            if self.during is not None:
                self.during()
            yield pa.Table.from_pylist([_row(r["qid"], r["query"])])


@pytest.fixture
def fake_ray(monkeypatch):
    """Stand-ins for the executor and the pipeline; ``calls`` counts pipelines started."""
    state = {"calls": 0, "during": None}

    class Executor:
        ray, startup_seconds = None, 0.0

        def __init__(self, *a, **k):
            pass

        def close(self):
            pass

    def pipeline(ray, rows, config, res, index_tag, *, model=None, local=False):
        state["calls"] += 1
        state["index_tag"] = index_tag  # what the actors check the index they load against
        state["model"] = model  # and the model they load
        return FakeDataset(rows, state["during"])

    monkeypatch.setattr(runner, "RayExecutor", Executor)
    monkeypatch.setattr(runner, "build_dataset", pipeline)
    monkeypatch.setattr(runner, "ray_data_settings", lambda ray, progress: contextlib.nullcontext())
    return state


@pytest.fixture(scope="module")
def built_index(tmp_path_factory):
    """A real two-document index (the runner reads its manifest before Ray starts), built once."""
    from attnrank.index.retriever import HybridRetriever
    from attnrank.types import Document

    path = tmp_path_factory.mktemp("ix") / "idx"
    HybridRetriever().index([Document("d1", "apple"), Document("d2", "pear")], show_progress=False).save(path)
    return path


@pytest.fixture
def index(tmp_path, built_index):
    import shutil

    return Path(shutil.copytree(built_index, tmp_path / "idx"))


def _drop_settings(out: Path, *keys: str) -> tuple[dict, dict]:
    """Rewrite the checkpoint settings of the run written at ``out`` without ``keys``, as a
    checkpoint written before they were recorded holds them; returns (what they held, the rest)."""
    settings = out.with_name(out.name + ".parts") / "settings.json"
    left = json.loads(settings.read_text())
    held = {k: left.pop(k) for k in keys}
    settings.write_text(json.dumps(left))
    return held, left


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_resume_refuses_a_query_whose_text_changed(fake_ray, tmp_path, index):
    config, out = BatchConfig(str(index), mode="bm25"), tmp_path / "run.trec"
    run_batch({"q1": "apple", "q2": "pear"}, config, output=out, progress=False)
    before = out.read_text()
    with pytest.raises(InputError, match="holds query 'q1' as 'apple', not 'banana'"):
        run_batch({"q1": "banana", "q2": "pear"}, config, output=out, progress=False)
    assert out.read_text() == before and "d-apple-0" in before
    stats = run_batch({"q2": "pear", "q3": "fig"}, config, output=out, progress=False)  # same texts: resumes
    assert stats["resumed_skipped"] == 1 and "d-fig-0" in out.read_text()


def test_resume_refuses_an_index_rebuilt_since(fake_ray, tmp_path, index):
    from attnrank.index.store import manifest_tag

    config, out = BatchConfig(str(index), mode="bm25"), tmp_path / "run.trec"
    run_batch({"q1": "apple"}, config, output=out, progress=False)
    assert fake_ray["index_tag"] == manifest_tag(index)  # the build the actors must find
    from attnrank.index.retriever import HybridRetriever
    from attnrank.types import Document

    HybridRetriever().index([Document("d1", "apple"), Document("d2", "pears")], show_progress=False).save(index)
    with pytest.raises(InputError, match=r"other settings \(index_tag\)"):
        run_batch({"q1": "apple"}, config, output=out, progress=False)


def test_resume_refuses_new_weights_at_the_same_model_path(fake_ray, tmp_path, index):
    model = save_tiny(tmp_path / "model")
    config, out = BatchConfig(str(index), mode="bm25", rerank=5, model=str(model)), tmp_path / "run.trec"
    run_batch({"q1": "apple"}, config, output=out, progress=False)
    run_batch({"q1": "apple"}, config, output=out, progress=False)  # same weights: resumed
    assert fake_ray["calls"] == 1
    save_tiny(model, layers=3)  # retrained in place: same path, other weights
    with pytest.raises(InputError, match=r"other settings \(model_fingerprint\)"):
        run_batch({"q1": "apple"}, config, output=out, progress=False)


def test_a_folder_attnrank_did_not_write_is_never_a_checkpoint(fake_ray, tmp_path, index):
    theirs = tmp_path / "spark-output"
    theirs.mkdir()
    pq.write_table(pa.table({"x": [1, 2]}), theirs / "part-00000.parquet")
    (theirs / "notes.txt").write_text("mine")
    before = _files(theirs)
    with pytest.raises(InputError, match="is not an attnrank batch checkpoint"):
        run_batch({"q1": "apple"}, BatchConfig(str(index)), output=tmp_path / "r.trec", checkpoint=theirs)
    assert _files(theirs) == before and fake_ray["calls"] == 0


def test_parts_of_another_writer_alone_are_not_a_checkpoint(fake_ray, tmp_path, index):
    """pyarrow's write_dataset names its files part-0.parquet: a folder of them alone was taken for
    a checkpoint, written into, and its rows read as queries already done."""
    theirs = tmp_path / "dataset"
    pa_ds = pytest.importorskip("pyarrow.dataset")
    pa_ds.write_dataset(pa.table({"qid": ["q1", "q2"], "query": ["apple", "pear"]}), theirs, format="parquet")
    assert [p.name for p in theirs.iterdir()] == ["part-0.parquet"]
    before = _files(theirs)
    with pytest.raises(InputError, match="'part-0.parquet', which no attnrank batch run writes"):
        run_batch({"q1": "apple"}, BatchConfig(str(index)), output=tmp_path / "r.trec", checkpoint=theirs)
    assert _files(theirs) == before and fake_ray["calls"] == 0


def test_unreadable_settings_are_refused_in_one_line(fake_ray, tmp_path, index):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "settings.json").write_text('{"index": ')  # cut short
    with pytest.raises(InputError, match="settings.json is not an attnrank batch checkpoint's settings"):
        run_batch({"q1": "apple"}, BatchConfig(str(index), mode="bm25"), output=tmp_path / "r", checkpoint=ckpt)


def test_outputs_and_queries_are_checked_before_any_work(fake_ray, tmp_path, index):
    config = BatchConfig(str(index), mode="bm25")
    (tmp_path / "folder").mkdir()
    with pytest.raises(InputError, match="--parquet .*folder is a folder"):
        run_batch({"q1": "apple"}, config, parquet=tmp_path / "folder", progress=False)
    with pytest.raises(InputError, match="-o and --parquet are both"):
        run_batch({"q1": "apple"}, config, output=tmp_path / "x", parquet=tmp_path / "x", progress=False)
    queries = tmp_path / "queries.tsv"
    queries.write_text("q1\tapple\n")
    with pytest.raises(InputError, match="-o .*queries.tsv is the queries file"):
        run_batch(queries, config, output=queries, progress=False)
    assert queries.read_text() == "q1\tapple\n"
    with pytest.raises(InputError, match="no queries"):
        run_batch({}, config, output=tmp_path / "r.trec", progress=False)
    assert fake_ray["calls"] == 0
    nested = tmp_path / "new" / "dir" / "rows.parquet"  # a missing folder is made, as for -o
    assert run_batch({"q1": "apple"}, config, parquet=nested, progress=False)["rows"] == 1
    assert pq.read_table(nested).column("qid").to_pylist() == ["q1"]


def test_outputs_replace_only_what_attnrank_wrote(fake_ray, tmp_path, index):
    """run_batch's outputs follow the CLI's rule: a run or Parquet file attnrank wrote is replaced,
    a user's file at that path is refused before any work, untouched."""
    config = BatchConfig(str(index), mode="bm25")
    mine = tmp_path / "notes.txt"
    mine.write_text("my notes\n")
    with pytest.raises(InputError, match="-o .*notes.txt exists and is not a TREC run attnrank wrote"):
        run_batch({"q1": "apple"}, config, output=mine, progress=False)
    data = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": "q1", "text": "apple"}]), data)
    with pytest.raises(InputError, match="--parquet .*data.parquet exists and is not a batch Parquet file"):
        run_batch({"q1": "apple"}, config, parquet=data, progress=False)
    assert mine.read_text() == "my notes\n" and pq.read_table(data).column_names == ["id", "text"]
    assert fake_ray["calls"] == 0
    run, rows = tmp_path / "run.trec", tmp_path / "rows.parquet"
    run_batch({"q1": "apple"}, config, output=run, parquet=rows, progress=False)
    run_batch({"q1": "pear"}, config, output=run, parquet=rows, checkpoint=tmp_path / "second", progress=False)
    assert "d-pear-0" in run.read_text() and pq.read_table(rows).column("query").to_pylist() == ["pear"]


def test_a_checkpoint_in_use_is_refused(fake_ray, tmp_path, index):
    config, out = BatchConfig(str(index), mode="bm25"), tmp_path / "run.trec"
    tried = []

    def second_run():  # while the first run streams its rows
        if not tried:
            tried.append(True)
            with pytest.raises(InputError, match="in use by another attnrank batch run"):
                run_batch({"q1": "apple"}, config, output=out, progress=False)

    fake_ray["during"] = second_run
    assert run_batch({"q1": "apple", "q2": "pear"}, config, output=out, progress=False)["rows"] == 2
    assert tried and fake_ray["calls"] == 1


def test_parts_are_never_replaced_after_one_was_removed(tmp_path):
    sink = CheckpointSink(tmp_path)
    for q in ("a", "b", "c"):
        sink.add([_row(q, q)])
        sink.commit()
    (tmp_path / "part-00000.parquet").unlink()  # e.g. removed by hand to recompute its queries
    sink = CheckpointSink(tmp_path)
    sink.add([_row("a", "a")])
    sink.commit()
    assert sorted(CheckpointSink(tmp_path).done) == ["a", "b", "c"]


def test_a_damaged_part_is_named_in_one_line_and_deleting_it_runs_its_queries_again(tmp_path):
    """A part truncated by a disk or a copy was pyarrow's multi-frame traceback at the next run."""
    sink = CheckpointSink(tmp_path)
    for q in ("a", "b"):
        sink.add([_row(q, q)])
        sink.commit()
    part = tmp_path / "part-00001.parquet"
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    with pytest.raises(InputError, match=r"checkpoint part .*part-00001\.parquet cannot be read \(.*\); delete it"):
        CheckpointSink(tmp_path)
    part.unlink()
    assert sorted(CheckpointSink(tmp_path).done) == ["a"]


def test_finish_writes_every_row_in_query_order_from_an_arrow_copy_it_removes(tmp_path):
    """finish held every saved row as a dict (~39 KB a query at k=100: 40 GB at a million, at each
    resume); it reads them from a memory-mapped Arrow copy of the parts now, in any query order,
    and removes the copy (one left by a killed finish is no refusal of the checkpoint)."""
    from attnrank.batch.checkpoint import is_checkpoint_file
    from attnrank.eval import read_run

    ckpt = tmp_path / "ckpt"
    sink = CheckpointSink(ckpt, commit_rows=3)
    qids = [f"q{i:02d}" for i in range(20)]
    expected = {q: _row(q, f"text-{q}", docs=(0 if q == "q07" else 1 + int(q[1:]) % 3)) for q in qids}
    for q in qids:  # (parts of 3 rows: 7 parts)
        sink.add([expected[q]])
    sink.commit()
    sink.add([_row("q04", "text-q04", docs=2)])  # (kept once: a row already committed)
    killed = ckpt / ".finish.arrow.tmp-999999999-0a1b2c3d"  # (a finish killed midway; no such process)
    killed.write_bytes(b"arrow")
    assert is_checkpoint_file(killed)
    order = qids[::-1][::2] + qids[::-1][1::2]  # scattered over the parts
    out, trec = tmp_path / "rows.parquet", tmp_path / "r.trec"
    assert sink.finish(order, trec=trec, parquet=out, tag="t") == {"rows": 20, "duplicates_dropped": 1, "no_hits": 1}
    table = pq.read_table(out)
    assert table.column("qid").to_pylist() == order and table.schema.metadata[b"attnrank"] == b"batch"
    assert [r["doc_ids"] for r in table.to_pylist()] == [expected[q]["doc_ids"] for q in order]
    run = read_run(trec)
    assert list(run) == [q for q in order if q != "q07"]
    assert run["q05"] == {"d-text-q05-0": 3.0, "d-text-q05-1": 2.0, "d-text-q05-2": 1.0}
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith(".finish")) == []
    with pytest.raises(InputError, match="1 queries have no row in"):  # (no part at all: no schema to unify)
        CheckpointSink(tmp_path / "empty").finish(["q1"], trec=tmp_path / "e.trec", parquet=None, tag="t")


def test_a_part_of_queries_without_hits_still_finishes(tmp_path):
    sink = CheckpointSink(tmp_path / "ckpt")
    sink.add([_row("q1", "apple")])
    sink.commit()
    sink.add([_row("q2", "pear", docs=0)])  # a part whose lists are all empty (null-typed)
    out = tmp_path / "rows.parquet"
    assert sink.finish(["q1", "q2"], trec=tmp_path / "r.trec", parquet=out, tag="t")["rows"] == 2
    assert pq.read_table(out).column("doc_ids").to_pylist() == [["d-apple-0"], []]


def test_resume_refuses_new_heads_in_the_same_heads_file(fake_ray, tmp_path, index):
    model, heads = save_tiny(tmp_path / "model"), tmp_path / "heads.json"
    heads.write_text('["0-1", "1-0"]')
    config = BatchConfig(str(index), mode="bm25", rerank=5, model=str(model), heads=str(heads))
    out = tmp_path / "run.trec"
    run_batch({"q1": "apple"}, config, output=out, progress=False)
    heads.write_text('{"heads": ["1-0", "0-1"]}')  # the same heads written another way: resumed
    run_batch({"q1": "apple"}, config, output=out, progress=False)
    assert fake_ray["calls"] == 1
    heads.write_text('["0-0"]')  # detected again into the same file: other heads
    with pytest.raises(InputError, match=r"other settings \(heads_in_file\)"):
        run_batch({"q1": "apple", "q2": "pear"}, config, output=out, progress=False)
    assert fake_ray["calls"] == 1


def test_resume_refuses_a_checkpoint_reranked_under_another_default_preset(fake_ray, tmp_path, index):
    """A checkpoint written before the default preset changed (fused -> signals -> likelihood) records no
    resolved preset: resuming it would append rows of another scorer to its rows. Refused; the
    same run resumes; a run without reranking is not concerned."""
    import json

    model = save_tiny(tmp_path / "model")
    config = BatchConfig(str(index), mode="bm25", rerank=5, model=str(model))
    out = tmp_path / "run.trec"
    run_batch({"q1": "apple"}, config, output=out, progress=False)
    run_batch({"q1": "apple"}, config, output=out, progress=False)  # the same settings: resumed
    assert fake_ray["calls"] == 1
    held, _ = _drop_settings(out, "rerank_preset", "preset")  # as written before the presets were recorded
    assert held["rerank_preset"] == "likelihood"
    with pytest.raises(InputError, match=r"other settings \(rerank_preset\)"):
        run_batch({"q1": "apple", "q2": "pear"}, config, output=out, progress=False)
    assert fake_ray["calls"] == 1
    plain = BatchConfig(str(index), mode="bm25")
    plain_out = tmp_path / "plain.trec"
    run_batch({"q1": "apple"}, plain, output=plain_out, progress=False)
    assert json.loads((tmp_path / "plain.trec.parts" / "settings.json").read_text())["rerank_preset"] is None


def test_resume_refuses_a_checkpoint_whose_rerank_embedded_the_candidates(fake_ray, tmp_path, index):
    """Before 2026-12-03 the rerank actors embedded the candidates (in the reranker's dtype); now
    they read the index's vectors: a checkpoint without that record is refused, never mixed."""

    model = save_tiny(tmp_path / "model")
    config = BatchConfig(str(index), mode="bm25", rerank=5, model=str(model))
    out = tmp_path / "run.trec"
    run_batch({"q1": "apple"}, config, output=out, progress=False)
    assert _drop_settings(out, "dense_signal")[0] == {"dense_signal": "index"}
    with pytest.raises(InputError, match=r"other settings \(dense_signal\)"):
        run_batch({"q1": "apple", "q2": "pear"}, config, output=out, progress=False)
    assert fake_ray["calls"] == 1


def test_resume_refuses_a_signals_checkpoint_scored_by_the_trained_weights(fake_ray, tmp_path, index, home):
    """Before 2026-12-03 the preset signals summed the z-scores with the shipped trained weights;
    now with equal ones: a signals checkpoint without that record is refused, a fused one is not."""
    import json

    model = save_tiny(tmp_path / "model")
    for preset, recorded in (("signals", {"features": ["bm25", "dense"], "weights": [1.0, 1.0]}), ("fused", None)):
        config = BatchConfig(str(index), mode="bm25", rerank=5, model=str(model), preset=preset)
        out = tmp_path / f"{preset}.trec"
        run_batch({"q1": "apple"}, config, output=out, progress=False)
        settings = tmp_path / f"{preset}.trec.parts" / "settings.json"
        old = json.loads(settings.read_text())
        assert old["signals_model"] == recorded
        del old["signals_model"]
        settings.write_text(json.dumps(old))
        calls = fake_ray["calls"]
        if recorded is None:
            run_batch({"q1": "apple"}, config, output=out, progress=False)  # resumed: nothing to redo
            assert fake_ray["calls"] == calls
            continue
        with pytest.raises(InputError, match=r"other settings \(signals_model\)"):
            run_batch({"q1": "apple", "q2": "pear"}, config, output=out, progress=False)
        assert fake_ray["calls"] == calls


def test_a_likelihood_checkpoint_records_the_weights_and_refuses_newly_registered_ones(fake_ray, tmp_path, index, home):
    """Since 2026-12-04 the default preset scores by a user's registered likelihood weights where
    there are some: its checkpoint records the weights; one written before (equal weights, no
    record) resumes, and registering weights afterwards refuses a resume rather than mixing rows."""

    from attnrank.llm.fingerprint import model_fingerprint
    from attnrank.rerank.fused import LikelihoodWeights

    model = save_tiny(tmp_path / "model")
    config = BatchConfig(str(index), mode="bm25", rerank=5, model=str(model), preset="likelihood")
    out = tmp_path / "run.trec"
    run_batch({"q1": "apple"}, config, output=out, progress=False)
    held, _ = _drop_settings(out, "likelihood_model")
    assert held["likelihood_model"] == {"features": ["bm25", "dense", "likelihood"], "weights": [1.0, 1.0, 1.0]}
    calls = fake_ray["calls"]
    run_batch({"q1": "apple"}, config, output=out, progress=False)  # resumed: nothing to redo
    assert fake_ray["calls"] == calls
    recorded = tmp_path / "recorded.trec"
    run_batch({"q1": "apple"}, config, output=recorded, progress=False)
    calls = fake_ray["calls"]
    LikelihoodWeights(["bm25", "likelihood"], [1.0, 3.0]).save(*model_fingerprint(str(model)))
    for path, diff in ((out, "registry"), (recorded, "likelihood_model, registry")):
        with pytest.raises(InputError, match=rf"other settings \({diff}\)"):
            run_batch({"q1": "apple", "q2": "pear"}, config, output=path, progress=False)
    assert fake_ray["calls"] == calls


def test_a_signals_checkpoint_refuses_signal_weights_registered_after_it(fake_ray, tmp_path, index, home):
    """Weights from `attnrank train --preset signals` change what the preset signals scores by:
    a checkpoint written before they were registered is refused, never resumed with new rows."""
    from attnrank.llm.fingerprint import model_fingerprint
    from attnrank.rerank.fused import SignalsWeights

    model = save_tiny(tmp_path / "model")
    config = BatchConfig(str(index), mode="bm25", rerank=5, model=str(model), preset="signals")
    out = tmp_path / "run.trec"
    run_batch({"q1": "apple"}, config, output=out, progress=False)
    calls = fake_ray["calls"]
    SignalsWeights(["bm25", "rank"], [1.0, 3.0]).save(*model_fingerprint(str(model)))
    with pytest.raises(InputError, match=r"other settings \(registry, signals_model\)"):
        run_batch({"q1": "apple", "q2": "pear"}, config, output=out, progress=False)
    assert fake_ray["calls"] == calls


def test_resume_refuses_rows_of_signals_computed_otherwise(fake_ray, tmp_path, index, home):
    """A checkpoint records how the first-stage signals were computed (SIGNALS_VERSION): rows of
    another version are refused, never mixed; one written before the record resumes."""
    import json

    from attnrank.rerank.signals import SIGNALS_VERSION

    model = save_tiny(tmp_path / "model")
    config = BatchConfig(str(index), mode="bm25", rerank=5, model=str(model), preset="signals")
    out = tmp_path / "run.trec"
    run_batch({"q1": "apple"}, config, output=out, progress=False)
    held, old = _drop_settings(out, "signals_version")  # as written before the record
    assert held["signals_version"] == SIGNALS_VERSION
    run_batch({"q1": "apple"}, config, output=out, progress=False)  # resumed: nothing to redo
    assert fake_ray["calls"] == 1
    settings = tmp_path / "run.trec.parts" / "settings.json"
    settings.write_text(json.dumps({**old, "signals_version": SIGNALS_VERSION - 1}))
    with pytest.raises(InputError, match=r"other settings \(signals_version\)"):
        run_batch({"q1": "apple", "q2": "pear"}, config, output=out, progress=False)
    assert fake_ray["calls"] == 1


def test_resume_refuses_heads_registered_since(fake_ray, tmp_path, index, monkeypatch):
    """Without --heads the reranker reads the registry's heads (and weights); heads registered for
    the model between a run and its resume would score the remaining queries with other heads."""
    from attnrank.llm.fingerprint import model_fingerprint
    from attnrank.registry_save import save_head_set

    monkeypatch.setenv("ATTNRANK_HOME", str(tmp_path / "home"))
    model = save_tiny(tmp_path / "model")
    config = BatchConfig(str(index), mode="bm25", rerank=5, model=str(model))
    out = tmp_path / "run.trec"
    run_batch({"q1": "apple"}, config, output=out, progress=False)
    run_batch({"q1": "apple"}, config, output=out, progress=False)  # nothing changed: resumed
    assert fake_ray["calls"] == 1
    model_id, fingerprint = model_fingerprint(str(model))
    save_head_set(model_id, fingerprint, "qrhead", [(0, 1)], name="mine")
    with pytest.raises(InputError, match=r"other settings \(registry\)"):
        run_batch({"q1": "apple", "q2": "pear"}, config, output=out, progress=False)
    assert fake_ray["calls"] == 1


def test_an_actor_refuses_weights_replaced_since_the_run_began(fake_ray, tmp_path, index, home):
    """The driver recorded the model's fingerprint, but the actors never checked the model they
    loaded: weights replaced on the workers between a run and its resume (or a restarted actor)
    scored the remaining queries, two models' rows in one run with exit 0."""
    from dataclasses import replace

    from attnrank.batch import stages

    model = save_tiny(tmp_path / "model")
    config = BatchConfig(str(index), mode="bm25", rerank=5, model=str(model))
    run_batch({"q1": "apple"}, config, output=tmp_path / "run.trec", progress=False)
    recorded = fake_ray["model"]  # what the driver hands its rerank actors
    settings = json.loads((tmp_path / "run.trec.parts" / "settings.json").read_text())
    assert recorded.fingerprint == settings["model_fingerprint"] and recorded.registry == settings["registry"]
    kwargs = dataset.rerank_stage_kwargs(config.resolved(), 1, None, model=recorded)
    save_tiny(model, initializer_range=0.05)  # other weights at the same path, as on a worker
    with pytest.raises(stages.StageError) as e:
        stages.RerankStage(5, 5, **kwargs)
    fresh = runner._model(config)[1]
    assert fresh is not None and fresh != recorded.fingerprint
    message = str(e.value)
    assert recorded.fingerprint in message and fresh in message and "start a new output" in message, message
    # a new run records the new weights, and its actors load them
    stages.RerankStage(
        5, 5, **dataset.rerank_stage_kwargs(config.resolved(), 1, None, model=replace(recorded, fingerprint=fresh))
    )


def test_an_actor_refuses_a_registry_changed_since_the_run_began(fake_ray, tmp_path, index, home):
    """Heads registered on a worker since the run began (or a worker with another registry)
    would score its queries with other heads than the rows already written."""
    from attnrank.batch import stages
    from attnrank.registry_save import save_head_set

    model = save_tiny(tmp_path / "model")
    config = BatchConfig(str(index), mode="bm25", rerank=5, model=str(model))
    run_batch({"q1": "apple"}, config, output=tmp_path / "run.trec", progress=False)
    recorded = fake_ray["model"]
    kwargs = dataset.rerank_stage_kwargs(config.resolved(), 1, None, model=recorded)
    stages.RerankStage(5, 5, **kwargs)  # the same model and registry: accepted
    save_head_set(recorded.model_id, recorded.fingerprint, "qrhead", [(0, 1)], name="mine")
    with pytest.raises(stages.StageError, match=f"head registry .* digest .*, the run's .* {recorded.registry}"):
        stages.RerankStage(5, 5, **kwargs)


def test_actors_get_the_heads_file_read_once_and_the_index_path_resolved(tmp_path, index, monkeypatch):
    """Each actor read --heads FILE itself (from its own folder, whenever Ray started it: an edit
    during the run mixed two head sets) and opened the index path as typed (relative to the
    driver's folder, not a worker's)."""
    heads = tmp_path / "heads.json"
    heads.write_text(json.dumps({"heads": ["0-1", "1-0"]}))
    monkeypatch.chdir(index.parent)
    config = BatchConfig(index.name, mode="bm25", rerank=5, heads=str(heads))
    kwargs = dataset.rerank_stage_kwargs(config.resolved(), 1, None)
    heads.write_text(json.dumps({"heads": ["0-0"]}))  # edited after the run began
    assert kwargs["config"].heads == [(0, 1), (1, 0)] and kwargs["index"] == str(index.absolute())


def test_an_actor_that_refused_its_model_is_one_line_at_the_driver(tmp_path):
    """An actor whose constructor raises reaches the driver as Ray's ActorDiedError, the stage's
    line buried in a traceback (tried with a real Ray: its ``error_msg`` ends as below)."""
    from attnrank.batch.stages import StageError

    class ActorDiedError(Exception):
        error_msg = (
            "The actor died because of an error raised in its creation task\nTraceback (most recent call last):\n"
            '  File "stages.py", line 1, in __init__\n'
            "attnrank.batch.stages.StageError: this worker's model m has the weights fingerprint a, the run's b"
        )

    class Dying:
        def iter_batches(self, **_):
            raise ActorDiedError("died")
            yield

    with pytest.raises(StageError, match=r"^this worker's model m has the weights fingerprint a, the run's b$"):
        dataset.drain(Dying(), CheckpointSink(tmp_path / "parts"), 1, 0, None)
    ActorDiedError.error_msg = "no stage error here"
    with pytest.raises(ActorDiedError):
        dataset.drain(Dying(), CheckpointSink(tmp_path / "parts"), 1, 0, None)


def test_a_model_only_the_workers_have_is_not_checked_against_its_name(tmp_path, index):
    """The driver fingerprints a model it cannot read by the SHA-256 of its name, which no loaded
    model has: the actors are given nothing to check (else every actor would refuse it)."""
    missing = str(tmp_path / "only-on-workers")
    config = BatchConfig(str(index), mode="bm25", rerank=5, model=missing)
    model = runner._model(config)
    assert model[0] == missing and runner.driver_model(model, runner._settings(config, model)) is None
    real = runner._model(BatchConfig(str(index), rerank=5, model=str(save_tiny(tmp_path / "m"))))
    assert runner.driver_model(real, {"registry": "r"}).fingerprint == real[1]


def test_a_run_refused_for_a_checkpoint_in_use_leaves_its_settings_alone(fake_ray, tmp_path, index):
    """Another run holds the checkpoint and has not written its settings yet: a second run with
    other settings is refused without writing its own (they would be the ones a resume checks)."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "run.trec"
    ckpt.mkdir()
    with open(ckpt / ".lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(InputError, match="in use by another attnrank batch run"):
            run_batch({"q1": "apple"}, BatchConfig(str(index), k=5, mode="bm25"), output=out, checkpoint=ckpt)
        assert not (ckpt / "settings.json").exists()
    run_batch({"q1": "apple"}, BatchConfig(str(index), k=10, mode="bm25"), output=out, checkpoint=ckpt)
    assert json.loads((ckpt / "settings.json").read_text())["k"] == 10
    with pytest.raises(InputError, match=r"other settings \(k\)"):
        run_batch({"q1": "apple"}, BatchConfig(str(index), k=5, mode="bm25"), output=out, checkpoint=ckpt)


def test_a_query_without_text_is_refused_before_any_work(fake_ray, tmp_path, index):
    config = BatchConfig(str(index), mode="bm25")
    with pytest.raises(InputError, match="query 'q2' is empty; give every query a text"):
        run_batch({"q1": "apple", "q2": "  "}, config, output=tmp_path / "r.trec", progress=False)
    with pytest.raises(InputError, match="query 'q2' is empty"):  # (a zero-width space: refused by an actor, late)
        run_batch({"q1": "apple", "q2": "\u200b"}, config, output=tmp_path / "r.trec", progress=False)
    with pytest.raises(InputError, match="query 'q2' is not valid Unicode"):  # (a Ray task's UnicodeEncodeError)
        run_batch({"q1": "apple", "q2": "bad \ud800 text"}, config, output=tmp_path / "r.trec", progress=False)
    assert fake_ray["calls"] == 0 and not (tmp_path / "r.trec.parts").exists()


def test_a_file_an_actor_may_not_read_is_one_line_at_the_driver(tmp_path):
    """A PermissionError while an actor loaded its index killed it: Ray's multi-line traceback."""
    from attnrank.batch.stages import StageError, _loading

    with (
        pytest.raises(StageError, match=r"^loading the index: Permission denied: /idx/bm25/data\.npy$"),
        _loading("the index"),
    ):
        raise PermissionError(13, "Permission denied", "/idx/bm25/data.npy")


def test_parquet_queries_without_an_id_are_refused(tmp_path):
    from attnrank.batch.rows import read_queries

    path = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": ["a", None], "text": ["first", "second"]}), path)
    with pytest.raises(InputError, match="row 2 has no query id"):  # not a query named 'None'
        read_queries(path)
    pq.write_table(pa.table({"qid": [7, 8], "query": ["first", "second"]}), path)
    assert read_queries(path) == {"7": "first", "8": "second"}
    # a missing value in a float id column (NaN, as pandas writes it) was the query id ""
    pq.write_table(pa.table({"id": [1.0, float("nan"), 3.0], "text": ["a", "b", "c"]}), path)
    with pytest.raises(InputError, match="row 2 has no query id"):
        read_queries(path)
    # ids trimmed as JSONL and TSV queries' are (" q1" was another query than "q1"); a file that is
    # not Parquet is one line, not pyarrow's traceback
    pq.write_table(pa.table({"id": [" q1 ", "q2"], "text": ["first", "second"]}), path)
    assert read_queries(path) == {"q1": "first", "q2": "second"}
    path.write_text("id\ttext\nq1\tfirst\n")
    with pytest.raises(InputError, match=r"q.parquet is not a readable Parquet file"):
        read_queries(path)


def test_parquet_queries_whose_id_columns_disagree_are_refused(tmp_path):
    """A row number in ``id`` beside BEIR's ``_id`` was read as the query id (the run then matched
    no qrels), where a JSON record with both ids is refused."""
    from attnrank.batch.rows import read_queries

    path = tmp_path / "q.parquet"
    pq.write_table(pa.table({"id": [0, 1], "_id": ["q7", "q9"], "text": ["a b", "c d"]}), path)
    with pytest.raises(InputError, match=r"row 1: the columns 'id' 0, '_id' 'q7' differ; keep one of them"):
        read_queries(path)
    pq.write_table(pa.table({"id": ["q7", "q9"], "_id": ["q7", "q9"], "text": ["a b", "c d"]}), path)
    assert read_queries(path) == {"q7": "a b", "q9": "c d"}  # agreeing columns are one
    pq.write_table(pa.table({"id": ["q7"], "text": ["a b"], "query": ["other"]}), path)
    with pytest.raises(InputError, match="the columns 'text' 'a b', 'query' 'other' differ"):
        read_queries(path)


def test_auto_precision_is_decided_once_by_the_driver_and_resumed_only_alike(fake_ray, tmp_path, index, monkeypatch):
    """dtype "auto" is bfloat16 on one CPU and float32 on another: a resume elsewhere (or actors on
    a mixed cluster) would mix precisions in one run. The driver decides it, and it is recorded."""
    model = save_tiny(tmp_path / "model")
    config, out = BatchConfig(str(index), mode="bm25", rerank=5, model=str(model)), tmp_path / "run.trec"
    monkeypatch.setenv("ATTNRANK_CPU_DTYPE", "bfloat16")
    assert config.resolved().dtype == "bfloat16" and config.resolved().rerank_config().dtype == "bfloat16"
    run_batch({"q1": "apple"}, config, output=out, progress=False)
    settings = json.loads((tmp_path / "run.trec.parts" / "settings.json").read_text())
    assert settings["dtype"] == "bfloat16"
    monkeypatch.setenv("ATTNRANK_CPU_DTYPE", "float32")  # another machine
    with pytest.raises(InputError, match=r"other settings \(dtype\)"):
        run_batch({"q1": "apple"}, config, output=out, progress=False)
    run_batch({"q1": "apple"}, BatchConfig(**{**config.__dict__, "dtype": "bfloat16"}), output=out, progress=False)
    assert fake_ray["calls"] == 1  # asked for explicitly, the same precision resumes


def test_a_run_without_reranking_resumes_on_a_cpu_of_another_precision(fake_ray, tmp_path, index, monkeypatch):
    """Its dtype, resolved on the CPU though nothing reranks, refused the resume elsewhere."""
    config, out = BatchConfig(str(index), mode="bm25"), tmp_path / "run.trec"
    monkeypatch.setenv("ATTNRANK_CPU_DTYPE", "bfloat16")
    run_batch({"q1": "apple"}, config, output=out, progress=False, checkpoint=tmp_path / "parts")
    assert "dtype" not in json.loads((tmp_path / "parts" / "settings.json").read_text())
    monkeypatch.setenv("ATTNRANK_CPU_DTYPE", "float32")  # another machine
    run_batch({"q1": "apple"}, config, output=out, progress=False, checkpoint=tmp_path / "parts")
    assert out.read_text().startswith("q1 Q0 ")


def test_ids_a_run_cannot_hold_and_a_checkpoint_at_an_output_are_refused_before_any_work(fake_ray, tmp_path, index):
    config, out = BatchConfig(str(index), mode="bm25"), tmp_path / "run.trec"
    with pytest.raises(InputError, match="query id 'q 1' is empty or holds whitespace"):
        run_batch({"q 1": "apple"}, config, output=out, progress=False)
    (queries := tmp_path / "q.jsonl").write_text('{"_id": "q1", "text": "apple"}\n{"_id": "q 2", "text": "pear"}\n')
    with pytest.raises(InputError, match=f"{queries}:2: query id 'q 2' holds whitespace"):  # a file's: at its line
        run_batch(queries, config, output=out, progress=False)
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.table({"id": ["q1", "q 2"], "text": ["apple", "pear"]}), rows := tmp_path / "q.parquet")
    with pytest.raises(InputError, match=f"{rows}: row 2: query id 'q 2' holds whitespace"):  # at its row too
        run_batch(rows, config, output=out, progress=False)
    run_batch({"q 1": "apple"}, config, parquet=tmp_path / "rows.parquet", progress=False)  # Parquet holds it
    for checkpoint, what in ((out, "-o"), (tmp_path / "rows.parquet", "--parquet")):
        with pytest.raises(InputError, match=f"is {what}; give the checkpoint its own folder"):
            run_batch({"q1": "apple"}, config, output=out, parquet=tmp_path / "rows.parquet", checkpoint=checkpoint)
    with pytest.raises(InputError, match="--mode 'bm52' is not one of bm25, dense, hybrid"):
        run_batch({"q1": "apple"}, BatchConfig(str(index), mode="bm52"), output=out, progress=False)
    from attnrank.index.retriever import HybridRetriever
    from attnrank.types import Document

    docs = [Document("d1", "apple"), Document("d2", "pear"), Document("my notes", "plum")]
    HybridRetriever().index(docs, show_progress=False).save(index)  # was found only by the run file's write
    with pytest.raises(InputError, match="document id 'my notes' is empty or holds whitespace"):
        run_batch({"q1": "apple"}, config, output=out, progress=False)
    assert fake_ray["calls"] == 1 and not out.exists()


def test_a_checkpoint_without_rows_takes_the_settings_of_the_next_run(fake_ray, tmp_path, index):
    """A run that failed before its first row (e.g. a model that would not load) leaves only its
    settings: the corrected command starts afresh instead of being refused for them."""
    out, parts = tmp_path / "run.trec", tmp_path / "run.trec.parts"
    fake_ray["during"] = lambda: (_ for _ in ()).throw(RuntimeError("actor failed"))
    with pytest.raises(RuntimeError):
        run_batch({"q1": "apple"}, BatchConfig(str(index), mode="dense"), output=out, progress=False)
    assert not list(parts.glob("part-*"))
    fake_ray["during"] = None
    assert run_batch({"q1": "apple"}, BatchConfig(str(index), mode="bm25"), output=out, progress=False)["rows"] == 1
    assert json.loads((parts / "settings.json").read_text())["mode"] == "bm25"
    with pytest.raises(InputError, match=r"other settings \(mode\)"):  # rows now: refused as before
        run_batch({"q1": "apple"}, BatchConfig(str(index), mode="dense"), output=out, progress=False)


def test_rows_whose_settings_file_is_gone_are_refused_not_resumed(fake_ray, tmp_path, index):
    """Parts without settings.json (copied to a new folder, or the file deleted "to reset") got the
    next run's settings, and their rows were resumed into a run of other settings."""
    out, parts = tmp_path / "run.trec", tmp_path / "run.trec.parts"
    run_batch({"q1": "apple"}, BatchConfig(str(index), k=5, mode="bm25"), output=out, progress=False)
    parts.mkdir(exist_ok=True)
    sink = CheckpointSink(parts)
    sink.add([_row("q1", "apple")])
    sink.commit()
    (parts / "settings.json").unlink()
    out.unlink()
    with pytest.raises(InputError, match=r"holds rows \(part-00000.parquet\) but no settings.json"):
        run_batch({"q1": "apple"}, BatchConfig(str(index), k=10, mode="dense"), output=out, progress=False)
    assert not (parts / "settings.json").exists() and not out.exists()


def test_the_sink_drops_a_query_committed_or_buffered_before(tmp_path):
    sink = CheckpointSink(tmp_path)
    sink.add([_row("a", "a"), _row("b", "b"), _row("a", "a")])  # buffered twice in one batch
    sink.commit()
    sink.add([_row("b", "b"), _row("c", "c")])  # committed before
    assert sink.duplicates == 2 and [r["qid"] for r in sink.buffer] == ["c"]
    assert sink.finish(["a", "b", "c"], trec=tmp_path / "r.trec", parquet=None, tag="t")["rows"] == 3


def test_finish_keeps_one_of_identical_rows_and_refuses_different_ones(tmp_path):
    """A part written twice (an interrupt between the write and the bookkeeping) holds the same
    rows: one is kept. Different rows of one query mean mixed runs: refused, naming the part."""
    sink = CheckpointSink(tmp_path / "ckpt")
    sink.add([_row("a", "a")])
    sink.commit()
    (tmp_path / "ckpt" / "part-00001.parquet").write_bytes((tmp_path / "ckpt" / "part-00000.parquet").read_bytes())
    sink = CheckpointSink(tmp_path / "ckpt")
    assert sink.finish(["a"], trec=tmp_path / "r.trec", parquet=None, tag="t")["rows"] == 1
    sink.buffer, sink.done = [_row("a", "other")], {}
    sink.commit()
    with pytest.raises(InputError, match="query 'a' has two different rows .* part-00002.parquet"):
        sink.finish(["a"], trec=tmp_path / "r.trec", parquet=None, tag="t")


def test_a_commit_interrupted_keeps_its_rows_once(tmp_path, monkeypatch):
    """Interrupted while writing its part, a commit keeps the rows for the next commit, which
    writes them under a new part number (never over a part)."""
    sink = CheckpointSink(tmp_path)
    sink.add([_row("a", "a")])
    real = pq.write_table

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(pq, "write_table", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sink.commit()
    monkeypatch.setattr(pq, "write_table", real)
    assert [r["qid"] for r in sink.buffer] == ["a"] and not list(tmp_path.glob("part-*"))
    sink.commit()
    assert [p.name for p in tmp_path.glob("part-*")] == ["part-00001.parquet"] and sink.buffer == []
    assert sink.finish(["a"], trec=tmp_path / "r.trec", parquet=None, tag="t")["rows"] == 1


def test_a_users_parquet_with_the_batch_columns_is_not_replaced(fake_ray, tmp_path, index):
    """Recognised by the schema mark attnrank writes, not by its column names."""
    theirs = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([_row("q9", "mine")]), theirs)
    with pytest.raises(InputError, match="exists and is not a batch Parquet file attnrank wrote"):
        run_batch({"q1": "apple"}, BatchConfig(str(index), mode="bm25"), parquet=theirs, progress=False)
    assert pq.read_table(theirs).column("qid").to_pylist() == ["q9"]


def test_outputs_that_appeared_during_the_run_are_not_replaced(fake_ray, tmp_path, index):
    """-o and --parquet were checked before the run; at its end whatever was there was replaced."""
    config, out, parquet = BatchConfig(str(index), mode="bm25"), tmp_path / "run.trec", tmp_path / "rows.parquet"

    def writes(path, text):
        return lambda done, total: path.write_text(text)

    with pytest.raises(InputError, match="-o .*run.trec exists and is not a TREC run attnrank wrote"):
        run_batch({"q1": "apple"}, config, output=out, progress=False, on_commit=writes(out, "notes\n"))
    assert out.read_text() == "notes\n"
    with pytest.raises(InputError, match="--parquet .*rows.parquet exists and is not a batch Parquet file"):
        run_batch(
            {"q1": "apple"}, config, parquet=parquet, checkpoint=tmp_path / "p", progress=False,
            on_commit=writes(parquet, "not parquet\n"),
        )  # fmt: skip
    assert parquet.read_text() == "not parquet\n"


def test_resume_refuses_rows_of_an_earlier_first_stage(fake_ray, tmp_path, index):
    """BM25 and convex fusion changed on 2026-12-05 after checkpoints existed: a checkpoint without
    the retrieval version (or with another) holds rows of the first stage before, and is refused."""
    from attnrank.index.settings import RETRIEVAL_VERSION

    config, out = BatchConfig(str(index), mode="bm25"), tmp_path / "run.trec"
    run_batch({"q1": "apple"}, config, output=out, progress=False)
    assert _drop_settings(out, "retrieval_version")[0] == {"retrieval_version": RETRIEVAL_VERSION}
    with pytest.raises(InputError, match=r"other settings \(retrieval_version\)"):
        run_batch({"q1": "apple", "q2": "pear"}, config, output=out, progress=False)
    assert fake_ray["calls"] == 1


def test_resume_accepts_the_same_index_spelled_otherwise(fake_ray, tmp_path, index, monkeypatch):
    monkeypatch.chdir(index.parent)
    out = tmp_path / "run.trec"
    run_batch({"q1": "apple"}, BatchConfig(index.name, mode="bm25"), output=out, progress=False)
    stats = run_batch({"q1": "apple"}, BatchConfig(str(index.resolve()), mode="bm25"), output=out, progress=False)
    assert stats["resumed_skipped"] == 1 and fake_ray["calls"] == 1  # was: refused, "other settings (index)"


def test_a_checkpoint_holding_the_runs_own_output_resumes(fake_ray, tmp_path, index):
    """-o inside the checkpoint folder: its second run found the run file there and refused the
    folder as not a checkpoint."""
    ckpt = tmp_path / "out"
    config = BatchConfig(str(index), mode="bm25")
    run_batch({"q1": "apple"}, config, output=ckpt / "run.trec", checkpoint=ckpt, progress=False)
    stats = run_batch({"q1": "apple", "q2": "pear"}, config, output=ckpt / "run.trec", checkpoint=ckpt, progress=False)
    assert stats["resumed_skipped"] == 1


@pytest.mark.parametrize("beside", [None, "notes.md"])
def test_a_users_settings_json_is_never_taken_for_a_checkpoints(fake_ray, tmp_path, index, beside):
    """A settings.json holding an "index" key passed for a checkpoint's; with no parts yet it was
    replaced by the run's settings (the user's file lost) and parts were written beside it."""
    theirs = tmp_path / "experiment"
    theirs.mkdir()
    (theirs / "settings.json").write_text('{"index": "bm25-v2", "theme": "dark"}')
    if beside:
        (theirs / beside).write_text("mine")
    before = _files(theirs)
    with pytest.raises(InputError, match="is not an attnrank batch checkpoint"):
        run_batch({"q1": "apple"}, BatchConfig(str(index), mode="bm25"), output=tmp_path / "r.trec", checkpoint=theirs)
    assert _files(theirs) == before and fake_ray["calls"] == 0


def test_batch_without_the_ray_extra_names_it_and_makes_nothing(tmp_path, index, monkeypatch):
    """The checkpoint folder was made, then pyarrow's bare import failed with a traceback."""
    import sys

    from attnrank.errors import MissingExtraError

    monkeypatch.setitem(sys.modules, "ray.data", None)  # as if the extra were not installed
    out = tmp_path / "run.trec"
    with pytest.raises(MissingExtraError, match=r"pip install 'attnrank\[ray\]'"):
        run_batch({"q1": "apple"}, BatchConfig(str(index)), output=out)
    assert not out.with_name(out.name + ".parts").exists()


def test_a_folder_that_is_no_index_is_refused_before_ray_starts(fake_ray, tmp_path):
    """Only is_dir() was checked: every actor's load then failed in its constructor, which Ray
    retries without end."""
    from attnrank.errors import IndexFormatError

    folder = tmp_path / "not-an-index"
    folder.mkdir()
    (folder / "docs.jsonl").write_text('{"id": "d1", "text": "apple"}\n')
    with pytest.raises(IndexFormatError):
        run_batch({"q1": "apple"}, BatchConfig(str(folder)), output=tmp_path / "r.trec")
    assert fake_ray["calls"] == 0 and not (tmp_path / "r.trec.parts").exists()


def test_tied_scores_are_written_in_each_rows_order(tmp_path):
    """`search -o` writes tied scores in the ranking's order; batch wrote them by doc id (the run
    file disagreed with its own Parquet rows and with the single-process run)."""
    sink = CheckpointSink(tmp_path / "parts")
    row = _row("q1", "x", docs=2)
    row["doc_ids"], row["scores"] = ["d1", "d9"], [0.5, 0.5]
    sink.add([row])
    sink.finish(["q1"], trec=tmp_path / "r.trec", parquet=None, tag="attnrank-test")
    assert [line.split()[2] for line in (tmp_path / "r.trec").read_text().splitlines()] == ["d1", "d9"]


def test_a_checkpoint_before_the_stemmer_was_recorded_resumes_only_where_it_stems(
    fake_ray, tmp_path, index, monkeypatch
):
    """The candidate stemmer was first recorded on 2026-12-05, and a missing record was accepted:
    a core install (no PyStemmer) resumed an earlier checkpoint, whose rows all stemmed, with
    unstemmed ones. A worker whose stemmer differs from the driver's is refused too."""
    from dataclasses import replace

    from attnrank.batch import runner, stages
    from attnrank.rerank import signals

    model = save_tiny(tmp_path / "model")
    config = BatchConfig(str(index), mode="bm25", rerank=5, model=str(model))
    out = tmp_path / "run.trec"
    run_batch({"q1": "apple"}, config, output=out, progress=False)
    assert _drop_settings(out, "candidate_stemmer")[0] == {"candidate_stemmer": "porter"}
    run_batch({"q1": "apple"}, config, output=out, progress=False)  # stems here too: resumed
    stemming = signals.candidate_terms
    unstemmed = replace(stemming(), stemmer="none")
    monkeypatch.setattr(runner, "candidate_terms", lambda: unstemmed)
    with pytest.raises(InputError, match=r"other settings \(candidate_stemmer\)"):
        run_batch({"q1": "apple", "q2": "pear"}, config, output=out, progress=False)
    monkeypatch.setattr(signals, "candidate_terms", lambda: unstemmed)
    with pytest.raises(stages.StageError, match="stems with 'none', the run's with 'porter'"):
        stages.RerankStage(5, 5, config=config.rerank_config(), stemmer="porter")
    # a preset without candidate BM25 (attention alone) never asks a worker for its stemmer
    # (the driver stems, this worker does not: a run that computes no BM25 was refused for it)
    monkeypatch.setattr(runner, "candidate_terms", stemming)
    alone = BatchConfig(str(index), mode="bm25", rerank=5, model=str(model), preset="qrhead", heads="0-1")
    stages.RerankStage(5, 5, **dataset.rerank_stage_kwargs(alone, 1, None))
    assert dataset.rerank_stage_kwargs(config, 1, None)["stemmer"] == "porter"


def test_a_checkpoint_of_a_device_batch_no_longer_takes_resumes_on_the_one_it_ran_on(fake_ray, tmp_path, index):
    """batch took --device auto (which declared no GPU: its actors ran on the CPU) and cuda:0 (the
    one GPU Ray shows an actor) before it refused them; their checkpoints were refused for other
    settings (device) on a resume with cpu or cuda, and their rows lost."""
    out = tmp_path / "run.trec"
    run_batch({"q1": "apple"}, BatchConfig(str(index), mode="bm25", device="auto"), output=out, progress=False)
    stats = run_batch(
        {"q1": "apple", "q2": "pear"}, BatchConfig(str(index), mode="bm25", device="cpu"), output=out, progress=False
    )
    assert stats["resumed_skipped"] == 1
    with pytest.raises(InputError, match=r"other settings \(device\)"):  # another device still is
        run_batch({"q1": "apple"}, BatchConfig(str(index), mode="bm25", device="cuda"), output=out, progress=False)


def test_reranking_on_gpus_needs_a_precision_the_driver_names(tmp_path, index):
    """--device cuda with --dtype auto left each actor's GPU to choose bfloat16 or float16: a run
    resumed or scheduled on other GPUs mixed them under one recorded "auto" (exit 0)."""
    config = BatchConfig(str(index), mode="bm25", rerank=5, preset="signals", device="cuda")
    with pytest.raises(InputError, match="--dtype auto with --device cuda .* give --dtype bfloat16"):
        config.check()
    BatchConfig(str(index), mode="bm25", rerank=5, preset="signals", device="cuda", dtype="float16").check()
    BatchConfig(str(index), mode="bm25", device="cuda").check()  # no reranking: no model, no precision


def test_progress_counts_this_runs_queries_and_workers_get_an_absolute_model_path(
    fake_ray, tmp_path, index, monkeypatch
):
    """Progress counted every query the checkpoint held, of earlier queries files too (130/100); a
    model folder named relative to the driver's folder was given to workers, which run in their own."""

    out = tmp_path / "run.trec"
    run_batch({"a": "apple", "b": "pear"}, BatchConfig(str(index), mode="bm25"), output=out, progress=False)
    seen: list[tuple[int, int]] = []
    stats = run_batch(
        {"b": "pear", "c": "plum"},
        BatchConfig(str(index), mode="bm25"),
        output=out,
        progress=False,
        on_commit=lambda done, total: seen.append((done, total)),
    )
    assert stats["resumed_skipped"] == 1 and seen and seen[-1] == (2, 2)
    (tmp_path / "m").mkdir()
    monkeypatch.chdir(tmp_path)
    kwargs = dataset.rerank_stage_kwargs(BatchConfig(str(index), rerank=5, preset="signals", model="m"), 1, None)
    assert kwargs["config"].model == str(tmp_path / "m")


def test_a_model_a_local_ray_cannot_load_is_refused_before_ray_starts(fake_ray, tmp_path, index):
    """A mistyped model path was only fingerprinted by its name (a model only a cluster's workers
    have); a local Ray then started, and every rerank actor died loading it (Ray's traceback)."""
    from attnrank.errors import ModelError

    config = BatchConfig(str(index), mode="bm25", rerank=5, model=str(tmp_path / "models" / "typo"))
    with pytest.raises(ModelError, match="typo"):
        run_batch({"q1": "apple"}, config, output=tmp_path / "r.trec", progress=False)
    with pytest.raises(ModelError, match="typo"):  # ('local' is a local Ray too, as ray.init reads it)
        run_batch({"q1": "apple"}, config, output=tmp_path / "r.trec", progress=False, ray_address="local")
    assert fake_ray["calls"] == 0
    run_batch({"q1": "apple"}, config, output=tmp_path / "r.trec", progress=False, ray_address="auto")
    assert fake_ray["calls"] == 1  # (a cluster's workers may have it: their actors check it)


@pytest.mark.parametrize(
    ("options", "resources", "message"),
    [
        ({"heads": [(1, 2)]}, {}, r"heads=\[\(1, 2\)\] is not a string; give 'all', 'l-h,l-h'"),
        ({"device": "cuda:1", "dtype": "bfloat16"}, {}, "device='cuda:1' is not cpu or cuda"),
        ({"device": "cuda", "dtype": "bfloat16"}, {}, "device='cuda' with rerank_gpus=0.0: Ray hides the GPUs"),
    ],
)
def test_settings_no_rerank_actor_could_run_are_refused_before_ray_starts(
    fake_ray, tmp_path, index, options, resources, message
):
    """Heads given as a list ran, but their checkpoint (JSON: lists) never matched them again, so
    no run could resume; a device an actor cannot see failed in every actor (the CLI alone checked it)."""
    from attnrank.batch import Resources

    config = BatchConfig(str(index), mode="bm25", rerank=5, **options)
    with pytest.raises(InputError, match=message):
        run_batch({"q1": "apple"}, config, output=tmp_path / "r.trec", resources=Resources(**resources), progress=False)
    assert fake_ray["calls"] == 0


def _set_scoring_version(out: Path, version: int) -> None:
    settings = out.with_name(out.name + ".parts") / "settings.json"
    held = json.loads(settings.read_text())
    settings.write_text(json.dumps({**held, "scoring_version": version}))


def test_resume_accepts_rows_of_another_scoring_version_only_where_the_scores_it_reads_did_not_move(
    fake_ray, tmp_path, index
):
    """Version 2 moved the likelihood alone: an attention run begun at version 1 was refused a
    resume all the same, and its rows computed again; a likelihood run's rows of version 1 were
    scored otherwise and must stay refused, as must rows of a later attnrank. Preset fused's
    weights come from the registry in each actor (a user's may read the likelihood): judged as
    reading both."""
    from attnrank.rerank.versions import ATTENTION_SINCE, LIKELIHOOD_SINCE, SCORING_VERSION

    model = save_tiny(tmp_path / "model")
    for preset, heads, since in (
        ("qrhead", "all", ATTENTION_SINCE),
        ("likelihood", None, LIKELIHOOD_SINCE),
        ("fused", "all", LIKELIHOOD_SINCE),
    ):
        resumed, refused = [since], [since - 1, SCORING_VERSION + 1]
        config = BatchConfig(str(index), mode="bm25", rerank=5, model=str(model), preset=preset, heads=heads)
        out = tmp_path / f"{preset}.trec"
        run_batch({"q1": "apple"}, config, output=out, progress=False)
        for version in refused:
            _set_scoring_version(out, version)
            with pytest.raises(InputError, match=r"other settings \(scoring_version\)"):
                run_batch({"q1": "apple", "q2": "pear"}, config, output=out, progress=False)
        for version in resumed:
            _set_scoring_version(out, version)
            stats = run_batch({"q1": "apple", "q2": "pear"}, config, output=out, progress=False)
            assert stats["resumed_skipped"] == 1, (preset, version)


def test_resume_refuses_rows_scored_before_the_scoring_version_or_on_other_thread_counts(fake_ray, tmp_path, index):
    """Scores moved on 2026-12-06 (the likelihood prompt, sliding windows, sink filtering) with no
    stamp: a rerank checkpoint without the scoring version is refused. The actors' torch threads
    follow --actor-cpus, and bfloat16 sums in another order on another count (the default preset's
    scores moved by up to 0.05): a resume with other actor CPUs is refused too."""
    from attnrank.batch import Resources
    from attnrank.rerank.versions import SCORING_VERSION

    model = save_tiny(tmp_path / "model")
    config = BatchConfig(str(index), mode="bm25", rerank=5, model=str(model))
    out = tmp_path / "run.trec"
    run_batch({"q1": "apple"}, config, output=out, progress=False)
    held, left = _drop_settings(out, "scoring_version")
    assert held == {"scoring_version": SCORING_VERSION} and left["torch_threads"] == {"retrieval": 1, "rerank": 1}
    with pytest.raises(InputError, match=r"other settings \(scoring_version\)"):
        run_batch({"q1": "apple", "q2": "pear"}, config, output=out, progress=False)
    plain, plain_out = BatchConfig(str(index), mode="bm25"), tmp_path / "plain.trec"
    run_batch({"q1": "apple"}, plain, output=plain_out, progress=False)
    with pytest.raises(InputError, match=r"other settings \(torch_threads\)"):
        run_batch(
            {"q1": "apple", "q2": "pear"},
            plain,
            output=plain_out,
            resources=Resources(retrieval_cpus=2),
            progress=False,
        )
    stats = run_batch(
        {"q1": "apple", "q2": "pear"}, plain, output=plain_out, resources=Resources(retrieval_cpus=1.2), progress=False
    )
    assert stats["resumed_skipped"] == 1  # (1.2 CPUs run one thread, as 1 does)


@pytest.mark.parametrize(
    "queries, message",
    [({" q1": "apple", "q1": "pear"}, "query id ' q1' has spaces around it"), ({1: "apple"}, "query id 1 is a int")],
)
def test_query_ids_of_a_dict_are_checked_as_a_file_reads_them(fake_ray, tmp_path, index, queries, message):
    """A dict's ids were not checked: ' q1' beside 'q1' gave two rows every reader trims to one id,
    and an id 1 failed in pyarrow after the queries were computed."""
    with pytest.raises(InputError, match=re.escape(message)):
        run_batch(queries, BatchConfig(str(index), mode="bm25"), output=tmp_path / "run.trec", progress=False)
    assert fake_ray["calls"] == 0


def test_an_os_error_naming_no_file_is_one_line_without_a_none(tmp_path):
    """The one line read "No space left on device: None" where the error named no file."""
    from attnrank.batch.stages import StageError, _loading

    with pytest.raises(StageError, match=r"^loading the index: No space left on device$"), _loading("the index"):
        raise OSError(28, "No space left on device")


def test_sigterm_commits_the_buffered_rows_as_ctrl_c_does(fake_ray, tmp_path, index):
    """SIGTERM (SLURM, Kubernetes, `kill`) ended a run without committing the rows buffered since
    the last part: up to 64 rows or 30 s of work, recomputed on resume."""
    import os
    import signal

    seen = []

    def terminated_at_the_third():
        seen.append(1)
        if len(seen) == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    def unhandled(signum, frame):  # (the test process's own: without the fix, SIGTERM reaches it, not the run)
        raise RuntimeError("SIGTERM reached the process, not the run")

    fake_ray["during"] = terminated_at_the_third
    before = signal.signal(signal.SIGTERM, unhandled)
    try:
        queries = {f"q{i}": f"apple {i}" for i in range(5)}
        with pytest.raises(KeyboardInterrupt):
            run_batch(queries, BatchConfig(str(index), mode="bm25"), output=tmp_path / "r.trec", progress=False)
        assert signal.getsignal(signal.SIGTERM) is unhandled  # (the process's own handler is back)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert sorted(CheckpointSink(tmp_path / "r.trec.parts").done) == ["q0", "q1"]  # (the two drained before it)
