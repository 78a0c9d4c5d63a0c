"""The fused scorer's weights and scoring (attnrank.rerank.fused); comparing methods (rerank.fusion_eval)."""

from __future__ import annotations

import numpy as np
import pytest

from attnrank.errors import InputError
from attnrank.registry import shipped_artifact
from attnrank.rerank.config import RerankConfig
from attnrank.rerank.fused import FusedWeights, equal_weights
from attnrank.rerank.fused_features import FusionExample, attention_confidence
from attnrank.rerank.fused_resolve import resolve_fused
from attnrank.rerank.fused_training import train_fused
from attnrank.rerank.fusion_eval import compare


def test_gate_falls_back_to_the_base_model_when_attention_is_flat():
    fused = FusedWeights(["attention", "dense"], [5.0, 1.0], base_weights=[1.0], gate=1.0)
    dense = np.array([3.0, 2.0, 1.0, 0.0])
    sharp = {"attention": np.array([0.0, 0.0, 0.0, 9.0]), "dense": dense}  # confidence 1.73
    flat = {"attention": np.array([0.0, 0.0, 1.0, 1.0]), "dense": dense}  # confidence 1.0 ... >= gate
    lowest = {"attention": np.array([0.0, 1.0, 2.0, 3.0]), "dense": dense}  # confidence 1.34
    assert attention_confidence(sharp["attention"]) == pytest.approx(np.sqrt(3))
    assert fused.confident(sharp) is True and int(np.argmax(fused.score(sharp))) == 3
    fused.gate = 1.5
    assert fused.confident(lowest) is False and fused.confident(flat) is False
    assert int(np.argmax(fused.score(lowest))) == 0  # dense alone decides
    assert fused.confident({"attention": np.zeros(4), "dense": dense}) is False


def test_equal_weights_sum_the_per_query_z_scores():
    sig = {"bm25": np.array([3.0, 1.0, 2.0]), "dense": np.array([0.1, 0.9, 0.5]), "rank": np.zeros(3)}
    z = {k: (v - v.mean()) / v.std() for k, v in sig.items() if k != "rank"}
    np.testing.assert_allclose(equal_weights().score(sig), z["bm25"] + z["dense"])
    # a scale-free choice: multiplying one signal by a constant changes nothing
    np.testing.assert_allclose(equal_weights().score({**sig, "bm25": 40 * sig["bm25"]}), z["bm25"] + z["dense"])
    assert not equal_weights().uses_attention and equal_weights(["dense"]).score(sig).argmax() == 1


def test_weights_round_trip_the_registry(tmp_path, make_examples):
    fused = train_fused(make_examples(30, "a", 0.5, 5), trained_on="synthetic")
    fused.save("some/model", "f" * 64, root=tmp_path)
    back = FusedWeights.load("some/model", "f" * 64, root=tmp_path)
    assert back.features == fused.features and back.weights == pytest.approx(fused.weights)
    assert back.gate == fused.gate and back.trained_on == "synthetic"


def test_weights_of_numpy_numbers_save_at_any_depth(tmp_path):
    """The weights take numpy numbers, which json refuses inside a list or the metrics: the save
    failed after the training."""
    f32 = np.float32
    fused = FusedWeights(["bm25", "dense"], [f32(0.5), f32(0.25)], metrics={"nDCG@10": f32(0.75), "n": np.int64(3)})
    fused.save("some/model", "f" * 64, root=tmp_path)
    back = FusedWeights.load("some/model", "f" * 64, root=tmp_path)
    assert back.weights == [0.5, 0.25] and back.metrics == {"nDCG@10": 0.75, "n": 3}


