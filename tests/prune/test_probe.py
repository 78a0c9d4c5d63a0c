"""The Sentinel-style sentence probe: feature construction on hand-made numbers, training on
data with a known informative head, registry round trip, and the pruner's per-head features
and ``method="probe"`` on a tiny random Llama (checked against the eager reference)."""

from __future__ import annotations

import numpy as np
import pytest
from test_pruner import DOCS, QUERY, reference

from attnrank.errors import InputError
from attnrank.prune.probe import (
    EXTRAS,
    ProbeExample,
    SentenceProbe,
    average_precision,
    crossfit_scores,
    design,
    lexical_scores,
    select_l2,
    train_probe,
)
from attnrank.prune.pruner import ContextPruner


def test_design_extras_exact():
    heads = np.array([[1.0, 2.0], [3.0, 0.0], [0.5, 0.5], [2.0, 2.0]])
    positions = [(0, 0), (0, 1), (1, 0), (1, 2)]
    x = design(heads, positions, ["passage", "first", "position", "bm25"], lexical=[0.0, 1.5, 0.0, 2.0])
    np.testing.assert_allclose(
        design(heads, positions, ["passage-heads"])[:, 2:], [[2, 1], [2, 1], [1.25, 1.25], [1.25, 1.25]]
    )
    np.testing.assert_allclose(x[:, :2], heads)
    # passage: mean head-summed score of the passage's sentences: (3 + 3) / 2, (1 + 4) / 2
    np.testing.assert_allclose(x[:, 2], [3.0, 3.0, 2.5, 2.5])
    np.testing.assert_allclose(x[:, 3], [1, 0, 1, 0])
    np.testing.assert_allclose(x[:, 4], [1, 1 / 2, 1, 1 / 3])
    np.testing.assert_allclose(x[:, 5], [0.0, 1.5, 0.0, 2.0])
    assert design(heads, positions, []).shape == (4, 2)
    with pytest.raises(InputError, match="needs lexical= scores"):
        design(heads, positions, ["bm25"])
    lex = lexical_scores("capital of France", ["Paris is the capital of France.", "Bananas are yellow.", "."])
    assert lex[0] > 0 and lex[1] == lex[2] == 0
    with pytest.raises(InputError, match="unknown probe extras"):
        design(heads, positions, ["nope"])
    with pytest.raises(InputError, match="do not match 3 sentence positions"):
        design(heads, positions[:3], ["first"])


