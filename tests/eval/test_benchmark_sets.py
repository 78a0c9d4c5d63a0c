"""attnrank.benchmarks (the benchmark scripts' candidate sets and cached-row scorers); here
because its fixtures (the shared-data slice) live in tests/eval."""

from __future__ import annotations

import numpy as np
import pytest
from _tiny import rerank_docs, tiny_llm

from attnrank.benchmarks import (
    complementary_heads,
    dl19_sets,
    head_quality,
    hotpot_set,
    icr_scores,
    locomo_set,
    order_agreement,
    rrf_order,
    within_query_ranks,
)
from attnrank.errors import InputError
from attnrank.eval.rows import capture_all
from attnrank.index.bm25 import BM25Index
from attnrank.index.retriever import HybridRetriever
from attnrank.rerank.attention import AttentionReranker
from attnrank.types import Document


def test_dl19_sets_cut_the_run_at_each_depth(shared_mini, dl19_mini):
    sets = dl19_sets(shared_mini, [3, 5], max_queries=2)
    assert [s[0] for s in sets] == ["DL19 BM25 top-3", "DL19 BM25 top-5"]
    run = [line.split() for line in (dl19_mini / "run.bm25.trec").read_text().splitlines()]
    for _, ds, cands in sets:
        assert list(cands) == ["264014", "104861"] and set(ds.qrels) == set(cands)
    top5 = [r[2] for r in run if r[0] == "264014"][:5]
    assert [d.id for d in sets[1][2]["264014"]] == top5 and [d.id for d in sets[0][2]["264014"]] == top5[:3]


def test_dl19_and_hotpot_sets_refuse_a_count_they_would_slice_wrongly(shared_mini):
    """A negative count sliced from the end: dl19_sets(root, [20], -1) gave all topics but the last
    as "DL19 BM25 top-20", a depth of -5 "top--5"; a depth past the run was named as if it held it."""
    with pytest.raises(InputError, match="n=-1 queries"):
        dl19_sets(shared_mini, [3], max_queries=-1)
    for depth in (-5, 0, 21, 2.5):
        with pytest.raises(InputError, match=f"DL19 depth {depth!r}: the BM25 run holds up to 20 .* give 1 to 20"):
            dl19_sets(shared_mini, [3, depth])
    assert [s[0] for s in dl19_sets(shared_mini, [20], max_queries=0)] == ["DL19 BM25 top-20"]  # 0: all topics
    with pytest.raises(InputError, match="n=-1 queries"):
        hotpot_set(shared_mini, -1)
    assert hotpot_set(shared_mini, 0)[0] == "HotpotQA distractor BM25-ordered (3 questions)"


def test_hotpot_and_locomo_sets_are_bm25_ordered(shared_mini):
    name, ds, cands = hotpot_set(shared_mini, 2)
    assert name == "HotpotQA distractor BM25-ordered (2 seeded questions)" and list(cands) == list(ds.queries)
    bm25 = BM25Index().index([d.full_text for d in ds.docs])
    pos = {d.id: i for i, d in enumerate(ds.docs)}
    for q, docs in cands.items():
        s = bm25.get_scores(ds.queries[q])[[pos[d.id] for d in docs]]
        assert len(docs) == 10 and all(np.diff(s) <= 0)
    name, ds, cands = locomo_set(shared_mini, None, k=5)
    assert name == "LoCoMo turns BM25 top-5 (6 queries)" and all(len(c) == 5 for c in cands.values())
    turns = list(ds.docs)
    bm25 = BM25Index().index([d.full_text for d in turns])
    for q, docs in cands.items():
        s = bm25.get_scores(ds.queries[q])
        assert [d.id for d in docs] == [turns[i].id for i in np.argsort(-s, kind="stable")[:5]]


def test_rrf_order_gives_nothing_for_a_missing_side():
    fused = rrf_order([3.0, 1.0, float("nan")], [0.1, 0.9, 0.5])
    assert fused[0] == pytest.approx(1 / 61 + 1 / 63) and fused[1] == pytest.approx(1 / 62 + 1 / 61)
    assert fused[2] == pytest.approx(1 / 62)  # the first list did not return it