def test_weights_record_the_heads_and_capture_of_their_attention(tmp_path, caplog, make_examples):
    ex = make_examples(30, "a", 0.5, 5)
    fused = train_fused(ex, heads=[(3, 1), "0-2"], capture="block:shared")
    assert fused.heads == ["0-2", "3-1"] and fused.capture == "block:shared"  # normalised, sorted
    assert fused.without_attention().heads is None and fused.without_attention().capture is None
    fused.save("some/model", "f" * 64, root=tmp_path)
    back = FusedWeights.load("some/model", "f" * 64, root=tmp_path)
    assert back.heads == ["0-2", "3-1"] and back.capture == "block:shared"
    assert train_fused(ex, heads="all").heads == "all"
    without = train_fused(ex, ["bm25", "dense"], heads=[(0, 1)], capture="full")
    assert without.heads is None and without.capture is None  # no attention feature: nothing to record
    with pytest.raises(InputError, match="only the attention feature reads heads"):
        FusedWeights(["bm25"], [1.0], heads=["0-1"])
    with pytest.raises(InputError, match="is not a \\(layer, head\\) pair"):
        FusedWeights(["attention"], [1.0], heads=["zero"])
    with caplog.at_level("WARNING", logger="attnrank.rerank.fused"):
        fused.warn_if_applied_otherwise([(0, 2), (3, 1)], "block:shared")
        FusedWeights(["attention"], [1.0]).warn_if_applied_otherwise(None, "full")  # none recorded: full, any heads
        FusedWeights(["attention"], [1.0], learner="equal").warn_if_applied_otherwise(None, "block:shared")  # unfitted
        assert not caplog.text
        fused.warn_if_applied_otherwise("0-2,3-1", "full")
        assert "captured as 'block:shared'; this reranker captures it as 'full'" in caplog.text
        assert "heads" not in caplog.text
        fused.warn_if_applied_otherwise(None, "block:shared")
    assert "fitted to the attention of heads 2 (0-2,3-1); this reranker reads all" in caplog.text


def test_equal_weights_with_a_gate_warn_where_their_attention_is_read_otherwise(caplog):
    """--learner equal still chooses the confidence gate on attention's values: applied to
    attention captured, prompted or re-weighted otherwise, it read other values without a warning."""
    equal = FusedWeights(
        ["attention", "bm25"], [1.0, 1.0], base_weights=[1.0], gate=0.5, learner="equal",
        capture="block:shared", prompt={"order": "x"},
    )  # fmt: skip
    with caplog.at_level("WARNING"):
        equal.warn_if_applied_otherwise(None, "full", reweighted=True)
        equal.warn_if_prompted_otherwise({"order": "y"})
    assert "re-weights it" in caplog.text and "captured as 'block:shared'" in caplog.text
    assert "order" in caplog.text


def test_weights_warn_where_their_attention_is_read_from_another_prompt(tmp_path, caplog, make_examples):
    """The prompt the attention feature was fitted to (instruction, order, query span, calibration,
    token filter) is stored with the weights; a reranker that sets it otherwise is told which."""
    fused = train_fused(make_examples(30, "a", 0.5, 5), heads="all", capture="full")
    fused.prompt = RerankConfig.preset("fused").prompt_settings()
    fused.save("some/model", "f" * 64, root=tmp_path)
    back = FusedWeights.load("some/model", "f" * 64, root=tmp_path)
    assert back.prompt == fused.prompt
    with caplog.at_level("WARNING", logger="attnrank.registry"):
        back.warn_if_prompted_otherwise(RerankConfig.preset("fused").prompt_settings())
        back.warn_if_prompted_otherwise(
            RerankConfig.preset("fused", max_doc_words=20).prompt_settings()
        )  # the cut: warn_if_cut_otherwise's
        FusedWeights(
            ["attention", "bm25"], [1.0, 1.0], learner="equal", prompt={"order": "x"}
        ).warn_if_prompted_otherwise({"order": "y"})
        back.without_attention().warn_if_prompted_otherwise({"order": "y"})  # no attention: nothing read from a prompt
        assert not caplog.text
        back.warn_if_prompted_otherwise(
            RerankConfig.preset("fused", query_span="last", token_filter=False).prompt_settings()
        )
    assert "the fused scorer weights were fitted with query_span='full' (this reranker: 'last')" in caplog.text
    assert "token_filter=True (this reranker: False)" in caplog.text


def test_malformed_weights_and_missing_features_are_refused(make_examples):
    with pytest.raises(InputError, match="among"):
        FusedWeights(["attention", "splade"], [1.0, 1.0])
    with pytest.raises(InputError, match="one weight each"):
        FusedWeights(["attention"], [1.0, 2.0])
    with pytest.raises(InputError, match="lack the feature"):
        FusedWeights(["attention", "dense"], [1.0, 1.0]).score({"attention": np.ones(3)})
    with pytest.raises(InputError, match="same label"):
        train_fused([FusionExample("q", ["a", "b"], {"dense": np.ones(2)}, np.zeros(2, dtype=int))], ["dense"])
    for bad in (0, float("nan"), float("inf"), True):  # NaN passed `l2 <= 0` and failed inside sklearn
        with pytest.raises(InputError, match=r"must be a finite number > 0 \(the L2 penalty"):
            train_fused(make_examples(5, "a", 0.5, 6), l2=bad)


