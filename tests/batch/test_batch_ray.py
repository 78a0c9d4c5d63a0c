"""Batch search + rerank on Ray Data: equals `search --rerank`, resumes, survives a killed actor (issue 17)."""

from __future__ import annotations

import math
import os
import signal

import pytest
from typer.testing import CliRunner

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("ray")

from _tiny import save_tiny

from attnrank.batch import BatchConfig, Resources, run_batch
from attnrank.batch.rows import read_queries
from attnrank.batch.stages import RerankStage, RetrievalStage, StageError
from attnrank.cli import app
from attnrank.errors import InputError
from attnrank.eval import read_run, write_run
from attnrank.index.retriever import HybridRetriever
from attnrank.index.sharded import ShardedIndexer
from attnrank.types import Document

runner = CliRunner()
SMALL = Resources(retrieval_actors=1, rerank_actors=1, retrieval_cpus=0.5, rerank_cpus=1, rerank_batch=2)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("m") / "tiny", layers=3, max_positions=8192)


@pytest.fixture(scope="module")
def indexes(tmp_path_factory, built_retriever, scifact_docs):
    root = tmp_path_factory.mktemp("idx")
    built_retriever.save(root / "single")
    vectors = built_retriever.dense.faiss_index.reconstruct_n(0, built_retriever.num_docs)
    ShardedIndexer(HybridRetriever(), shards=3).build(scifact_docs, root / "sharded", embeddings=vectors)
    return root


def test_batch_run_equals_search_rerank(ray_local, tmp_path, indexes, tiny_dir, scifact_mini):
    queries = scifact_mini / "queries.jsonl"
    single = tmp_path / "search.trec"
    r = runner.invoke(
        app,
        [
            "search",
            "--index-dir",
            str(indexes / "single"),
            "--queries",
            str(queries),
            "--rerank",
            "5",
            "--preset",
            "fused",
            "--model",
            str(tiny_dir),
            "-o",
            str(single),
            "-q",
        ],
    )
    assert r.exit_code == 0, r.output
    out, pq_out = tmp_path / "batch.trec", tmp_path / "batch.parquet"
    stats = run_batch(
        queries,
        BatchConfig(str(indexes / "sharded"), k=10, rerank=5, model=str(tiny_dir), preset="fused"),
        output=out,
        parquet=pq_out,
        resources=SMALL,
        progress=False,
    )
    assert stats["rows"] == 12 and stats["queries_per_second"] > 0
    # Byte for byte: both read the candidates' dense signal from their index's stored vectors (the
    # sharded one from each document's own shard), so neither embeds them in the reranker's dtype.
    assert out.read_text() == single.read_text()
    rows = pq.read_table(pq_out).to_pylist()
    assert [r["qid"] for r in rows] == list(read_queries(queries))
    first = rows[0]
    assert len(first["doc_ids"]) == 10 and "texts" not in first
    assert not any(math.isnan(v) for v in first["stage_attention"][:5])  # the reranked head
    assert all(math.isnan(v) for v in first["stage_attention"][5:])  # the tail keeps first-stage scores only
    assert not any(math.isnan(v) for v in first["stage_fused"][:5])
    assert not any(math.isnan(v) for v in first["stage_hybrid"])


def test_resume_skips_written_queries_and_refuses_other_settings(ray_local, tmp_path, indexes, scifact_mini):
    qs = read_queries(scifact_mini / "queries.jsonl")
    config = BatchConfig(str(indexes / "single"), k=5, mode="bm25")
    out, ckpt = tmp_path / "run.trec", tmp_path / "ckpt"
    half = dict(list(qs.items())[:5])
    run_batch(half, config, output=out, checkpoint=ckpt, resources=SMALL, progress=False)
    stats = run_batch(qs, config, output=out, checkpoint=ckpt, resources=SMALL, progress=False)
    assert stats["resumed_skipped"] == 5 and stats["rows"] == 12
    fresh = tmp_path / "fresh.trec"  # the same queries in one process, without Ray
    write_run(HybridRetriever.load(indexes / "single").search_batch(qs, 5, mode="bm25"), fresh, tag="attnrank-bm25")
    assert out.read_text() == fresh.read_text()
    again = run_batch(qs, config, output=out, checkpoint=ckpt, resources=SMALL, progress=False)
    assert again["resumed_skipped"] == 12 and again["queries_per_second"] is None
    with pytest.raises(InputError, match="other settings"):
        run_batch(qs, BatchConfig(str(indexes / "single"), k=7, mode="bm25"), output=out, checkpoint=ckpt)