def test_icr_scores_from_cached_rows_equal_the_reranker(tmp_path):
    rr = AttentionReranker(tiny_llm(), None, signals=None)
    docs = rerank_docs()
    cap = capture_all(rr, "toy", {"q": "capital of France?"}, {"q": docs}, tmp_path)
    cached = capture_all(rr, "toy", {"q": "capital of France?"}, {"q": docs}, tmp_path)  # read back (float32)
    want = rr.score("capital of France?", docs)
    np.testing.assert_allclose(icr_scores(cap["q"]["windows"], len(docs)), want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(icr_scores(cached["q"]["windows"], len(docs)), want, rtol=1e-3, atol=1e-5)
    one = icr_scores(cap["q"]["windows"], len(docs), head_idx=[0])
    assert not np.allclose(one, want)  # a head subset scores differently
    quality = head_quality(cap, {"q": docs}, {"q": {"paris": 1}}, 1, rr)
    assert quality.shape == (len(rr.head_list),) and ((quality >= 0) & (quality <= 1)).all()


def _window(real: np.ndarray, spans: list[tuple[int, int]]):
    from attnrank.llm.rows import WindowRows

    return WindowRows(list(range(len(spans))), spans, list(range(real.shape[1])), real)


def test_icr_aggregates_a_passage_by_sum_mean_or_max():
    # one head; passage 0: 4 tokens of 1.0 (sum 4, mean 1, max 1); passage 1: 2 tokens, 0.5 and 2.0
    w = _window(np.array([[1.0, 1.0, 1.0, 1.0, 0.5, 2.0]]), [(0, 4), (4, 6)])
    np.testing.assert_allclose(icr_scores([w], 2, use_filter=False), [4.0, 2.5])
    np.testing.assert_allclose(icr_scores([w], 2, use_filter=False, aggregate="mean"), [1.0, 1.25])
    np.testing.assert_allclose(icr_scores([w], 2, aggregate="max"), [1.0, 2.0])
    # the mean is over the tokens ICR's mu - 2 sigma filter keeps: six 1s and a -10 -> 1
    low = _window(np.array([[1.0] * 6 + [-10.0]]), [(0, 7)])
    np.testing.assert_allclose(icr_scores([low], 1, aggregate="mean"), [1.0])
    np.testing.assert_allclose(icr_scores([low], 1, use_filter=False, aggregate="mean"), [-4 / 7])
    with pytest.raises(InputError, match="aggregate='Max' is not one of"):
        icr_scores([w], 2, aggregate="Max")


def test_order_agreement_tells_a_slot_echo_from_a_text_signal():
    """Attention that falls with the slot (first-stage order) agrees with the order (1), and a
    query whose score is constant adds nothing to a mean it cannot rank."""
    # one head, four one-token passages in first-stage order: attention 4, 3, 2, 1
    w = _window(np.array([[4.0, 3.0, 2.0, 1.0]]), [(0, 1), (1, 2), (2, 3), (3, 4)])
    flat = _window(np.array([[1.0, 1.0, 1.0, 1.0]]), [(0, 1), (1, 2), (2, 3), (3, 4)])
    docs = {q: [Document(str(i), "t") for i in range(4)] for q in ("a", "b")}
    signals = {q: {"bm25": np.array([1.0, 2.0, 3.0, 4.0]), "dense": np.array([2.0, 1.0, 4.0, 3.0])} for q in docs}
    got = order_agreement({"a": {"windows": [w]}, "b": {"windows": [flat]}}, signals, docs)
    assert got["attention vs order"] == pytest.approx(1.0)  # query b's constant attention is left out
    assert got["bm25 vs order"] == pytest.approx(-1.0) and got["attention vs bm25"] == pytest.approx(-1.0)
    assert got["dense vs order"] == pytest.approx(-0.6)


def test_within_query_ranks_share_ties_and_ignore_scale():
    np.testing.assert_allclose(within_query_ranks(np.array([10.0, -3.0, 1e6, 10.0])), [1.5, 0.0, 3.0, 1.5])


def test_complementary_heads_prefer_what_the_signals_miss_over_the_best_head_alone():
    """Head 0 copies the signals (the better head alone); head 1 finds the relevant passage on the
    third of the queries where the signals rank it last, and is noise elsewhere."""
    from attnrank.benchmarks.scoring import _ndcg10_of_candidates
    from attnrank.rerank.fused_features import FusionExample

    rng = np.random.default_rng(0)
    examples, per_head = [], {}
    for q in range(60):
        bm25, dense = rng.normal(size=8), rng.normal(size=8)
        missed = q % 3 == 0
        labels = np.zeros(8, dtype=np.int64)
        labels[int(np.argmin(bm25 + dense)) if missed else int(np.argmax(bm25 + dense))] = 1
        signals = {"bm25": bm25, "dense": dense, "rank": -np.arange(8.0)}
        examples.append(FusionExample(str(q), [str(i) for i in range(8)], signals, labels, group="g"))
        finds = np.where(labels == 1, 3.0, 0.0) if missed else rng.normal(size=8)
        per_head[str(q)] = np.stack([bm25 + dense, finds])
    alone = [np.mean([_ndcg10_of_candidates(per_head[e.qid][h], e.labels, 1) for e in examples]) for h in (0, 1)]
    assert alone[0] > alone[1]  # QRHead's criterion would choose head 0
    assert complementary_heads({"g": per_head}, {"g": examples}, 1) == [1]


def test_an_offset_sample_continues_the_seeded_order_without_overlap():
    """bench_confirm's new queries: the seeded order from position ``offset`` on, none of the
    first ``offset`` (which every earlier benchmark sampled from)."""
    from attnrank.benchmarks.sets import _sampled
    from attnrank.errors import AttnrankError
    from attnrank.eval.datasets import Dataset, sample_queries

    qids = [f"q{i}" for i in range(50)]
    ds = Dataset("t", [], {q: q for q in qids}, {})
    first, rest = _sampled(ds, 20, 0), _sampled(ds, None, 20)
    assert first == sample_queries(qids, 20) and first + rest == sample_queries(qids, None)
    assert _sampled(ds, 5, 20) == rest[:5] and not set(first) & set(rest)
    with pytest.raises(AttnrankError, match="offset 50: the seeded order has 50 queries"):
        _sampled(ds, None, 50)
    with pytest.raises(InputError, match="n=-5 queries"):
        _sampled(ds, -5, 20)  # not the first 15 of the order, nor all but the last 5
    assert _sampled(Dataset("t", [], {}, {}), None, 0) == []


def test_the_scifact_retriever_fuses_with_rrf_k_60_whatever_its_index_saved(tmp_path, built_retriever, scifact_docs):
    """An index saved with another RRF k over the same corpus was reused with that k, so the
    candidate sets differed from the published ones."""
    import copy

    from attnrank.benchmarks.sets import scifact_retriever
    from attnrank.eval.datasets import Dataset

    other = copy.copy(built_retriever)
    other.set_fusion("rrf", rrf_k=30)
    assert (other.rrf_k, built_retriever.rrf_k) == (30, 60)
    other.save(tmp_path / "bench")
    r = scifact_retriever(Dataset("scifact-mini", scifact_docs, {}, {}), tmp_path / "bench")
    assert (r.fusion, r.rrf_k) == ("rrf", 60)
    with pytest.raises(InputError, match="rrf_k=0 must be a positive integer"):
        r.set_fusion("rrf", rrf_k=0)


def test_a_hotpot_subset_is_drawn_from_the_seeded_order(shared_mini):
    """The file holds its 200 bridge questions before its 200 comparison ones: a subset of its
    first questions was of one type. A subset is the seeded order's first; the whole set keeps the
    file's order (as every record of all 400 questions read it)."""
    from attnrank.eval.datasets import hotpotqa, sample_order

    every = list(hotpotqa(shared_mini).queries)
    seeded = sample_order(hotpotqa(shared_mini))
    assert seeded[:2] != every[:2]  # (else this slice could not tell the two apart)
    assert list(hotpot_set(shared_mini, 2)[1].queries) == seeded[:2]
    assert list(hotpot_set(shared_mini, None)[1].queries) == every == list(hotpot_set(shared_mini, 3)[1].queries)


def test_the_scifact_benchmark_index_is_rebuilt_when_built_otherwise(shared_mini, tmp_path, caplog):
    """Only the corpus was compared: an index at the benchmark's path built with other settings
    (another stemmer, dense index, BM25) was reused, and every candidate set changed silently."""
    from attnrank.benchmarks.sets import scifact_retriever
    from attnrank.eval.datasets import scifact
    from attnrank.index.bm25 import BM25Params

    ds = scifact(shared_mini)
    HybridRetriever(bm25=BM25Params(k1=1.5)).index(ds.docs, show_progress=False).save(tmp_path / "bench")
    r = scifact_retriever(ds, tmp_path / "bench")
    assert "built with other settings: rebuilding it" in caplog.text and r.bm25_params == BM25Params()
    caplog.clear()
    scifact_retriever(ds, tmp_path / "bench")  # built as the benchmark builds it: reused
    assert "rebuilding" not in caplog.text