def test_auto_falls_back_to_the_packaged_weights_for_another_model():
    shipped = resolve_fused("auto", "smollm2-135m", "0" * 64)  # no exact fingerprint: the shipped entry by name
    other = resolve_fused("auto", "some/other-model", "e" * 64)
    assert other is not None and other.features == shipped.features and other.weights == shipped.weights
    # the packaged model's heads need not exist in another model: the reranker's own are read
    assert shipped_artifact(FusedWeights.KIND, "smollm2-135m")["heads"] and other.heads is None
    assert resolve_fused(None, "x", "y") is None


def test_stored_weights_that_do_not_fit_their_features_are_refused_on_load():
    base = dict(features=["attention", "bm25", "dense", "rank"], weights=[1.0, 0.5, 1.0, 0.1])
    # before: accepted, then a numpy shape error on the first query whose attention fell below the gate
    with pytest.raises(InputError, match=r"base_weights has 2 weights for the 3 features \['bm25', 'dense', 'rank'\]"):
        FusedWeights.from_json({**base, "base_weights": [0.5, 1.0], "gate": 0.5})
    with pytest.raises(InputError, match="not all finite"):  # before: NaN scores for every candidate
        FusedWeights.from_json({**base, "weights": [float("nan"), 0.5, 1.0, 0.1]})
    with pytest.raises(InputError, match="not all finite numbers"):  # before: read as 0.5, then failed at a query
        FusedWeights.from_json({**base, "base_weights": [0.5, 1.0, 0.1], "gate": "0.5"})
    with pytest.raises(InputError, match="not all finite numbers"):
        FusedWeights.from_json({**base, "weights": ["1", 0.5, 1.0, 0.1]})
    with pytest.raises(InputError, match="gate=0.5 falls back to base_weights"):  # before: the gate was ignored
        FusedWeights(["attention", "dense"], [1.0, 1.0], gate=0.5)
    with pytest.raises(InputError, match="each once"):
        FusedWeights(["dense", "dense"], [1.0, 1.0])
    assert FusedWeights.from_json({**base, "base_weights": [0.5, 1.0, 0.1], "gate": 0.5}).gate == 0.5


def test_auto_refuses_registered_weights_that_do_not_load(monkeypatch, tmp_path, caplog):
    from attnrank.registry_save import save_artifact

    monkeypatch.setenv("ATTNRANK_HOME", str(tmp_path))
    bad = {"features": ["attention", "splade"], "weights": [1.0, 1.0]}  # e.g. from another attnrank version
    save_artifact(FusedWeights.KIND, "my/model", "e" * 64, bad)
    # before: the user's weights were dropped and the packaged model's used, logged as "none registered"
    with pytest.raises(InputError, match="splade"):
        resolve_fused("auto", "my/model", "e" * 64)
    good = FusedWeights(["attention", "dense"], [1.0, 0.5])
    good.save("my/model", "e" * 64)
    assert resolve_fused("auto", "my/model", "e" * 64).features == ["attention", "dense"]
    assert "no fused weights are registered" not in caplog.text


def test_non_finite_or_misaligned_signals_are_refused():
    fused = FusedWeights(["attention", "dense"], [1.0, 1.0])
    dense = np.array([0.1, 0.2, 0.3, 0.4])
    # before: inf (the strongest attention) zeroed the whole column and ranked that candidate last;
    # NaN became a raw 0, here the lowest attention; other lengths were a numpy traceback
    with pytest.raises(InputError, match="feature 'attention' of candidate #0 is inf"):
        fused.score({"attention": np.array([np.inf, 1.0, 2.0, 3.0]), "dense": dense})
    with pytest.raises(InputError, match="feature 'attention' of candidate #2 is nan"):
        fused.score({"attention": np.array([1.0, 2.0, np.nan, 3.0]), "dense": dense})
    with pytest.raises(InputError, match=r"different numbers of values \{'attention': 3, 'dense': 4\}"):
        fused.score({"attention": np.array([1.0, 2.0, 3.0]), "dense": dense})
    assert np.argmax(fused.score({"attention": np.array([9.0, 1.0, 2.0, 3.0]), "dense": dense})) == 3


