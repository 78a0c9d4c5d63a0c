"""The fused scorer (attnrank.rerank.fused) and its held-out evaluation (rerank.fusion_eval)."""

from __future__ import annotations

import numpy as np
import pytest

from attnrank.errors import InputError
from attnrank.eval.crossval import group_splits
from attnrank.registry import shipped_artifact
from attnrank.rerank.fused import (
    FusedWeights,
    FusionExample,
    attention_confidence,
    equal_weights,
    resolve_fused,
    train_fused,
)
from attnrank.rerank.fusion_eval import EQUAL, NO_ATTENTION, WITH_ATTENTION, compare, heldout_scores


def _examples(n: int, group: str, att_noise: float, seed: int) -> list[FusionExample]:
    """Queries of 10 candidates, 2 relevant: ``dense`` is informative, ``bm25`` weakly, ``rank``
    not at all; ``attention`` is informative with noise ``att_noise``."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        y = np.zeros(10, dtype=np.int64)
        y[rng.choice(10, 2, replace=False)] = 1
        sig = {
            "dense": y + rng.normal(0, 0.7, 10),
            "bm25": y + rng.normal(0, 2.0, 10),
            "rank": -np.arange(10.0),
            "attention": y + rng.normal(0, att_noise, 10),
        }
        out.append(FusionExample(f"{group}{i}", [f"d{j}" for j in range(10)], sig, y, 1, group))
    return out


def test_training_weights_the_informative_signals():
    fused = train_fused(_examples(60, "a", 0.5, 0) + _examples(60, "b", 0.5, 1), gate=False)
    w = dict(zip(fused.features, fused.weights))
    assert w["attention"] > w["bm25"] > 0 and w["dense"] > w["bm25"] and abs(w["rank"]) < w["bm25"]
    test = _examples(40, "c", 0.5, 2)
    scores = heldout_scores(group_splits(test + _examples(60, "a", 0.5, 0), lambda e: e.group, groups=["c", "a"])[:1])
    rows = {r["method"]: r for r in compare(test, scores)}
    # both signals together beat either alone
    assert rows[WITH_ATTENTION]["nDCG@10"] > rows["dense alone"]["nDCG@10"] > rows["rank alone"]["nDCG@10"]
    assert rows[WITH_ATTENTION]["nDCG@10"] > rows[NO_ATTENTION]["nDCG@10"]
    # the untrained default is scored too: here BM25 is mostly noise, which only training down-weights
    assert rows[NO_ATTENTION]["nDCG@10"] > rows[EQUAL]["nDCG@10"] > rows["bm25 alone"]["nDCG@10"]
    assert rows[WITH_ATTENTION]["best first stage"] == "dense alone" and rows[WITH_ATTENTION]["wins"] > 0


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


def test_gate_is_chosen_on_training_data_and_keeps_first_stage_where_attention_is_noise():
    # half the queries: attention is pure noise with a flat profile; the gate learns to skip it
    rng = np.random.default_rng(3)
    ex = _examples(80, "a", 0.3, 4)
    for e in ex[:40]:
        e.signals["attention"] = rng.normal(0, 1e-3, 10)
    fused = train_fused(ex, balance=False, gate=True)
    assert fused.base_weights and fused.base_features == ["bm25", "dense", "rank"]
    assert fused.gate is None or fused.gate > 0


def test_without_attention_is_the_base_model_and_training_always_fits_it():
    """What ``signals="only"`` scores with: the base model, even of weights trained without a gate."""
    ex = _examples(60, "a", 0.5, 0)
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


def test_equal_weights_sum_the_per_query_z_scores():
    sig = {"bm25": np.array([3.0, 1.0, 2.0]), "dense": np.array([0.1, 0.9, 0.5]), "rank": np.zeros(3)}
    z = {k: (v - v.mean()) / v.std() for k, v in sig.items() if k != "rank"}
    np.testing.assert_allclose(equal_weights().score(sig), z["bm25"] + z["dense"])
    # a scale-free choice: multiplying one signal by a constant changes nothing
    np.testing.assert_allclose(equal_weights().score({**sig, "bm25": 40 * sig["bm25"]}), z["bm25"] + z["dense"])
    assert not equal_weights().uses_attention and equal_weights(["dense"]).score(sig).argmax() == 1


def test_equal_model_fits_nothing_but_the_gate():
    """model='equal': weight 1 on every feature and on the fallback's; only the gate is chosen, and
    where attention is pure noise it falls back on some queries (a gate that scores best)."""
    ex = _examples(60, "a", 50.0, 3)
    fused = train_fused(ex, ["attention", "bm25", "dense"], model="equal")
    assert fused.weights == [1.0, 1.0, 1.0] and fused.base_weights == [1.0, 1.0] and fused.model == "equal"
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


def test_weights_round_trip_the_registry(tmp_path):
    fused = train_fused(_examples(30, "a", 0.5, 5), trained_on="synthetic")
    fused.save("some/model", "f" * 64, root=tmp_path)
    back = FusedWeights.load("some/model", "f" * 64, root=tmp_path)
    assert back.features == fused.features and back.weights == pytest.approx(fused.weights)
    assert back.gate == fused.gate and back.trained_on == "synthetic"


def test_weights_record_the_heads_and_capture_of_their_attention(tmp_path, caplog):
    ex = _examples(30, "a", 0.5, 5)
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
        FusedWeights(["attention"], [1.0], model="equal").warn_if_applied_otherwise(None, "block:shared")  # unfitted
        assert not caplog.text
        fused.warn_if_applied_otherwise("0-2,3-1", "full")
        assert "captured as 'block:shared'; this reranker captures it as 'full'" in caplog.text
        assert "heads" not in caplog.text
        fused.warn_if_applied_otherwise(None, "block:shared")
    assert "fitted to the attention of heads 2 (0-2,3-1); this reranker reads all" in caplog.text


def test_malformed_weights_and_missing_features_are_refused():
    with pytest.raises(InputError, match="among"):
        FusedWeights(["attention", "splade"], [1.0, 1.0])
    with pytest.raises(InputError, match="one weight each"):
        FusedWeights(["attention"], [1.0, 2.0])
    with pytest.raises(InputError, match="lack the feature"):
        FusedWeights(["attention", "dense"], [1.0, 1.0]).score({"attention": np.ones(3)})
    with pytest.raises(InputError, match="same label"):
        train_fused([FusionExample("q", ["a", "b"], {"dense": np.ones(2)}, np.zeros(2, dtype=int))], ["dense"])
    with pytest.raises(InputError, match="l2"):
        train_fused(_examples(5, "a", 0.5, 6), l2=0)


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
    with pytest.raises(InputError, match="gate=0.5 falls back to base_weights"):  # before: the gate was ignored
        FusedWeights(["attention", "dense"], [1.0, 1.0], gate=0.5)
    with pytest.raises(InputError, match="each once"):
        FusedWeights(["dense", "dense"], [1.0, 1.0])
    assert FusedWeights.from_json({**base, "base_weights": [0.5, 1.0, 0.1], "gate": 0.5}).gate == 0.5


def test_auto_refuses_registered_weights_that_do_not_load(monkeypatch, tmp_path, caplog):
    from attnrank.registry import save_artifact

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


def test_one_line_errors_for_missing_candidates_and_baselines():
    """A query without a candidate list, and a comparison against baselines none of which was
    scored, were a bare KeyError and a ValueError from max()."""
    from attnrank.rerank.fused import fusion_examples

    with pytest.raises(InputError, match="1 queries have no candidate list \\(first: 'q2'\\)"):
        fusion_examples(lambda q, d: np.zeros(len(d)), {"q1": "a", "q2": "b"}, {"q1": []}, {})
    ex = _examples(4, "g", 0.1, 0)
    scores = {"mine": {e.qid: e.signals["attention"] for e in ex}}
    with pytest.raises(InputError, match="none of the baselines \\['bm25 alone'\\] is among the scored methods"):
        compare(ex, scores, baselines=("bm25 alone",))


def test_weights_record_the_embedder_of_their_dense_signal():
    """Weights fitted to another embedder's cosines were applied to the packaged MiniLM's: the
    embedder is recorded with the weights (and a mix of embedders refused)."""
    from dataclasses import replace

    ex = [replace(e, embedder="my-embedder") for e in _examples(30, "a", 0.5, 0)]
    assert train_fused(ex, gate=False).embedder == "my-embedder"
    assert train_fused(_examples(30, "a", 0.5, 0), gate=False).embedder is None
    with pytest.raises(InputError, match="different embedders"):
        train_fused(ex[:10] + _examples(10, "b", 0.5, 1), gate=False)
    assert FusedWeights.from_json({"features": ["dense"], "weights": [1.0]}).embedder is None  # older files
