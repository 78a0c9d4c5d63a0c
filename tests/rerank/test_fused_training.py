"""Training the fused scorer (attnrank.rerank.fused_training) and its held-out evaluation (rerank.fusion_eval)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from attnrank.errors import InputError
from attnrank.eval.crossval import group_splits
from attnrank.rerank.fused import FusedWeights, equal_weights
from attnrank.rerank.fused_features import FusionExample
from attnrank.rerank.fused_training import fusion_examples, train_fused
from attnrank.rerank.fusion_eval import EQUAL, NO_ATTENTION, WITH_ATTENTION, compare, fit_unless_worse, heldout_scores


def test_training_weights_the_informative_signals(make_examples):
    fused = train_fused(make_examples(60, "a", 0.5, 0) + make_examples(60, "b", 0.5, 1), gate=False)
    w = dict(zip(fused.features, fused.weights))
    assert w["attention"] > w["bm25"] > 0 and w["dense"] > w["bm25"] and abs(w["rank"]) < w["bm25"]
    test = make_examples(40, "c", 0.5, 2)
    scores = heldout_scores(
        group_splits(test + make_examples(60, "a", 0.5, 0), lambda e: e.group, groups=["c", "a"])[:1]
    )
    rows = {r["method"]: r for r in compare(test, scores)}
    # both signals together beat either alone
    assert rows[WITH_ATTENTION]["nDCG@10"] > rows["dense alone"]["nDCG@10"] > rows["rank alone"]["nDCG@10"]
    assert rows[WITH_ATTENTION]["nDCG@10"] > rows[NO_ATTENTION]["nDCG@10"]
    # the untrained default is scored too: here BM25 is mostly noise, which only training down-weights
    assert rows[NO_ATTENTION]["nDCG@10"] > rows[EQUAL]["nDCG@10"] > rows["bm25 alone"]["nDCG@10"]
    assert rows[WITH_ATTENTION]["best first stage"] == "dense alone" and rows[WITH_ATTENTION]["wins"] > 0


def test_gate_is_chosen_on_training_data_and_keeps_first_stage_where_attention_is_noise(make_examples):
    # half the queries: attention is pure noise with a flat profile; the gate learns to skip it
    # (confidence reads how far the top score stands out, whatever the scale: noise of unit scale,
    # unrelated to the labels, singles out no candidate the way informative attention does)
    rng = np.random.default_rng(3)
    ex = make_examples(80, "a", 0.3, 4)
    for e in ex[:40]:
        e.signals["attention"] = rng.normal(0, 1.0, 10)
    fused = train_fused(ex, balance=False, gate=True)
    assert fused.base_weights and fused.base_features == ["bm25", "dense", "rank"]
    assert fused.gate is not None  # (it was asserted to be None or > 0: any gate, or none, passed)
    kept = [fused.confident(e.signals) for e in ex]
    # (one query's top z-score overlaps between the two kinds: 1.6 against 2.1 at the median)
    assert sum(kept[40:]) >= 35 and sum(kept[40:]) - sum(kept[:40]) >= 15, (sum(kept[:40]), sum(kept[40:]))


def test_without_attention_is_the_base_model_and_training_always_fits_it(make_examples):
    """What ``signals="only"`` scores with: the base model, even of weights trained without a gate."""
    ex = make_examples(60, "a", 0.5, 0)
    for gate in (True, False):
        fused = train_fused(ex, gate=gate)
        base = fused.without_attention()
        assert base.features == ["bm25", "dense", "rank"] and base.weights == fused.base_weights
        assert base.gate is None and not base.uses_attention and base.without_attention() is base
        e = ex[0]
        signals = {k: v for k, v in e.signals.items() if k != "attention"}
        np.testing.assert_allclose(base.score(signals), train_fused(ex, ["bm25", "dense", "rank"]).score(signals))
    with pytest.raises(InputError, match="no model without attention"):
        FusedWeights(["attention", "dense"], [1.0, 1.0]).without_attention()


def test_equal_model_fits_nothing_but_the_gate(make_examples):
    """model='equal': weight 1 on every feature and on the fallback's; only the gate is chosen, and
    where attention is pure noise it falls back on some queries (a gate that scores best)."""
    ex = make_examples(60, "a", 50.0, 3)
    fused = train_fused(ex, ["attention", "bm25", "dense"], learner="equal")
    assert fused.weights == [1.0, 1.0, 1.0] and fused.base_weights == [1.0, 1.0] and fused.learner == "equal"
    np.testing.assert_allclose(fused.without_attention().score(ex[0].signals), equal_weights().score(ex[0].signals))
    assert fused.gate is not None


def test_signed_weights_may_take_out_an_echo_the_default_weights_keep():
    """Attention = relevance + the slot (rank): only signed weights subtract the slot, by a
    negative rank weight; the default keeps every weight >= 0 (the rank's comes out 0)."""
    rng = np.random.default_rng(7)
    ex = []
    for i in range(80):
        y = np.zeros(10, dtype=np.int64)
        y[rng.choice(10, 2, replace=False)] = 1
        rank = -np.arange(10.0)
        signals = {"attention": y + 0.5 * rank / 3 + rng.normal(0, 0.3, 10), "rank": rank}
        ex.append(FusionExample(str(i), [str(j) for j in range(10)], signals, y, group="g"))
    signed = train_fused(ex, ["attention", "rank"], gate=False, signed=True)
    plain = train_fused(ex, ["attention", "rank"], gate=False)
    assert signed.weights[0] > 0 > signed.weights[1]
    assert plain.weights[1] == 0.0 and min(plain.weights) >= 0


def test_weights_that_all_came_out_zero_are_scored_as_such_but_never_registered(tmp_path):
    """Each negative weight is dropped and the rest refitted; the last one left negative too gives
    weights of 0, which rank every candidate alike: a held-out report scores them so (equal
    weights then win it), and they were registered without a word."""
    rng = np.random.default_rng(3)
    ex = []
    for i in range(40):
        y = np.zeros(10, dtype=np.int64)
        y[rng.choice(10, 2, replace=False)] = 1
        signals = {"bm25": -y + rng.normal(0, 0.3, 10), "dense": -y + rng.normal(0, 0.3, 10)}
        ex.append(FusionExample(str(i), [str(j) for j in range(10)], signals, y, group="g"))
    zero = train_fused(ex, ["bm25", "dense"], gate=False)
    assert zero.weights == [0.0, 0.0]
    with pytest.raises(InputError, match=r"are all 0: they would rank every candidate alike"):
        zero.save("m", "f" * 64, root=tmp_path)
    assert not list(tmp_path.iterdir())
    with pytest.raises(InputError, match="are all 0"):
        FusedWeights.from_json(zero.to_json())
    assert train_fused(ex, ["bm25", "dense"], gate=False, signed=True).weights[0] < 0  # signed: allowed


def test_a_scorer_that_gives_too_few_scores_is_refused_not_cut(make_examples):
    from attnrank.rerank.fused_training import per_query_metrics

    ex = make_examples(4, "a", 0.5, 0)
    with pytest.raises(InputError, match=f"query {ex[0].qid!r} has 9 scores for 10 candidates"):
        per_query_metrics(ex, lambda e: e.signals["bm25"][:-1], ["nDCG@10"])


def test_weights_record_the_embedder_of_their_dense_signal(make_examples):
    """Weights fitted to another embedder's cosines were applied to the packaged MiniLM's: the
    embedder is recorded with the weights (and a mix of embedders refused)."""
    from dataclasses import replace

    ex = [replace(e, embedder="my-embedder") for e in make_examples(30, "a", 0.5, 0)]
    assert train_fused(ex, gate=False).embedder == "my-embedder"
    assert train_fused(make_examples(30, "a", 0.5, 0), gate=False).embedder is None
    with pytest.raises(InputError, match="different embedders"):
        train_fused(ex[:10] + make_examples(10, "b", 0.5, 1), gate=False)
    assert FusedWeights.from_json({"features": ["dense"], "weights": [1.0]}).embedder is None  # older files


def test_one_line_error_for_a_query_without_candidates():
    """A query without a candidate list was a bare KeyError."""
    with pytest.raises(InputError, match="1 queries have no candidate list \\(first: 'q2'\\)"):
        fusion_examples(
            {"attention": lambda q, d: np.zeros(len(d))}, {"q1": "a", "q2": "b"}, {"q1": []}, {"q2": {"d": 1}}
        )


def test_one_line_errors_for_the_llm_scores_and_feature_given_otherwise():
    with pytest.raises(InputError, match="llm_scores is a function; give"):  # the form before 2026-12-04
        fusion_examples(lambda q, d: np.zeros(len(d)), {"q1": "a"}, {"q1": []}, {})  # type: ignore[arg-type]
    with pytest.raises(InputError, match="llm_feature='bm25' is not one of"):
        heldout_scores([], llm_feature="bm25")
    with pytest.raises(InputError, match="llm_feature='attention' is not 'likelihood' or None"):
        fit_unless_worse([], "attention")  # fused weights are trained with a gate and base model: train_fused


def test_signals_only_examples_with_the_default_llm_feature_are_one_line(make_examples):
    """fit_unless_worse(examples of the signals alone) was a KeyError: 'likelihood' deep in the scoring."""
    ex = make_examples(20, "a", 0.5, 1)
    for e in ex:
        e.signals.pop("likelihood", None)
        e.signals.pop("attention", None)
    with pytest.raises(InputError, match=r"the examples lack the feature\(s\) \['likelihood'\].*llm_feature=None"):
        fit_unless_worse(ex, folds=2)
    fit_unless_worse(ex, None, folds=2)  # (what the message advises runs)


def test_fit_unless_worse_keeps_trained_weights_only_where_they_beat_equal_weights_held_out(make_examples):
    """attnrank train's rule for the default preset: the k-fold report, and weights over BM25,
    dense, rank and the likelihood only if held out they are not below the equal weights; for the
    preset signals the same without the likelihood."""
    from attnrank.rerank.fused import LikelihoodWeights, SignalsWeights
    from attnrank.rerank.fusion_eval import EQUAL, EQUAL_LIKELIHOOD, NO_ATTENTION, WITH_LIKELIHOOD, fit_unless_worse

    ex = make_examples(60, "a", 0.5, 0)
    for e in ex:
        e.signals["likelihood"] = e.signals.pop("attention")
    rows, weights = fit_unless_worse(ex, folds=3, adapter="a" * 16)  # BM25 is mostly noise: down-weighted
    score = {r["method"]: r["nDCG@10"] for r in rows}
    assert score[WITH_LIKELIHOOD] > score[EQUAL_LIKELIHOOD] and isinstance(weights, LikelihoodWeights)
    assert weights.adapter == "a" * 16  # (the likelihood's model: dropped, so another model's passed as the base's)
    assert weights.features == ["bm25", "dense", "rank", "likelihood"] and weights.learner == "pointwise"
    assert weights.metrics["heldout"][WITH_LIKELIHOOD]["nDCG@10"] == score[WITH_LIKELIHOOD]
    rows, weights = fit_unless_worse(ex, folds=3, learner="equal")  # weight 1 on the uninformative rank too
    score = {r["method"]: r["nDCG@10"] for r in rows}
    assert score[WITH_LIKELIHOOD] < score[EQUAL_LIKELIHOOD] and weights is None
    rows, weights = fit_unless_worse(ex, None, folds=3)  # the preset signals: no LLM feature read
    score = {r["method"]: r["nDCG@10"] for r in rows}
    assert "likelihood alone" not in score and score[NO_ATTENTION] > score[EQUAL]
    assert isinstance(weights, SignalsWeights) and weights.features == ["bm25", "dense", "rank"]


def test_registration_curve_scores_the_rule_by_how_many_labelled_queries_it_got(make_examples):
    """Per size, the held-out Δ of what the rule registers against the equal weights; sizes the
    outer training folds cannot hold are left out; the same draws give the same rows."""
    from attnrank.rerank.fusion_eval import registration_curve

    ex = make_examples(40, "a", 0.5, 0)
    for e in ex:
        e.signals["likelihood"] = e.signals.pop("attention")
    rows = registration_curve(ex, (10, 30, 40), seeds=2, folds=4)
    assert [r["labelled queries"] for r in rows] == [10, 30]  # 40 > the 30 of each outer training part
    assert all(r["worst shuffle Δ"] <= r["Δ vs equal weights"] for r in rows)
    assert rows[-1]["Δ vs equal weights"] > 0 and rows[-1]["folds kept trained"] == "8/8"  # BM25 noise: trained wins
    assert registration_curve(ex, (10, 30, 40), seeds=2, folds=4) == rows


def test_a_model_without_attention_that_came_out_zero_is_not_kept_or_registered(tmp_path):
    """All-0 base weights passed check_informative: the preset signals and the gate's fallback then
    ranked every candidate alike (the first-stage order, exit 0)."""
    rng = np.random.default_rng(4)
    ex = []
    for i in range(40):
        y = np.zeros(10, dtype=np.int64)
        y[rng.choice(10, 2, replace=False)] = 1
        signals = {
            "attention": y + rng.normal(0, 0.3, 10),
            "bm25": -y + rng.normal(0, 0.3, 10),
            "dense": -y + rng.normal(0, 0.3, 10),
        }
        ex.append(FusionExample(str(i), [str(j) for j in range(10)], signals, y, group="g"))
    fused = train_fused(ex, ["attention", "bm25", "dense"], gate=True)
    assert any(fused.weights) and fused.base_weights == [] and fused.gate is None
    zero_base = FusedWeights(["attention", "bm25", "dense"], [1.0, 0.0, 0.0], base_weights=[0.0, 0.0])
    with pytest.raises(InputError, match=r"base_weights \[0.0, 0.0\] of these fused scorer weights"):
        zero_base.save("m", "f" * 64, root=tmp_path)
    # registered before training dropped them: loaded without the fallback (not refused: every reranker
    # of the model would have failed)
    stored = FusedWeights.from_json({**zero_base.to_json(), "gate": 0.5})
    assert stored.weights == [1.0, 0.0, 0.0] and stored.base_weights == [] and stored.gate is None


def test_a_candidate_listed_twice_is_refused_for_training():
    """Its label counted twice, and only one of its scores reached the held-out metrics."""
    from attnrank.types import Document

    docs = [Document("d1", "a"), Document("d2", "b"), Document("d1", "a")]
    with pytest.raises(InputError, match=r"candidate of query 'q1' #2 repeats the id 'd1'"):
        fusion_examples({}, {"q1": "a"}, {"q1": docs}, {"q1": {"d1": 1}})


def test_candidates_may_be_search_results_as_they_come_but_not_texts():
    """Search results (a RankedResults, ScoredDocument lists), as README's training snippet invites,
    were an AttributeError ('ScoredDocument' object has no attribute 'full_text'); texts, whose
    labels no id can read, are refused."""
    from attnrank.types import Document, RankedResults, ScoredDocument

    docs = [Document("d1", "apples and pears", "Fruit"), Document("d2", "bananas")]
    scored = [ScoredDocument(d.id, 2.0 - i, i + 1, d.text, d.title) for i, d in enumerate(docs)]
    qrels = {"q1": {"d1": 1}}
    want = fusion_examples(
        {"n": lambda q, c: np.array([len(d.text) for d in c])}, {"q1": "apples"}, {"q1": docs}, qrels
    )
    for given in (scored, RankedResults("apples", scored)):
        got = fusion_examples(
            {"n": lambda q, c: np.array([len(d.text) for d in c])}, {"q1": "apples"}, {"q1": given}, qrels
        )
        assert got[0].doc_ids == want[0].doc_ids == ["d1", "d2"] and list(got[0].labels) == [1, 0]
        assert {k: list(v) for k, v in got[0].signals.items()} == {k: list(v) for k, v in want[0].signals.items()}
    with pytest.raises(InputError, match=r"candidates of query 'q1' hold texts \('apples and pears'\); .* by its id"):
        fusion_examples({}, {"q1": "apples"}, {"q1": ["apples and pears", "bananas"]}, qrels)  # type: ignore[dict-item]
    with pytest.raises(InputError, match=r"candidates of query 'q1': the candidates are one Document"):
        fusion_examples({}, {"q1": "apples"}, {"q1": docs[0]}, qrels)  # type: ignore[dict-item]


def test_queries_without_a_relevant_label_are_left_out_as_attnrank_train_leaves_them(caplog):
    """They trained as all-negative examples and scored 0 in every row of fit_unless_worse's report
    (equal weights 0.5815 where attnrank train, on the same data, reported 0.9692); bad rel and
    labels that are no whole numbers are refused."""
    from attnrank.types import Document

    docs = [Document("d1", "apples and pears"), Document("d2", "bananas")]
    qrels = {"q1": {"d1": 1}, "q2": {"d2": 0}}
    with caplog.at_level(logging.WARNING, logger="attnrank.rerank.fused_training"):
        ex = fusion_examples({}, {"q1": "apples", "q2": "pears", "q3": "x"}, {"q1": docs}, qrels)
    assert [e.qid for e in ex] == ["q1"] and "2 of the 3 queries have no label >= 1" in caplog.text
    with pytest.raises(InputError, match="no query has a label >= 2"):
        fusion_examples({}, {"q1": "apples"}, {"q1": docs}, qrels, rel=2)
    with pytest.raises(InputError, match="rel=0 must be a whole number >= 1"):
        fusion_examples({}, {"q1": "apples"}, {"q1": docs}, qrels, rel=0)
    with pytest.raises(InputError, match=r"label 1.5 is not a whole number"):
        fusion_examples({}, {"q1": "apples"}, {"q1": docs}, {"q1": {"d1": 1.5}})  # type: ignore[dict-item]


def test_a_gate_applied_to_lists_of_other_lengths_than_it_was_chosen_on_is_warned_of(make_examples, caplog):
    """The top z-score of n candidates is at most sqrt(n - 1) and grows with n even on noise: a gate
    chosen on 10 candidates per query set attention aside on short lists, and used it on noise in
    long ones, without a word."""
    rng = np.random.default_rng(3)
    ex = make_examples(80, "a", 0.3, 4)
    for e in ex[:40]:
        e.signals["attention"] = rng.normal(0, 1.0, 10)
    fused = train_fused(ex, balance=False, gate=True)
    assert fused.gate is not None and fused.gate_candidates == [10, 10]
    back = FusedWeights.from_json(fused.to_json())
    assert back.gate_candidates == [10, 10]
    with caplog.at_level("WARNING", logger="attnrank.rerank.fused"):
        back.score(ex[50].signals)  # as trained: nothing said
        assert not caplog.text
        short = {k: v[:4] for k, v in ex[50].signals.items()}
        back.score(short)
        back.score(short)
    assert caplog.text.count("was chosen on queries of 10 candidates; this one has 4") == 1
    with pytest.raises(InputError, match="gate_candidates"):
        FusedWeights.from_json({**fused.to_json(), "gate_candidates": [10]})


def test_empty_features_a_query_without_candidates_and_rounding_noise(make_examples):
    """train_fused(features=[]) failed inside NumPy (a traceback); the gate's confidence of a query
    without candidates failed in np.ptp (k-fold evaluation, when such a query fell in a test fold);
    float32 jitter of a constant below magnitude 1 was z-scored like a real signal (±1.75)."""
    from attnrank.rerank.fused_features import attention_confidence
    from attnrank.rerank.learned.features import standardise

    examples = make_examples(20, "a", 0.5, 1)
    for bad in ([], ["bm25", "bm25"], ["nope"]):
        with pytest.raises(InputError, match="features=.* must be among"):
            train_fused(examples, bad)
    assert attention_confidence(np.array([])) == 0.0
    gated = train_fused(examples, gate=True)
    assert gated.score({f: np.array([]) for f in gated.features}).shape == (0,)
    jitter = np.float32(0.0123) + np.array([0.0, 1.9e-9, -1e-9, 5e-10])
    assert not standardise(jitter[:, None]).any() and attention_confidence(jitter) == 0.0
    assert standardise(np.array([[0.01], [0.02], [0.03]])).ravel() == pytest.approx([-1.2247449, 0, 1.2247449])