def test_one_line_error_for_baselines_none_of_which_was_scored(make_examples):
    """A comparison against baselines none of which was scored was a ValueError from max()."""
    ex = make_examples(4, "g", 0.1, 0)
    scores = {"mine": {e.qid: e.signals["attention"] for e in ex}}
    with pytest.raises(InputError, match="none of the baselines \\['bm25 alone'\\] is among the scored methods"):
        compare(ex, scores, baselines=("bm25 alone",))


def test_signals_weights_read_no_llm_feature():
    from attnrank.rerank.fused import SignalsWeights

    assert not SignalsWeights(["bm25", "rank"], [1.0, 0.5]).uses_llm
    for features in (["bm25", "likelihood"], ["attention", "dense"]):
        with pytest.raises(InputError, match="must read none of"):
            SignalsWeights(features, [1.0, 1.0])


def test_likelihood_weights_read_the_likelihood_and_no_attention():
    from attnrank.rerank.fused import LikelihoodWeights

    ok = LikelihoodWeights(["bm25", "likelihood"], [1.0, 2.0])
    assert ok.KIND != FusedWeights.KIND and not ok.uses_attention and ok.uses_llm
    for features in (["bm25", "dense"], ["attention", "likelihood"]):
        with pytest.raises(InputError, match="must read 'likelihood' and not 'attention'"):
            LikelihoodWeights(features, [1.0, 1.0])


def test_weights_stored_before_the_learner_rename_still_load():
    """Registries written before 2026-12-05 store the learner as ``model``; they load as ``learner``,
    and a payload holding both names is refused, not read by one of them."""
    base = dict(features=["bm25", "dense"], weights=[0.5, 1.0])
    assert FusedWeights.from_json({**base, "model": "pairwise"}).learner == "pairwise"
    assert "model" not in FusedWeights.from_json({**base, "model": "equal"}).to_json()
    with pytest.raises(InputError, match="malformed"):
        FusedWeights.from_json({**base, "model": "pairwise", "learner": "pointwise"})


def test_weights_saved_before_the_token_cut_was_recorded_read_it_from_their_prompt(make_examples, caplog):
    """Weights fitted at 128 tokens before max_doc_tokens was recorded beside the words hold it in
    their prompt: read as "no token cut", applied at 128 they were warned of, with advice to drop it."""
    from dataclasses import replace

    fused = train_fused(make_examples(20, "a", 0.5, 1), prompt={"max_doc_words": 220, "max_doc_tokens": 128})
    assert (fused.max_doc_words, fused.max_doc_tokens) == (220, 128)
    older = replace(fused, max_doc_tokens=None)  # (as such a file loads)
    with caplog.at_level("WARNING"):
        older.warn_if_cut_otherwise(220, 128)
        older.warn_if_prompted_otherwise({**(older.prompt or {}), "max_doc_tokens": 128})
        assert not caplog.text
        older.warn_if_cut_otherwise(220, None)
    assert "fitted to passages cut to 220 words and 128 tokens; this reranker cuts them to 220 words" in caplog.text
    assert caplog.text.count("fitted") == 1


def test_training_records_the_passage_cut_and_refuses_a_query_without_candidates(make_examples, caplog):
    """train_fused stored the cut only inside its prompt record, which no check read: weights fitted
    at one cut and applied at another were not warned of (only the CLI set max_doc_words). A query
    without candidates failed in the gate's choice, after the fit, as a ValueError."""
    from dataclasses import replace

    examples = make_examples(20, "a", 0.5, 1)
    fused = train_fused(examples, prompt={"max_doc_words": 50, "instruction": "qa"}, capture="full")
    assert fused.max_doc_words == 50
    with caplog.at_level("WARNING"):
        fused.warn_if_cut_otherwise(300)
    assert "fitted to passages cut to 50 words" in caplog.text
    empty = replace(
        examples[0],
        qid="q-empty",
        doc_ids=[],
        labels=np.zeros(0),
        signals={k: np.zeros(0) for k in examples[0].signals},
    )
    with pytest.raises(InputError, match="training query 'q-empty' has no candidates"):
        train_fused([*examples, empty])