def test_queries_without_a_hit_are_counted_and_a_run_of_none_is_refused(ray_local, tmp_path, indexes, scifact_mini):
    """A query no document shares a term with has no line in a TREC run: written without a word,
    and a run of only such queries left an empty run file, exit 0 (`search -o` refuses it)."""
    real = next(iter(read_queries(scifact_mini / "queries.jsonl").values()))
    config = BatchConfig(str(indexes / "single"), k=3, mode="bm25")
    stats = run_batch(
        {"hit": real, "none": "zzqx qqzv"}, config, output=tmp_path / "run.trec", resources=SMALL, progress=False
    )
    assert stats["no_hits"] == 1 and stats["rows"] == 2
    with pytest.raises(InputError, match="no query had a hit, so nothing was written"):
        run_batch({"none": "zzqx qqzv"}, config, output=tmp_path / "none.trec", resources=SMALL, progress=False)
    assert not (tmp_path / "none.trec").exists()


def _rerank_actor_pids(ray) -> list[int]:
    from ray._private import (
        state,  # the actor table with process ids (needs no dashboard)
    )

    return [
        a["Pid"]
        for a in state.actors().values()
        if "RerankStage" in a["ActorClassName"] and a["State"] == "ALIVE" and a.get("Pid")
    ]


def test_killed_rerank_actor_neither_loses_nor_duplicates_rows(ray_local, tmp_path, indexes, tiny_dir, scifact_mini):
    base = read_queries(scifact_mini / "queries.jsonl")
    qs = {f"{qid}-{i}": text for i in range(2) for qid, text in base.items()}  # 24 queries
    config = BatchConfig(str(indexes / "sharded"), k=5, rerank=3, mode="bm25", model=str(tiny_dir))
    killed: list[int] = []

    def kill_once(done: int, total: int) -> None:
        if not killed and done < total:
            pids = _rerank_actor_pids(ray_local)
            assert pids, "no live rerank actor to kill"
            os.kill(pids[0], signal.SIGKILL)
            killed.append(pids[0])

    # One query per block and batch: rows reach the driver one at a time, so at the first commit
    # 23 queries are still to be reranked (about 0.8 s of work here). With blocks of 8 the stage
    # had finished, and its actor was gone, within 60 ms of the first commit: the kill raced it.
    res = Resources(
        retrieval_actors=1, rerank_actors=1, retrieval_cpus=0.5, rerank_cpus=1, rerank_batch=1, retrieval_batch=1
    )
    out = tmp_path / "killed.trec"
    stats = run_batch(qs, config, output=out, resources=res, on_commit=kill_once, progress=False)
    assert killed and stats["rows"] == 24
    run = read_run(out)
    assert sorted(run) == sorted(qs) and all(len(v) == 5 for v in run.values())
    parts = sorted((tmp_path / "killed.trec.parts").glob("part-*.parquet"))
    written = [q for p in parts for q in pq.read_table(p, columns=["qid"]).column("qid").to_pylist()]
    assert sorted(written) == sorted(qs)  # each query exactly once in the checkpoint
    clean = tmp_path / "clean.trec"  # the same stages called in this process, without Ray
    table = pa.Table.from_pylist([{"qid": q, "query": t} for q, t in qs.items()])
    rows = RerankStage(3, 5, config=config.rerank_config(), index=config.index)(
        RetrievalStage(config.index, 5, mode="bm25")(table)
    ).to_pylist()
    tag = f"attnrank-{config.rerank_config().name}"  # a reranked run is tagged with its preset
    write_run({r["qid"]: dict(zip(r["doc_ids"], r["scores"])) for r in rows}, clean, tag=tag)
    assert out.read_text() == clean.read_text()


def test_an_error_in_a_stage_is_one_line_naming_the_query(ray_local, tmp_path, tiny_dir):
    idx = tmp_path / "idx"  # an index holding a document without text (as index() took before 2026-12-06)
    docs = [Document("a", "apples are red"), Document("b", "pears are green"), Document("empty", "red")]
    built = HybridRetriever().index(docs, show_progress=False)
    built.docs[2] = Document("empty", "")
    built.save(idx)
    out = tmp_path / "run.trec"
    with pytest.raises(StageError) as e:  # not Ray's traceback of a UserCodeException
        run_batch(
            {"q1": "red apples"},
            BatchConfig(str(idx), k=3, rerank=3, model=str(tiny_dir)),
            output=out,
            resources=SMALL,
            progress=False,
        )
    message = str(e.value)
    assert message.startswith("query 'q1': document #") and "('empty') has no text" in message, message
    assert "\n" not in message and not out.exists()


