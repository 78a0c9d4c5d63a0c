"""The batch stages called in this process (no Ray): an attnrank error in a stage names its query."""

from __future__ import annotations

import pytest

pa = pytest.importorskip("pyarrow")

from attnrank.batch.stages import RerankStage, RetrievalStage, StageError
from attnrank.index.retriever import HybridRetriever
from attnrank.rerank.config import RerankConfig
from attnrank.types import Document


@pytest.fixture(scope="module")
def index_with_an_empty_document(tmp_path_factory):
    """An index holding a document without text, as the Python API's index() took one before
    2026-12-06 (a corpus file never let one in)."""
    path = tmp_path_factory.mktemp("idx") / "idx"
    docs = [Document("a", "apples are red"), Document("b", "pears are green"), Document("empty", "red")]
    built = HybridRetriever().index(docs, show_progress=False)
    built.docs[2] = Document("empty", "")
    built.save(path)
    return path


def test_a_candidate_without_text_names_its_query(index_with_an_empty_document, tiny_dir):
    queries = pa.Table.from_pylist([{"qid": "q1", "query": "red apples"}, {"qid": "q2", "query": "green pears"}])
    rows = RetrievalStage(str(index_with_an_empty_document), 3)(queries)
    with pytest.raises(StageError, match=r"^query 'q1': document #\d \('empty'\) has no text"):
        RerankStage(3, 3, config=RerankConfig.preset(model=str(tiny_dir)))(rows)


def test_a_rerank_stage_reads_its_index_vectors_only_for_a_scorer_with_signals(index_with_an_empty_document, tiny_dir):
    path = str(index_with_an_empty_document)
    signals = RerankStage(3, 3, config=RerankConfig.preset(model=str(tiny_dir)), index=path)
    assert signals.reranker.signals.index is not None  # the default preset's dense signal: stored vectors
    attention = RerankStage(3, 3, config=RerankConfig.preset("qrhead", model=str(tiny_dir)), index=path)
    assert attention.reranker.fused is None and attention.reranker.signals.index is None


def test_a_rerank_stage_keeps_its_thread_share_after_a_lazy_load(tmp_path, tiny_dir):
    """Loading the LLM or the embedder sets torch to every core: an actor given one CPU then ran on
    all of them, N actors oversubscribing the machine. The stage puts its share back per query."""
    import torch

    from attnrank.config import set_torch_threads

    docs = [Document("a", "apples are red"), Document("b", "pears are green")]
    HybridRetriever().index(docs, show_progress=False).save(tmp_path / "idx")
    rows = RetrievalStage(str(tmp_path / "idx"), 2)(pa.Table.from_pylist([{"qid": "q1", "query": "red apples"}]))
    before = torch.get_num_threads()
    try:
        stage = RerankStage(2, 2, config=RerankConfig.preset(model=str(tiny_dir)), threads=1)
        torch.set_num_threads(2)  # what a lazy load does
        stage(rows)
        assert torch.get_num_threads() == 1
    finally:
        set_torch_threads(before)


def test_retrieval_rows_do_not_depend_on_the_queries_beside_them(tmp_path):
    """Queries embedded together are padded and computed in other shapes (vectors moved by ~1e-7):
    a query's dense scores depended on its batch, so a resumed or redistributed run wrote other
    bytes than one clean run. The stage also keeps to its thread share (the embedder's load set
    torch to every core)."""
    import torch

    from attnrank.config import set_torch_threads

    docs = [Document(str(i), t) for i, t in enumerate(["apples are red", "pears are green", "sky is blue"] * 3)]
    HybridRetriever().index(docs, show_progress=False).save(tmp_path / "idx")
    queries = [{"qid": f"q{i}", "query": q} for i, q in enumerate(["red", "which fruit is green and sweet", "sky"])]
    before = torch.get_num_threads()
    try:
        stage = RetrievalStage(str(tmp_path / "idx"), 4, mode="dense", threads=1)
        together = stage(pa.Table.from_pylist(queries)).to_pylist()
        alone = [stage(pa.Table.from_pylist([q])).to_pylist()[0] for q in queries]
        assert repr(together) == repr(alone) and torch.get_num_threads() == 1  # (repr: NaN != NaN)
    finally:
        set_torch_threads(before)


def test_an_actor_refuses_an_index_rebuilt_since_the_run_began(tmp_path, tiny_dir):
    """A Ray actor restarted after a rebuild loaded the new build and served its rows beside the
    old one's in one run (exit 0)."""
    from attnrank.index.store import manifest_tag

    path = tmp_path / "idx"
    HybridRetriever().index([Document("a", "apples are red")], show_progress=False).save(path)
    tag = manifest_tag(path)
    assert RetrievalStage(str(path), 1, index_tag=tag).retriever.num_docs == 1
    HybridRetriever().index([Document("a", "apples"), Document("b", "pears")], show_progress=False).save(path)
    with pytest.raises(StageError, match="was rebuilt since this batch run began"):
        RetrievalStage(str(path), 1, index_tag=tag)
    with pytest.raises(StageError, match="was rebuilt since this batch run began"):
        RerankStage(1, 1, config=RerankConfig.preset(model=str(tiny_dir)), index=str(path), index_tag=tag)


def test_an_index_or_model_an_actor_cannot_load_is_one_stage_line(tmp_path):
    """An actor's constructor raised the library's error, which reached the driver as Ray's
    ActorDiedError traceback: only a StageError's line is read out of it."""
    with pytest.raises(StageError, match=r"^loading the index: .*missing"):
        RetrievalStage(str(tmp_path / "missing"), 1)
    with pytest.raises(StageError, match=r"^loading the reranker: .*no-model"):
        RerankStage(1, 1, config=RerankConfig.preset("qrhead", heads="all", model=str(tmp_path / "no-model")))