def synthetic(n_questions=30, n_sent=12, seed=0):
    """Head 1 carries the label (plus noise); heads 0 and 2 are noise."""
    rng = np.random.default_rng(seed)
    out = []
    for q in range(n_questions):
        labels = np.zeros(n_sent, bool)
        labels[rng.choice(n_sent, 2, replace=False)] = True
        x = rng.normal(size=(n_sent, 3))
        x[:, 1] += 3.0 * labels
        out.append(ProbeExample(f"q{q}", x, [(k // 4, k % 4) for k in range(n_sent)], labels))
    return out


def test_train_probe_finds_the_informative_head_and_round_trips(tmp_path):
    heads = [(0, 0), (0, 1), (1, 0)]
    probe = train_probe(synthetic(), heads, extras=["first"], l2=1.0)
    assert probe.heads == ["0-0", "0-1", "1-0"] and probe.extras == ["first"]
    assert int(np.argmax(np.abs(probe.weights))) == 1 and probe.weights[1] > 0
    test = synthetic(10, seed=1)
    top2 = [set(np.argsort(-probe.score(ex.head_scores, ex.positions))[:2]) for ex in test]
    hits = np.mean([len(t & set(np.flatnonzero(ex.labels))) / 2 for t, ex in zip(top2, test)])
    assert hits > 0.8
    probe.save("org/model", "abc", root=tmp_path)
    back = SentenceProbe.load("org/model", "abc", root=tmp_path)
    np.testing.assert_allclose(back.weights, probe.weights)
    assert back.head_pairs == heads and back.bias == probe.bias
    with pytest.raises(InputError, match="no sentence probe in the head registry"):
        SentenceProbe.load("org/model", "other-weights", root=tmp_path)
    held = crossfit_scores(synthetic(), heads, folds=3, extras=["first"], l2=1.0)
    assert sorted(held) == sorted(ex.qid for ex in synthetic()) and all(len(v) == 12 for v in held.values())
    # a grid: the penalty is chosen inside each training part; an absurd penalty loses
    assert select_l2(synthetic(), heads, [1.0, 1e6], extras=["first"]) == 1.0
    grid = crossfit_scores(synthetic(), heads, folds=3, extras=["first"], l2=[1.0, 1e6])
    np.testing.assert_allclose(grid["q0"], held["q0"])


def test_heads_given_in_another_order_train_the_same_probe():
    """The probe's heads are kept sorted and the pruner scores them in that order: columns given in
    another order were fitted as given, so each weight went to another head."""
    import dataclasses

    heads = [(0, 0), (0, 1), (1, 0)]
    sorted_probe = train_probe(synthetic(), heads, extras=["first"], l2=1.0)
    reversed_examples = [dataclasses.replace(ex, head_scores=ex.head_scores[:, ::-1]) for ex in synthetic()]
    probe = train_probe(reversed_examples, heads[::-1], extras=["first"], l2=1.0)
    assert probe.heads == sorted_probe.heads == ["0-0", "0-1", "1-0"]
    np.testing.assert_allclose(probe.weights, sorted_probe.weights, rtol=1e-6)
    with pytest.raises(InputError, match="repeat a head"):
        train_probe(synthetic(), [(0, 0), (0, 0), (1, 0)], extras=["first"])


def test_held_out_scores_do_not_depend_on_the_order_heads_are_given_in():
    """crossfit_scores and select_l2 scored each held-out question with its head columns as given,
    while the probe's weights follow its sorted heads: given in another order, each weight read
    another head (held-out AP 1.00 in one order, 0.39 in the other)."""
    import dataclasses

    heads = [(0, 0), (0, 1), (1, 0)]
    shuffled = [2, 0, 1]
    other = [dataclasses.replace(ex, head_scores=ex.head_scores[:, shuffled]) for ex in synthetic()]
    kw = dict(folds=3, extras=["first"])
    as_given = crossfit_scores(synthetic(), heads, l2=1.0, **kw)
    reordered = crossfit_scores(other, [heads[i] for i in shuffled], l2=1.0, **kw)
    for ex in synthetic():
        np.testing.assert_allclose(reordered[ex.qid], as_given[ex.qid], rtol=1e-6)
    ap = np.mean([average_precision(as_given[ex.qid], ex.labels) for ex in synthetic()])
    assert ap > 0.9  # head 1 carries the labels
    grid = [0.01, 100.0]
    assert select_l2(other, [heads[i] for i in shuffled], grid, **kw) == select_l2(synthetic(), heads, grid, **kw)


def test_probe_folds_are_checked_before_anything_is_fitted():
    with pytest.raises(
        InputError, match="folds=0 needs a whole number 2 <= folds <= 30"
    ):  # before: returned the first l2
        select_l2(synthetic(), [(0, 0), (0, 1), (1, 0)], [1.0, 10.0], folds=0)
    # before: the inner 3-fold search failed on a 2-question training part with "no training questions"
    with pytest.raises(InputError, match="3-fold cross-validation inside each training part.* leave 2 to train on"):
        crossfit_scores(synthetic(3), [(0, 0), (0, 1), (1, 0)], folds=3, l2=[1.0, 10.0], extras=["first"])


def test_a_stored_probe_with_unsorted_heads_is_refused():
    """The pruner reads the heads' scores sorted; weights stored for another order scored other heads."""
    data = train_probe(synthetic(), [(0, 0), (0, 1), (1, 0)], extras=["first"]).to_json()
    assert SentenceProbe.from_json(data).heads == ["0-0", "0-1", "1-0"]
    with pytest.raises(InputError, match=r"heads \['1-0', '0-0', '0-1'\] are not each once in \(layer, head\) order"):
        SentenceProbe.from_json({**data, "heads": ["1-0", "0-0", "0-1"]})
    # given as probe= (no stored file): its weights were applied to the sorted heads, another's each
    with pytest.raises(InputError, match=r"are not each once in \(layer, head\) order"):
        SentenceProbe(np.array([1.0, -1.0]), 0.0, ["1-3", "0-0"], [])


def test_an_instruction_spelt_otherwise_is_the_same_capture(caplog):
    """ "QA" builds the prompt "qa" builds; the probe warned it was applied otherwise. (" qa " is no
    built-in's name to the prompt, which then holds the text "qa": that one is warned of.)"""
    from attnrank.prune.config import PruneConfig
    from attnrank.prune.probe import probe_capture

    probe = train_probe(synthetic(), [(0, 0), (0, 1), (1, 0)], extras=["first"])
    with caplog.at_level("WARNING", logger="attnrank"):
        probe.warn_if_applied_otherwise(probe_capture(PruneConfig(instruction="QA")))
    assert "does not score as it measured" not in caplog.text
    with caplog.at_level("WARNING", logger="attnrank"):
        probe.warn_if_applied_otherwise(probe_capture(PruneConfig(instruction=" qa ")))
    assert "does not score as it measured" in caplog.text
    assert (
        probe_capture(PruneConfig(instruction="Which sentences answer it?"))["instruction"]
        == "Which sentences answer it?"
    )


def test_average_precision():
    assert average_precision(np.array([0.9, 0.1, 0.5]), np.array([1, 0, 1])) == 1.0
    assert average_precision(np.array([0.1, 0.9, 0.5]), np.array([1, 0, 0])) == pytest.approx(1 / 3)
    assert average_precision(np.array([0.1, 0.9]), np.array([0, 0])) == 0.0


def test_train_probe_bad_input():
    ex = synthetic(2)
    with pytest.raises(InputError, match="no training questions"):
        train_probe([], [(0, 0)])
    with pytest.raises(InputError, match="build every example with the same heads"):
        train_probe(ex, [(0, 0)])
    for e in ex:
        e.labels[:] = False
    with pytest.raises(InputError, match="same label"):
        train_probe(ex, [(0, 0), (0, 1), (1, 0)])
    with pytest.raises(InputError, match="folds=5 needs a whole number 2 <= folds"):
        crossfit_scores(ex, [(0, 0), (0, 1), (1, 0)], folds=5)


def test_labels_must_line_up_with_sentences():
    """One question a label short and another a label long used to train silently misaligned."""
    heads = [(0, 0), (0, 1), (1, 0)]
    ex = synthetic(4)
    ex[0].labels, ex[1].labels = ex[0].labels[:-1], np.append(ex[1].labels, True)
    with pytest.raises(InputError, match="question 'q0': 11 labels for 12 sentences"):
        train_probe(ex, heads)


def test_crossfit_refuses_a_repeated_question_id():
    """Scores are keyed by qid: a repeat was overwritten (one question's score lost) and could
    be trained on while scored."""
    ex = synthetic(6)
    ex[3].qid = "q1"
    with pytest.raises(InputError, match="query id 'q1' is in two examples; give each query its own id"):
        crossfit_scores(ex, [(0, 0), (0, 1), (1, 0)], folds=3, extras=["first"], l2=1.0)


def test_pruner_features_equal_the_per_head_reference(llm):
    heads = [(0, 1), (2, 3)]
    scored, feats = ContextPruner(llm, heads).sentence_features(QUERY, DOCS)
    assert feats.shape == (len(scored), 2)
    np.testing.assert_allclose(feats.sum(1), [s.score for s in scored], atol=1e-9)
    for h, head in enumerate(heads):
        ref = reference(llm, QUERY, DOCS, heads=[head])
        np.testing.assert_allclose(feats[:, h], list(ref.values()), atol=1e-6)


def test_probe_method_scores_with_the_probe(llm, tmp_path, monkeypatch):
    heads = [(0, 1), (2, 3)]
    scored, feats = ContextPruner(llm, heads).sentence_features(QUERY, DOCS)
    positions = [(s.doc_index, s.sentence_index) for s in scored]
    probe = SentenceProbe(np.array([1.0, -0.5, 0.3, 0.2, -0.2, 0.2, 0.1, 0.4]), 0.0, ["0-1", "2-3"], list(EXTRAS))
    pruner = ContextPruner(llm, "all", method="probe", probe=probe)  # the probe's heads win
    assert pruner.heads == heads
    got = pruner.score_sentences(QUERY, DOCS)
    lexical = lexical_scores(QUERY, [s.text for s in scored])
    np.testing.assert_allclose([s.score for s in got], probe.score(feats, positions, lexical), atol=1e-9)
    pruned = pruner.prune(QUERY, DOCS, keep_ratio=0.4)
    assert pruned.method == "probe" and 0 < pruned.kept_tokens <= pruned.budget_tokens
    monkeypatch.setenv("ATTNRANK_HOME", str(tmp_path))
    with pytest.raises(InputError, match="no sentence probe in the head registry"):
        ContextPruner(llm, method="probe")
    probe.save(llm.model_id, llm.fingerprint)
    assert ContextPruner(llm, method="probe").probe.heads == probe.heads


def test_pruner_auto_heads_from_the_registry(llm, tmp_path, monkeypatch):
    from attnrank.registry_save import save_head_set

    monkeypatch.setenv("ATTNRANK_HOME", str(tmp_path))
    save_head_set(llm.model_id, llm.fingerprint, "qr-ndcg", [(1, 2), (0, 3)])
    assert ContextPruner(llm, "auto").heads == [(0, 3), (1, 2)]  # capture order
    # "auto-or-all" as the reranker reads it (it reached the registry lookup after the load and failed)
    assert ContextPruner(llm, "auto-or-all").heads == [(0, 3), (1, 2)]
    monkeypatch.setenv("ATTNRANK_HOME", str(tmp_path / "empty"))
    assert ContextPruner(llm, "auto-or-all").heads is None  # none registered: every head, with a warning


def test_probe_settings_that_would_be_ignored_are_refused(llm):
    """The probe fixes heads and length normalisation: other values were replaced without a word,
    and a probe given with method='query' was dropped."""
    from attnrank.prune.config import PruneConfig

    with pytest.raises(InputError, match="heads='3-4' would be ignored"):
        PruneConfig(method="probe", heads="3-4")
    with pytest.raises(InputError, match="length_norm='none' would be ignored"):
        PruneConfig(method="probe", length_norm="none")
    with pytest.raises(InputError, match="token_filter=True would be ignored"):  # the probe reads unfiltered scores
        PruneConfig(method="probe", token_filter=True)
    for method in ("probe", "query"):  # only focus reads its hint
        with pytest.raises(InputError, match=f"focus_hint='zzz' is read by method='focus' only, not '{method}'"):
            PruneConfig(method=method, focus_hint="zzz")
    assert PruneConfig(method="focus", focus_hint="zzz").focus_hint == "zzz"
    assert PruneConfig(method="probe", heads=None).method == "probe"
    probe = SentenceProbe(np.zeros(8), 0.0, ["0-1", "2-3"], list(EXTRAS))
    with pytest.raises(InputError, match="a probe was given, but method='query' reads none"):
        ContextPruner(llm, probe=probe)


def test_a_probe_read_otherwise_than_it_was_trained_warns(llm, caplog):
    """The probe recorded nothing of how its features were captured: a pruner in block attention,
    or without calibration, fed it features of another scale without a word."""
    import logging

    from attnrank.prune.probe import DEFAULT_CAPTURE, train_probe

    probe = SentenceProbe(np.zeros(8), 0.0, ["0-1", "2-3"], list(EXTRAS))  # records none: the defaults
    with caplog.at_level(logging.WARNING, logger="attnrank.prune.probe"):
        ContextPruner(llm, method="probe", probe=probe)
        assert "sentence probe was trained" not in caplog.text
        ContextPruner(llm, method="probe", probe=probe, attention="block", calibrate=False)
    assert "calibrate=True" in caplog.text and "attention='block:rotated'" in caplog.text
    trained = train_probe(synthetic(), [(0, 0), (0, 1), (1, 0)], extras=["first"], l2=1.0)
    assert trained.capture == DEFAULT_CAPTURE
    import json

    assert SentenceProbe.from_json(json.loads(json.dumps(trained.to_json()))).capture == DEFAULT_CAPTURE
    with pytest.raises(InputError, match="stored sentence probe is malformed .capture 'full' is not an object"):
        SentenceProbe.from_json({**trained.to_json(), "capture": "full"})


def test_a_probe_of_an_unknown_length_norm_is_refused():
    """The pruner reads anything but "sqrt" as no normalisation: a probe saved with "SQRT" scored
    features sqrt(n_tokens) times those it was trained on, silently."""
    import numpy as np

    from attnrank.errors import InputError
    from attnrank.prune.probe import SentenceProbe

    with pytest.raises(InputError, match="length_norm='SQRT' is not one of"):
        SentenceProbe(np.zeros(1), 0.0, ["0-1"], [], "SQRT")
    assert SentenceProbe(np.zeros(1), 0.0, ["0-1"], [], "none").length_norm == "none"


def test_a_probe_is_checked_when_made_or_loaded_not_at_its_first_prune():
    """NaN weights scored every sentence NaN; a weight count or extras that do not match its
    features, and weights that are not numbers, were found at the first prune after the model
    had loaded (or as a ValueError traceback)."""
    with pytest.raises(InputError, match=r"not 2 finite numbers"):
        SentenceProbe(np.array([np.nan, 1.0]), 0.0, ["0-1", "2-3"], [])
    with pytest.raises(InputError, match=r"not 2 finite numbers"):
        SentenceProbe(np.zeros(3), 0.0, ["0-1", "2-3"], [])
    with pytest.raises(InputError, match=r"extras \['bogus'\] are unknown"):
        SentenceProbe(np.zeros(3), 0.0, ["0-1", "2-3"], ["bogus"])
    good = SentenceProbe(np.zeros(8), 0.0, ["0-1", "2-3"], list(EXTRAS))  # 2 heads, 2 per-head passage, 4 more
    data = {**good.to_json(), "weights": ["x", 1]}
    with pytest.raises(InputError, match="stored sentence probe is malformed"):
        SentenceProbe.from_json(data)


def test_a_non_finite_head_score_is_refused_not_zeroed():
    """Standardising zeroed a column holding NaN: every sentence tied, without a word."""
    probe = SentenceProbe(np.array([1.0, 1.0]), 0.0, ["0-1", "2-3"], [])
    with pytest.raises(InputError, match=r"head score nan \(sentence 1, head column 0\) is not finite"):
        probe.score(np.array([[1.0, 5.0], [np.nan, 0.0], [3.0, 1.0]]), [(0, 0), (0, 1), (0, 2)])