def test_bad_input_is_refused_before_ray(tmp_path, indexes, tiny_dir):
    with pytest.raises(InputError, match="is not a folder"):
        run_batch({"q": "x"}, BatchConfig(str(tmp_path / "none")), output=tmp_path / "o")
    with pytest.raises(InputError, match="--rerank -1"):
        run_batch({"q": "x"}, BatchConfig(str(indexes / "single"), rerank=-1), output=tmp_path / "o")
    # heads outside the model: failed in every actor, after Ray started and each loaded the model
    bad = BatchConfig(str(indexes / "single"), rerank=3, model=str(tiny_dir), preset="icr", heads="99-0")
    with pytest.raises(InputError, match="head pairs 99-0 are out of range"):
        run_batch({"q": "x"}, bad, output=tmp_path / "o")
    pq.write_table(pa.table({"name": ["a"], "text": ["b"]}), tmp_path / "q.parquet")
    with pytest.raises(InputError, match="id column"):
        read_queries(tmp_path / "q.parquet")
    pq.write_table(pa.table({"qid": ["a", "b"], "query": ["first", "second"]}), tmp_path / "ok.parquet")
    assert read_queries(tmp_path / "ok.parquet") == {"a": "first", "b": "second"}


@pytest.mark.parametrize(
    ("preset", "heads", "missing"),
    [("learned", None, "learned head weights"), ("fused", "auto", "no head set is registered")],
)
def test_a_rerank_with_nothing_registered_is_refused_before_ray(
    home, tmp_path, indexes, tiny_dir, preset, heads, missing, monkeypatch
):
    """The actors looked up learned weights and "auto" heads only once loaded under Ray; a run
    that could not rerank failed there, after starting Ray and loading the model in every actor."""
    from attnrank.llm import models

    loaded = []
    monkeypatch.setattr(models, "_load_cached", lambda *a: loaded.append(a))
    config = BatchConfig(str(indexes / "single"), k=3, rerank=3, model=str(tiny_dir), preset=preset, heads=heads)
    with pytest.raises(InputError, match=missing):
        run_batch({"q": "x"}, config, output=tmp_path / "o")
    assert not loaded and not (tmp_path / "o").exists()


def test_a_query_too_long_for_the_likelihood_is_refused_before_ray(tmp_path, indexes, tiny_dir, monkeypatch):
    """A query leaving no room for a passage in the default's likelihood prompt was refused by its
    rerank actor: after Ray had started, the model loaded and the checkpoint folder begun."""
    from attnrank.llm import models

    loaded = []
    monkeypatch.setattr(models, "_load_cached", lambda *a: loaded.append(a))
    config = BatchConfig(str(indexes / "single"), k=3, rerank=3, model=str(tiny_dir))
    queries = {"fine": "red apples", "long": "apples " * 20_000}
    with pytest.raises(InputError, match=r"^query 'long': the query is \d+ tokens, too long for a passage beside it"):
        run_batch(queries, config, output=tmp_path / "o")
    assert not loaded and not (tmp_path / "o").exists() and not (tmp_path / "o.parts").exists()


def test_a_cluster_lacking_what_an_actor_declares_is_named(ray_local, caplog):
    """The local Ray has 2 CPUs and no GPU: a GPU rerank actor or a 3-CPU actor would wait for a
    node to join; on a cluster the run says so instead of waiting in silence, and a local Ray,
    which no node ever joins, refuses it (run_batch waited for ever). What fits says nothing."""
    from attnrank.batch.dataset import _check_placeable

    with caplog.at_level("WARNING", logger="attnrank.batch.runner"):
        for local in (False, True):
            _check_placeable(ray_local, Resources(rerank_gpus=0.0), True, local)
            _check_placeable(ray_local, Resources(rerank_gpus=1.0), False, local)  # no reranking: no GPU asked for
        assert not [r for r in caplog.records if r.name.startswith("attnrank")]
        _check_placeable(ray_local, Resources(rerank_gpus=1.0), True, False)
        _check_placeable(ray_local, Resources(retrieval_cpus=3.0), False, False)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert "offers 0.0 GPU now and an actor needs 1.0" in messages[0] and "--device cpu" in messages[0]
    assert "offers 2.0 CPU now and an actor needs 3.0" in messages[1]
    for res, rerank in ((Resources(rerank_gpus=1.0), True), (Resources(retrieval_cpus=3.0), False)):
        with pytest.raises(InputError, match=r"an actor needs \d\.0 (GPU|CPU) and the local Ray has"):
            _check_placeable(ray_local, res, rerank, True)


def test_the_drivers_lookups_leave_a_model_it_cannot_read_to_the_workers(tmp_path, caplog):
    """A model path only the workers have: the driver warns and leaves the lookups to them."""
    from attnrank.rerank.config import RerankConfig
    from attnrank.rerank.resolve import check_lookups

    with caplog.at_level("WARNING", logger="attnrank.rerank.resolve"):
        check_lookups(RerankConfig.preset("learned", model=str(tmp_path / "only-on-workers")))
    assert "left to the rerankers" in caplog.text
