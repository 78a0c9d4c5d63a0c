"""Document scores from windows' attention rows: ICR's sum per window, merged by input index."""

import numpy as np

from attnrank.llm.rows import WindowRows, document_scores, token_scores
from attnrank.rerank.aggregation import window_document_scores
from attnrank.rerank.reweight import Reweighting


class _Tokens:
    """Token strings of ids: enough of a tokenizer for the re-weighting's term reading."""

    def convert_ids_to_tokens(self, ids):
        return [f"Ġw{i}" for i in ids]

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [int(w[1:]) for w in text.split()]}


def _window(rng, doc_index, lengths):
    spans, start = [], 0
    for n in lengths:
        spans.append((start, start + n))
        start += n
    real = rng.random((3, start))
    return WindowRows(
        doc_index, spans, list(range(start)), real / real.sum(1, keepdims=True), rng.random((3, start)) / start
    )


def test_windows_scores_land_at_their_documents_input_indices():
    rng = np.random.default_rng(0)
    wins = [_window(rng, [0, 2], [4, 6]), _window(rng, [1, 3, 4], [5, 3, 7])]
    scores, ev = window_document_scores(wins, 5)
    for w in wins:  # each window scored on its own, nothing normalised across windows
        np.testing.assert_array_equal(scores[w.doc_index], document_scores(token_scores(w.rows), w.spans))
    assert ev is None


def test_evidence_holds_each_documents_plain_token_scores_and_the_filter():
    rng = np.random.default_rng(1)
    w = _window(rng, [1, 0], [12, 9])
    _, ev = window_document_scores([w], 2, evidence=True, token_filter=True)
    tok = token_scores(w.rows)
    assert [t for t, _ in ev[0]["attention_tokens"]] == w.input_ids[12:21]
    np.testing.assert_allclose([s for _, s in ev[1]["attention_tokens"]], tok[:12], atol=1e-6)
    assert len(ev[1]["attention_counted"]) == 12
    _, unfiltered = window_document_scores([w], 2, evidence=True, token_filter=False)
    assert all(unfiltered[1]["attention_counted"])


def test_reweighting_with_every_step_off_equals_the_plain_sum_and_a_step_changes_it():
    rng = np.random.default_rng(2)
    wins = [_window(rng, [0, 1, 2], [6, 5, 8])]
    plain, _ = window_document_scores(wins, 3)
    off, _ = window_document_scores(wins, 3, reweighting=(_Tokens(), "w1 w7", Reweighting(), None))
    np.testing.assert_allclose(off, plain, atol=1e-12)
    sink, _ = window_document_scores(wins, 3, reweighting=(_Tokens(), "w1 w7", Reweighting(sink=True), None))
    assert not np.allclose(sink, plain)
