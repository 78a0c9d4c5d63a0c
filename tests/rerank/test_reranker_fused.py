"""AttentionReranker with ``signals``: attention fused with the candidates' first-stage signals."""

from __future__ import annotations

import numpy as np
import pytest
from _tiny import RERANK_QUERY, rerank_docs

from attnrank.errors import InputError
from attnrank.rerank.attention import AttentionReranker
from attnrank.rerank.config import RerankConfig
from attnrank.rerank.fused import FusedWeights
from attnrank.rerank.signals import SignalComputer

FUSED = FusedWeights(["attention", "bm25", "dense", "rank"], [0.8, 0.3, 1.2, 0.2], base_weights=[0.3, 1.2, 0.2])


def test_fused_scores_equal_the_weights_over_attention_and_signals(llm):
    docs = rerank_docs()
    plain = AttentionReranker(llm, None, signals=None)
    fused = AttentionReranker(llm, None, signals=FUSED)
    att = plain.score(RERANK_QUERY, docs)
    signals = SignalComputer()(RERANK_QUERY, [d.full_text for d in docs], ["bm25", "dense", "rank"])
    expected = FUSED.score({"attention": att, **signals})
    np.testing.assert_allclose(fused.score(RERANK_QUERY, docs), expected, rtol=1e-9, atol=1e-12)
    res = fused.rank(RERANK_QUERY, docs)
    assert [d.id for d in res.results] == [docs[i].id for i in np.argsort(-expected, kind="stable")]
    assert "signals=fused" in repr(fused)


def test_gate_uses_the_first_stage_signals_alone_where_attention_is_flat(llm):
    docs = rerank_docs()
    always_base = FusedWeights(FUSED.features, FUSED.weights, base_weights=FUSED.base_weights, gate=1e9)
    rr = AttentionReranker(llm, None, signals=always_base)
    signals = SignalComputer()(RERANK_QUERY, [d.full_text for d in docs], ["bm25", "dense", "rank"])
    base = FusedWeights(["bm25", "dense", "rank"], FUSED.base_weights).score(signals)
    np.testing.assert_allclose(rr.score(RERANK_QUERY, docs), base, rtol=1e-9)


def test_fused_preset_and_bad_signals_value():
    assert RerankConfig.preset("fused").signals == "auto"
    assert RerankConfig.preset("qrhead").signals is None
    with pytest.raises(InputError, match="signals='bm25'"):
        RerankConfig(signals="bm25")


@pytest.mark.parametrize("family", ["qwen2", "mistral", "gemma"])
def test_default_preset_fuses_with_any_causal_lm(family, caplog):
    from _tiny import tiny_model, tiny_tokenizer

    from attnrank.llm.models import LLM

    llm = LLM(
        model=tiny_model(family, max_positions=4096),
        tokenizer=tiny_tokenizer(),
        model_id=f"tiny-{family}",
        fingerprint="t" * 64,
    )
    res = AttentionReranker(llm).rank(RERANK_QUERY, rerank_docs())  # default preset: fused, shipped weights
    assert res.stage == "fused" and len(res) == 4
    assert all(np.isfinite(d.score) and "attention" in d.stage_scores for d in res)
    assert "no fused weights are registered" in caplog.text  # the fallback to the packaged weights is said


def test_an_empty_list_carries_the_fused_stage(llm):
    """An empty candidate list is named as a non-empty one would be (it said "attention")."""
    assert AttentionReranker(llm, None, signals=FUSED).rank(RERANK_QUERY, []).stage == "fused"
    assert AttentionReranker(llm, None, signals=None).rank(RERANK_QUERY, []).stage == "attention"


def test_the_reranker_computes_dense_with_the_weights_embedder(llm):
    from dataclasses import replace

    mine = replace(FUSED, embedder="/models/my-embedder")
    assert AttentionReranker(llm, None, signals=mine).signals.embedder_name == "/models/my-embedder"
    assert AttentionReranker(llm, None, signals=FUSED).signals.embedder_name is None
