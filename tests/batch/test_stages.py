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
    """Built through the Python API, which (unlike a corpus file) lets a document without text in."""
    path = tmp_path_factory.mktemp("idx") / "idx"
    docs = [Document("a", "apples are red"), Document("b", "pears are green"), Document("empty", "")]
    HybridRetriever().index(docs, show_progress=False).save(path)
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
