"""Measuring a model's per-slot attention profile (Attention Basin / AttnRank, Yi et al.,
arXiv 2508.05128; our reconstruction — see :mod:`attnrank.rerank.position` for the profile
itself, how it is applied and stored)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timezone

import numpy as np

from ..errors import InputError
from ..types import Document, is_count
from .attention import AttentionReranker
from .position import SlotProfile, prompt_slots
from .reweight import Reweighting, heads_label, reweighted_document_scores
from .terms import tokenized_query_terms

logger = logging.getLogger(__name__)

# Generic questions about no particular content. Not the calibration query "N/A": its
# calibrated scores (real − null) would be exactly 0.
PROFILE_QUERIES = (
    "What is this about?",
    "Which paragraph is relevant?",
    "Tell me more.",
    "What does the text say?",
)


def measure_slot_profile(
    reranker: AttentionReranker,
    docs_pool: Sequence[Document],
    *,
    n_slots: int,
    n_trials: int,
    seed: int = 0,
    queries: str | Sequence[str] = PROFILE_QUERIES,
) -> SlotProfile:
    """Measure the model's per-slot score profile with ``reranker`` (its heads, calibration and
    re-weighting, minus slot correction): with ``calibrate=False`` and no token filter, the raw
    attention each slot receives (the basin :func:`~attnrank.rerank.position.reorder_for_generation`
    reads); calibrated, the residual bias that slot correction removes.

    Each trial puts ``n_slots`` distinct documents drawn at random (``seed``) from ``docs_pool``
    into one prompt with a content-free query (cycled from ``queries``) and records the score of
    the document at each slot.
    """
    queries = [queries] if isinstance(queries, str) else list(queries)
    if not is_count(n_slots) or n_slots > len(docs_pool):
        raise InputError(
            f"n_slots={n_slots!r} must be a whole number in 1..{len(docs_pool)} (the pool size); lower n_slots or give more documents"
        )
    if not is_count(n_trials):
        raise InputError(f"n_trials={n_trials!r} must be a whole number >= 1")
    if not queries or (reranker.calibrate and any(q.strip() == "N/A" for q in queries)):
        raise InputError(
            f"queries={queries!r} must be non-empty and not the calibration query 'N/A' "
            "(its calibrated scores are all 0); use generic questions"
        )
    cfg = replace(reranker.reweight or Reweighting(), slot_correction=False)
    rng = np.random.default_rng(seed)
    table = np.empty((n_trials, n_slots))
    for t in range(n_trials):
        docs = [docs_pool[i] for i in rng.choice(len(docs_pool), n_slots, replace=False)]
        query = queries[t % len(queries)]
        windows = reranker.windows(query, docs)
        if len(windows) != 1:
            raise InputError(
                f"{n_slots} documents do not fit one prompt of max_prompt_tokens="
                f"{reranker.max_prompt_tokens}; lower n_slots or max_doc_words"
            )
        w = windows[0]
        tokens = reranker.llm.tokenizer.convert_ids_to_tokens(w.input_ids)
        terms = tokenized_query_terms(reranker.llm.tokenizer, query, cfg.idf_unit)
        scores = reweighted_document_scores(w, tokens, terms, cfg, use_filter=reranker.token_filter)
        table[t, prompt_slots(w.spans)] = scores
        logger.debug("slot profile trial %d/%d: %s", t + 1, n_trials, np.round(table[t], 6).tolist())
    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return SlotProfile(
        n_slots,
        tuple(table.mean(0)),
        tuple(table.std(0)),
        reranker.llm.model_id,
        reranker.llm.fingerprint,
        n_trials,
        date,
        reranker.llm.adapter,
        calibrated=bool(reranker.calibrate),
        heads=heads_label(reranker.heads),
    )
