"""Learned head weighting: planted-weight recovery (pointwise and pairwise), per-query
standardisation, evaluation helpers, registry round trip and AttentionReranker(scorer="learned")."""

from __future__ import annotations

import numpy as np
import pytest

from attnrank.errors import InputError
from attnrank.llm.rows import window_features
from attnrank.rerank.attention import AttentionReranker
from attnrank.rerank.config import RerankConfig
from attnrank.rerank.learned import (
    LearnedHeadWeights,
    QueryFeatures,
    evaluate_scores,
    kfold_evaluate,
    leave_one_group_out,
    query_features,
    restrict_heads,
    standardise,
    train_head_weights,
)
from attnrank.types import Document, ScoredDocument

HEADS = [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
W_TRUE = np.array([2.0, -1.0, 0.0, 1.5, 0.0, 0.5])


def synthetic(n_queries=80, n_docs=25, seed=0, groups=("a",)) -> list[QueryFeatures]:
    """Raw features with a per-query scale and offset (standardisation removes them); labels
    drawn from a logistic model of the standardised features with the planted weights."""
    rng = np.random.default_rng(seed)
    out = []
    for q in range(n_queries):
        x = rng.normal(size=(n_docs, len(HEADS)))
        raw = x * rng.uniform(0.01, 3.0) + rng.normal(0, 5)
        p = 1 / (1 + np.exp(-(standardise(raw) @ W_TRUE - 2.0)))
        labels = (rng.uniform(size=n_docs) < p).astype(int)
        out.append(
            QueryFeatures(
                f"q{q}",
                [f"d{i}" for i in range(n_docs)],
                raw,
                labels,
                list(HEADS),
                first_stage=rng.normal(size=n_docs),
                group=groups[q % len(groups)],
            )
        )
    return out


def _cos(a, b):
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("learner", ["pointwise", "pairwise"])
def test_recovers_planted_weights(learner):
    w = train_head_weights(synthetic(), learner=learner, l2=0.1)
    assert _cos(w.weights, W_TRUE) > 0.97
    assert w.learner == learner and w.config.heads == ["0-0", "0-1", "1-0", "1-1", "2-0", "2-1"]
    if learner == "pointwise":
        assert w.weights[0] == pytest.approx(2.0, rel=0.25) and w.bias == pytest.approx(-2.0, abs=0.5)
    else:
        assert w.bias == 0.0
    assert w.heads == HEADS


def test_standardise_per_query():
    x = np.array([[1.0, 5.0], [3.0, 5.0], [5.0, 5.0]])
    z = standardise(x)
    np.testing.assert_allclose(z[:, 0], [-1.2247449, 0.0, 1.2247449], atol=1e-6)
    np.testing.assert_array_equal(z[:, 1], 0.0)  # a constant column carries no order
    rounded = np.array([[0.1 + 0.2, 1.0], [0.3, 2.0], [0.3, 3.0]])  # one value, summed in two orders
    assert rounded[0, 0] != rounded[1, 0]
    np.testing.assert_array_equal(standardise(rounded)[:, 0], 0.0)  # not z-scores of rounding noise


def test_kfold_and_leave_one_group_out():
    ex = synthetic(n_queries=40, groups=("scifact", "dl19"))
    folds = kfold_evaluate(ex, folds=4, l2=0.1)
    assert [f["fold"] for f in folds] == ["0", "1", "2", "3"]
    assert sum(f["n_test"] for f in folds) == 40 and all(f["n_train"] == 30 for f in folds)
    for f in folds:
        assert 0.0 <= f["learned"]["nDCG@10"] <= 1.0 and set(f) >= {"sum-of-heads", "learned"}
    mean = lambda name: np.mean([f[name]["nDCG@10"] for f in folds])  # noqa: E731
    assert mean("learned") > mean("sum-of-heads")  # a negative planted weight hurts the plain sum
    groups = leave_one_group_out(ex, learner="pairwise", first_stage=True, metrics=("nDCG@10", "RR@10"))
    assert [g["fold"] for g in groups] == ["dl19", "scifact"] and "first-stage" in groups[0]
    assert set(groups[0]["learned"]) == {"nDCG@10", "RR@10"}
    with pytest.raises(InputError, match="folds=1 needs a whole number 2 <= folds"):
        kfold_evaluate(ex, folds=1)
    with pytest.raises(InputError, match="at least 2 groups"):
        leave_one_group_out(synthetic(n_queries=4))
    # two datasets' queries with the same ids: in one fold, one replaced the other in its run
    clash = synthetic(n_queries=20, groups=("a",)) + synthetic(n_queries=20, seed=1, groups=("b",))
    for evaluate_folds in (lambda: kfold_evaluate(clash, folds=2), lambda: leave_one_group_out(clash)):
        with pytest.raises(InputError, match="query id 'q0' is in two examples \\(groups 'a' and 'b'\\)"):
            evaluate_folds()
    with pytest.raises(InputError, match="query 'q0' has 24 scores for 25 candidates"):
        evaluate_scores(ex, lambda q: q.features.sum(axis=1)[:-1])


def test_bad_training_input():
    ex = synthetic(n_queries=3)
    for q in ex:
        q.labels[:] = 0
    with pytest.raises(InputError, match="same label"):
        train_head_weights(ex)
    with pytest.raises(InputError, match="no query has a relevant candidate"):
        train_head_weights(ex, learner="pairwise")
    with pytest.raises(InputError, match="learner='listwise'"):
        train_head_weights(ex, learner="listwise")
    ex[1].heads = HEADS[:2]
    with pytest.raises(InputError, match="query 'q1'"):
        train_head_weights(ex)


def test_json_round_trip_and_first_stage(tmp_path):
    w = train_head_weights(synthetic(n_queries=20), first_stage=True, trained_on="synthetic")
    path = w.save("org/m", "f" * 64, root=tmp_path)
    back = LearnedHeadWeights.load("org/m", "f" * 64, root=tmp_path)
    assert path.is_file() and back.trained_on == "synthetic" and back.config.first_stage
    np.testing.assert_allclose(back.weights, w.weights)
    x, fs = synthetic(n_queries=1, seed=3)[0].features, np.arange(25.0)
    np.testing.assert_allclose(back.score_features(x, fs), w.score_features(x, fs))
    with pytest.raises(InputError, match="first-stage score"):
        back.score_features(x)
    # the first-stage feature is the rank: any monotone transform of the scores scores the same
    np.testing.assert_allclose(back.score_features(x, np.exp(fs) * 7 - 3), back.score_features(x, fs))
    with pytest.raises(InputError, match="no learned head weights in the head registry"):
        LearnedHeadWeights.load("org/m", "0" * 64, root=tmp_path)


def test_restrict_heads_selects_columns_in_order():
    q = synthetic(n_queries=1)[0]
    sub = restrict_heads(q, [(1, 1), (0, 0)])
    np.testing.assert_array_equal(sub.features, q.features[:, [3, 0]])
    assert sub.heads == [(1, 1), (0, 0)] and sub.labels is q.labels and q.features.shape[1] == 6
    w = train_head_weights([restrict_heads(x, [(0, 0), (1, 1)]) for x in synthetic()])
    assert w.heads == [(0, 0), (1, 1)] and (w.weights > 0).all()  # the planted 2.0 and 1.5
    with pytest.raises(InputError, match="no features for heads 5-0"):
        restrict_heads(q, [(5, 0)])


def test_first_stage_feature_is_minus_rank():
    from attnrank.rerank.learned import first_stage_feature

    np.testing.assert_array_equal(first_stage_feature([0.2, 3.0, 0.2, -1.0]), [-1, 0, -2, -3])


def test_stage_features_learned_and_missing_values():
    from attnrank.rerank.learned import stage_feature

    # a candidate the retriever did not return ranks below all it returned
    np.testing.assert_array_equal(stage_feature([0.5, np.nan, 0.2]), [0.5, 0.2, 0.2])
    np.testing.assert_array_equal(stage_feature([np.nan, np.nan]), [0.0, 0.0])
    # a planted "dense" signal the heads lack: its weight is learned and it improves the ranking
    ex = synthetic(n_queries=60, seed=1)
    rng = np.random.default_rng(7)
    for q in ex:
        q.stages = {"dense": q.labels * 2.0 + rng.normal(size=len(q.labels)), "bm25": rng.normal(size=len(q.labels))}
    w = train_head_weights(ex, stages=["dense", "bm25"], l2=0.1)
    assert w.config.stages == ["dense", "bm25"] and len(w.stage_weights) == 2
    assert w.stage_weights[0] > 1.0 and abs(w.stage_weights[1]) < 0.5 * w.stage_weights[0]
    plain = train_head_weights(ex, l2=0.1)
    ap = lambda m: kfold_evaluate(ex, folds=3, l2=0.1, **m)  # noqa: E731
    assert np.mean([f["learned"]["nDCG@10"] for f in ap({"stages": ["dense"]})]) > np.mean(
        [f["learned"]["nDCG@10"] for f in ap({})]
    )
    q = ex[0]
    np.testing.assert_allclose(
        w.score_features(q.features, stages=q.stages),
        np.column_stack([standardise(q.features), standardise(np.column_stack([q.stages["dense"], q.stages["bm25"]]))])
        @ np.r_[w.weights, w.stage_weights]
        + w.bias,
    )
    assert plain.stage_weights == [] and LearnedHeadWeights.from_json(w.to_json()).stage_weights == w.stage_weights
    with pytest.raises(InputError, match=r"no \['bm25'\] stage scores"):
        w.score_features(q.features, stages={"dense": q.stages["dense"]})


# --------------------------------------------------------------------------- with the reranker
DOCS = [
    Document("paris", "Paris is the capital of France."),
    Document("berlin", "Berlin is in Germany."),
    Document("banana", "Bananas are yellow."),
]


def test_features_from_windows(llm):
    rr = AttentionReranker(llm, None, signals=None)
    wins = rr.windows("capital of France?", DOCS)
    qf = query_features("q", wins, [d.id for d in DOCS], rr.head_list, {"q": {"paris": 1}}, max_layer=1)
    assert qf.heads == [h for h in rr.head_list if h[0] <= 1] and qf.features.shape == (3, 8)
    np.testing.assert_array_equal(qf.labels, [1, 0, 0])
    np.testing.assert_allclose(qf.features, window_features(wins, 3)[:8].T)


def test_integer_candidate_ids_get_the_labels_their_string_judgments_give(llm):
    """Ids read as integers (a run's, a DataFrame's) looked up no label in string-keyed qrels: the
    weights trained on no relevant candidate while the report's evaluation found one."""
    rr = AttentionReranker(llm, None, signals=None)
    wins = rr.windows("capital of France?", [Document(str(i), d.text) for i, d in enumerate(DOCS)])
    qf = query_features("q", wins, [0, 1, 2], rr.head_list, {"q": {"0": 1, "2": 2}})
    np.testing.assert_array_equal(qf.labels, [1, 0, 2])
    assert qf.doc_ids == ["0", "1", "2"] and qf.qrels == {"0": 1, "2": 2}


def test_reranker_with_learned_scorer(llm, monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNRANK_HOME", str(tmp_path))
    with pytest.raises(InputError, match="no learned head weights in the head registry for model 'tiny-llama'"):
        AttentionReranker(llm, scorer="learned", signals=None)
    heads = [(0, 2), (1, 1), (1, 3)]
    ex = [
        QueryFeatures(
            f"q{i}", ["a", "b", "c"], np.random.default_rng(i).normal(size=(3, 3)), np.array([1, 0, 0]), heads
        )
        for i in range(6)
    ]
    w = train_head_weights(ex, calibrate=True, use_filter=True)
    w.save(llm.model_id, llm.fingerprint)
    rr = AttentionReranker(llm, scorer="learned", signals=None)
    assert rr.heads == heads and rr.capturer.deepest_layer == 1
    scores = rr.score("capital of France?", DOCS)
    ref = w.score_features(
        window_features(AttentionReranker(llm, heads, signals=None).windows("capital of France?", DOCS), 3).T
    )
    np.testing.assert_allclose(scores, ref, atol=1e-9)
    res = AttentionReranker(llm, scorer=w, signals=None).rank(
        "capital of France?", [ScoredDocument(d.id, 3.0 - i, i + 1, d.text) for i, d in enumerate(DOCS)]
    )
    assert sorted(res.scores, reverse=True) == res.scores and set(res.ids) == {"paris", "berlin", "banana"}
    with pytest.raises(InputError, match="the learned scorer has no per-token attention evidence"):  # it gave None
        rr.rank("capital of France?", DOCS, return_evidence=True)
    # weights over the heads and the retrievers' dense score read ScoredDocument.stage_scores
    for q in ex:
        q.stages = {"dense": np.array([0.9, 0.1, 0.5])}
    ws = train_head_weights(ex, stages=["dense"])
    cands = [
        ScoredDocument(d.id, 3.0 - i, i + 1, d.text, stage_scores=s)
        for i, (d, s) in enumerate(zip(DOCS, [{"dense": 0.9, "bm25": 2.0}, {"bm25": 1.0}, {"dense": 0.5}]))
    ]
    got = AttentionReranker(llm, scorer=ws, signals=None).rank("capital of France?", cands)
    feats = window_features(AttentionReranker(llm, heads, signals=None).windows("capital of France?", DOCS), 3).T
    want = ws.score_features(feats, stages={"dense": [0.9, 0.5, 0.5]})  # berlin: not dense-retrieved
    assert got.ids == [DOCS[i].id for i in np.argsort(-want, kind="stable")]
    with pytest.raises(InputError, match="no \\['dense'\\] stage scores"):
        AttentionReranker(llm, scorer=ws, signals=None).rank("capital of France?", DOCS)
    with pytest.raises(InputError, match="drop heads="):
        AttentionReranker(llm, "0-1", scorer="learned", signals=None)
    with pytest.raises(InputError, match="scorer='best'"):
        AttentionReranker(llm, scorer="best", signals=None)


def test_stored_weights_that_do_not_fit_their_heads_or_stages_are_refused_on_load():
    w = train_head_weights(synthetic(n_queries=20))
    data = w.to_json()
    data["config"] = {**data["config"], "heads": data["config"]["heads"][:4]}  # 6 weights, 4 heads
    with pytest.raises(InputError, match="hold 6 weights for 4 heads"):  # before: a numpy shape error when scoring
        LearnedHeadWeights.from_json(data)
    with pytest.raises(InputError, match=r"0 for the stages \['dense'\]"):
        LearnedHeadWeights.from_json({**w.to_json(), "config": {**w.to_json()["config"], "stages": ["dense"]}})
    with pytest.raises(InputError, match="non-finite"):
        LearnedHeadWeights.from_json({**w.to_json(), "bias": float("nan")})


def test_score_gives_learned_weights_the_first_stage_of_scored_candidates(llm):
    heads = [(0, 2), (1, 1)]
    ex = [
        QueryFeatures(
            f"q{i}",
            ["a", "b", "c"],
            np.random.default_rng(i).normal(size=(3, 2)),
            np.array([1, 0, 0]),
            heads,
            first_stage=np.array([3.0, 1.0, 2.0]),
        )
        for i in range(6)
    ]
    w = train_head_weights(ex, first_stage=True)
    cands = [ScoredDocument(d.id, 3.0 - i, i + 1, d.text) for i, d in enumerate(DOCS)]
    rr = AttentionReranker(llm, scorer=w, signals=None)
    # before: score() dropped the candidates' scores and refused for want of a first stage
    by_id = {r.id: r.score for r in rr.rank("capital of France?", cands)}
    np.testing.assert_allclose(rr.score("capital of France?", cands), [by_id[d.id] for d in DOCS], atol=1e-12)


def test_learned_weights_read_from_attention_captured_otherwise_warn(llm, caplog):
    """They recorded nothing of how their features' attention was captured: a reranker in block
    attention scored them with features of another scale without a word."""
    import logging

    heads = [(0, 1), (1, 2)]
    ex = [
        QueryFeatures(f"q{i}", ["a", "b"], np.random.default_rng(i).normal(size=(2, 2)), np.array([1, 0]), heads)
        for i in range(4)
    ]
    w = train_head_weights(ex)
    assert w.config.capture == "full"
    assert LearnedHeadWeights.from_json(w.to_json()).config.capture == "full"
    legacy = w.to_json()
    del legacy["config"]["capture"]  # weights saved before the capture was recorded read full attention
    assert LearnedHeadWeights.from_json(legacy).config.capture == "full"
    with caplog.at_level(logging.WARNING, logger="attnrank.rerank.learned.weights"):
        AttentionReranker(llm, scorer=w, signals=None)
        assert "captured as" not in caplog.text
        AttentionReranker(llm, scorer=w, signals=None, attention="block")
    assert "trained on attention captured as 'full'" in caplog.text and "'block:rotated'" in caplog.text


def test_learned_weights_read_from_another_prompt_warn_naming_the_settings(llm, caplog):
    """They recorded nothing of the prompt their features' attention was read from: a reranker
    with another instruction, order, query span or passage cut scored them without a word."""
    import logging

    heads = [(0, 1), (1, 2)]
    ex = [
        QueryFeatures(f"q{i}", ["a", "b"], np.random.default_rng(i).normal(size=(2, 2)), np.array([1, 0]), heads)
        for i in range(4)
    ]
    prompt = RerankConfig(instruction="qa").prompt_settings()
    w = train_head_weights(ex, prompt=prompt)
    assert LearnedHeadWeights.from_json(w.to_json()).config.prompt == prompt
    with caplog.at_level(logging.WARNING, logger="attnrank.registry"):
        AttentionReranker(llm, scorer=w, signals=None, instruction="qa", calibrate=False)  # the weights fix calibrate
        AttentionReranker(llm, scorer=train_head_weights(ex), signals=None)  # nothing recorded: not checked
        AttentionReranker(llm, scorer=w, signals=None, instruction="QA")  # the same prompt, spelt otherwise
        assert "fitted with" not in caplog.text
        AttentionReranker(llm, scorer=w, signals=None, order="forward", max_doc_words=50)
    qa, ie = (RerankConfig(instruction=i).prompt_settings()["instruction"] for i in ("qa", "ie"))
    assert f"the learned head weights were fitted with instruction={qa!r} (this reranker: {ie!r})" in caplog.text
    assert (
        "max_doc_words=300 (this reranker: 50)" in caplog.text
        and "order='reverse' (this reranker: 'forward')" in caplog.text
    )


def test_head_weights_stored_before_the_learner_rename_still_load():
    data = train_head_weights(synthetic(n_queries=20), learner="pairwise").to_json()
    data["model"] = data.pop("learner")  # as registries before 2026-12-05 hold them
    assert LearnedHeadWeights.from_json(data).learner == "pairwise"


def test_learned_weights_over_heads_in_training_order_score_each_head_with_its_weight(llm, tmp_path, monkeypatch):
    """heads train keeps its top-N heads in nDCG order (the shipped weights too): the reranker
    read the heads sorted and gave each weight another head's score."""
    monkeypatch.setenv("ATTNRANK_HOME", str(tmp_path))
    heads = [(1, 3), (0, 2), (1, 1)]  # not sorted
    ex = [
        QueryFeatures(
            f"q{i}", ["a", "b", "c"], np.random.default_rng(i).normal(size=(3, 3)), np.array([1, 0, 0]), heads
        )
        for i in range(6)
    ]
    w = train_head_weights(ex, calibrate=True, use_filter=True)
    assert w.heads == heads
    rr = AttentionReranker(llm, scorer=w, signals=None)
    plain = AttentionReranker(llm, sorted(heads), signals=None)
    features = window_features(plain.windows("capital of France?", DOCS), 3).T  # columns in sorted head order
    in_training_order = features[:, [sorted(heads).index(h) for h in heads]]
    np.testing.assert_allclose(rr.score("capital of France?", DOCS), w.score_features(in_training_order), atol=1e-9)


def test_max_pairs_per_query_is_checked():
    with pytest.raises(InputError, match="max_pairs_per_query=0 must be an integer >= 1"):
        train_head_weights(synthetic(n_queries=4), learner="pairwise", max_pairs_per_query=0)


def test_weights_record_how_their_features_were_read():
    """query_features(..., calibrate=False) then train_head_weights(...) saved weights marked
    calibrate=True: a reranker fed them calibrated features."""
    from dataclasses import replace

    raw = [replace(q, calibrate=False, use_filter=True) for q in synthetic()]
    w = train_head_weights(raw)
    assert (w.config.calibrate, w.config.use_filter) == (False, True)
    with pytest.raises(InputError, match="calibrate=True but the features were read with calibrate=False"):
        train_head_weights(raw, calibrate=True)
    mixed = raw[:-1] + [replace(raw[-1], calibrate=True)]
    with pytest.raises(InputError, match="read with calibrate=True and calibrate=False"):
        train_head_weights(mixed)
    assert train_head_weights(synthetic()).config.calibrate is True  # unrecorded: as before


def test_pairwise_training_orders_only_pairs_with_a_relevant_first():
    """With rel=2, a label-1 candidate was trained above a label-0 one (both non-relevant), where
    pointwise reads them alike: labels 0/1 only at rel 2 trained weights from noise."""
    heads = [(0, 0), (0, 1)]
    ex = [
        QueryFeatures(
            f"q{i}", ["a", "b", "c"], np.random.default_rng(i).normal(size=(3, 2)), np.array([1, 0, 0]), heads
        )
        for i in range(6)
    ]
    with pytest.raises(InputError, match=r"no query has a relevant candidate \(label >= rel\)"):
        train_head_weights(ex, learner="pairwise", rel=2)
    assert train_head_weights(ex, learner="pairwise", rel=1).weights is not None


def test_a_non_finite_head_feature_is_refused_not_zeroed():
    """standardise turned a column with a NaN or inf into zeros: a plausible, wrong order with exit 0
    (the fused scorer refuses such values)."""
    w = train_head_weights(synthetic(n_queries=20))
    for bad in (np.nan, np.inf):
        x = synthetic(n_queries=1, seed=3)[0].features.copy()
        x[4, 2] = bad
        with pytest.raises(InputError, match=f"head feature 2 of candidate #4 is {bad}; learned weights need finite"):
            w.score_features(x)
    examples = synthetic(n_queries=4)
    examples[1].features[0, 0] = np.nan
    with pytest.raises(InputError, match="need finite values"):
        train_head_weights(examples)


def test_all_zero_weights_are_not_registered(tmp_path):
    """Features constant within every query fit to w = 0, which was saved: scorer='learned' then
    ranked every candidate alike (by tie-breaking) with exit 0. The error names the CLI to train with."""
    flat = [
        QueryFeatures(f"q{q}", [f"d{i}" for i in range(3)], np.ones((3, 2)), np.array([1, 0, 0]), [(0, 0), (0, 1)])
        for q in range(4)
    ]
    w = train_head_weights(flat)
    assert not np.any(w.weights)
    with pytest.raises(InputError, match="are all 0: they would rank every candidate alike"):
        w.save("org/m", "f" * 64, root=tmp_path)
    with pytest.raises(InputError, match="attnrank heads train --model MODEL"):
        LearnedHeadWeights.load("org/m", "f" * 64, root=tmp_path)


def test_configurations_holding_weights_compare_and_swap_them():
    """Weights given for weights raised 'truth value of an array is ambiguous' (their dataclass
    compared the arrays), as did two configurations holding them; the copy was named learned+scorer."""
    w1, w2 = train_head_weights(synthetic(n_queries=20)), train_head_weights(synthetic(n_queries=20, seed=1))
    first = RerankConfig.preset("learned", scorer=w1)
    swapped = first.with_options(scorer=w2)
    assert swapped.scorer is w2 and swapped.name == first.name == "learned"
    assert first == RerankConfig.preset("learned", scorer=w1) and first != swapped
    assert w1 == w1 and w1 != w2


def test_the_python_default_l2_is_the_one_heads_train_uses():
    """train_head_weights defaulted to l2=1.0 and `attnrank heads train` to 10 (the measured
    setting): the same labelled data gave other registered weights through each."""
    import inspect

    from typer.testing import CliRunner

    from attnrank.cli import app
    from attnrank.config import DEFAULT_HEAD_L2

    assert inspect.signature(train_head_weights).parameters["l2"].default == DEFAULT_HEAD_L2 == 10.0
    shown = CliRunner().invoke(app, ["heads", "train", "--help"], terminal_width=200).output
    assert f"default {DEFAULT_HEAD_L2:g})" in " ".join(shown.split())
