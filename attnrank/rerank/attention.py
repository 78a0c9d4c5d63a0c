"""In-context attention reranking (ICR, Chen et al. ICLR 2025; QRHead, Zhang et al. EMNLP 2025).

All candidates and the query go into one prompt (see :mod:`attnrank.llm.prompts`). The context
(everything up to the late instruction) is prefilled once; the query suffix and the
content-free "N/A" suffix then each run over that cached context, capturing only the chosen
heads' attention rows for the query span, and only up to the deepest chosen layer (see
:mod:`attnrank.llm.attention`). Calibrated token scores ``Δ = a(q) − a(N/A)`` are summed over
heads and aggregated per document with ICR's μ − 2σ filter (:mod:`attnrank.rerank.scoring`).

Long candidate lists: if the prompt would exceed ``max_prompt_tokens`` (default: the model's
context length minus a margin), the candidates are dealt round-robin by first-stage rank into
the fewest windows that fit, so every window holds a similar mix of strong and weak
candidates and a similar number of documents; each window is scored on its own and the raw
calibrated scores (shares of the same query-attention budget) are merged as they are. ICR
reports that windowing loses quality, so it is a fallback, logged when used.

Optional re-weighting (``reweight=``: sink filtering, cross-document IDF, entropy
regularization, slot correction) replaces the plain aggregation; see
:mod:`attnrank.rerank.reweight` and :mod:`attnrank.rerank.position`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from ..errors import InputError
from ..heads.spec import HeadsArg, format_heads, parse_heads
from ..llm.attention import AttentionCapturer
from ..llm.models import LLM, load_llm
from ..llm.prompts import DEFAULT_MAX_DOC_WORDS, RerankPromptPair, build_rerank_prompts
from ..types import Document, RankedResults, ScoredDocument, rank_documents
from .position import SlotProfile, load_profile
from .reweight import Reweighting, check_setup, reweighted_document_scores, tokenized_query_terms
from .scoring import document_scores, token_scores

logger = logging.getLogger(__name__)

QUERY_SPANS = ("full", "last")


@dataclass
class WindowRows:
    """Raw material of one scored window: per-head attention rows over its context tokens.

    ``real[h, j]`` / ``null[h, j]``: attention of the query span (real query / "N/A") from head
    ``h`` (in :attr:`AttentionReranker.head_list` order) to context token ``j``, averaged over
    the span's tokens. ``null`` is None without calibration.
    """

    doc_index: list[int]  # input indices of the window's documents
    spans: list[tuple[int, int]]  # their token spans in the context (same order as doc_index)
    input_ids: list[int]  # the context tokens
    real: np.ndarray
    null: np.ndarray | None = None

    @property
    def rows(self) -> np.ndarray:
        """Calibrated rows ``real − null`` (ICR's Δ per head), or ``real`` without calibration."""
        return self.real if self.null is None else self.real - self.null


def _as_documents(docs) -> tuple[list[Document], list[ScoredDocument] | None]:
    if isinstance(docs, RankedResults):
        docs = docs.results
    docs = list(docs)
    if docs and all(isinstance(d, ScoredDocument) for d in docs):
        return [d.document for d in docs], docs
    out = []
    for i, d in enumerate(docs):
        if isinstance(d, Document):
            out.append(d)
        elif isinstance(d, str):
            out.append(Document(str(i), d))
        elif isinstance(d, ScoredDocument):
            out.append(d.document)
        else:
            raise InputError(f"document #{i} is a {type(d).__name__}; pass Document, ScoredDocument or str")
    return out, None


def _stage_scores(previous: list[ScoredDocument] | None) -> dict[str, list[float]] | None:
    """Each earlier stage's scores over the candidates (NaN where a candidate has none); a stage
    that scored none of them is left out, so weights that need it fail with a clear error."""
    if previous is None:
        return None
    names = dict.fromkeys(n for d in previous for n in d.stage_scores)
    return {n: [d.stage_scores.get(n, float("nan")) for d in previous] for n in names}


class AttentionReranker:
    """Rerank passages by the attention a query pays them, read from selected heads.

    ``heads``: None/"all" (ICR: every head), a list of (layer, head) pairs, "l-h,l-h" text, or a
    JSON file (QRHead). ``calibrate``: subtract the content-free "N/A" query's attention.
    ``query_span``: "full" (instruction through chat suffix, as ICR/QRHead) or "last" (only the
    last token: ICR's attention-sorting ablation). ``token_filter``: ICR's μ − 2σ filter.
    ``reweight``: re-weighting steps (:class:`~attnrank.rerank.reweight.Reweighting`; None =
    plain ICR aggregation); ``slot_profile``: the profile (or its JSON path, or ``"auto"``: the
    model's registered profile with the most slots) that ``reweight.slot_correction`` needs. Evidence tokens always hold the plain calibrated scores.
    ``heads="auto"`` / ``"auto:METHOD"``: the model's registered set (:mod:`attnrank.heads.registry`).
    ``scorer``: "sum" (default), "learned" (the model's registered linear head weights,
    :mod:`attnrank.rerank.learned`; they fix heads, calibration and filter) or a
    :class:`~attnrank.rerank.learned.LearnedHeadWeights`.
    """

    def __init__(self, model: str | LLM | None = None, heads: HeadsArg = None, *, calibrate: bool = True,
                 query_span: str = "full", token_filter: bool = True, instruction: str = "ie",
                 order: str = "reverse", max_doc_words: int | None = DEFAULT_MAX_DOC_WORDS,
                 max_doc_tokens: int | None = None, max_prompt_tokens: int | None = None,
                 dtype: str = "auto", device: str = "cpu", show_progress: bool = False,
                 reweight: Reweighting | None = None, slot_profile: SlotProfile | str | Path | None = None,
                 scorer: Any = "sum"):
        if query_span not in QUERY_SPANS:
            raise InputError(f"query_span={query_span!r} is not one of {QUERY_SPANS}")
        self.llm = model if isinstance(model, LLM) else load_llm(model, dtype=dtype, device=device)
        self.learned = self._learned_weights(scorer, heads)
        if self.learned is not None:  # the weights fix the heads, calibration and filter
            heads, calibrate, token_filter = self.learned.heads, self.learned.config.calibrate, self.learned.config.use_filter
        elif isinstance(heads, str) and heads.strip().lower().startswith("auto"):
            from ..heads.registry import resolve_heads

            heads = resolve_heads(heads, self.llm)
        self.heads = parse_heads(heads)
        self.capturer = AttentionCapturer(self.llm.model, self.heads)
        self.calibrate, self.query_span, self.token_filter = calibrate, query_span, token_filter
        self.prompt_kw = dict(instruction=instruction, order=order, max_doc_words=max_doc_words,
                              max_doc_tokens=max_doc_tokens)
        context = int(getattr(self.llm.model.config.get_text_config(), "max_position_embeddings", 0) or 4096)
        self.max_prompt_tokens = max_prompt_tokens or context - 64
        self.show_progress = show_progress
        self.reweight = reweight
        self.slot_profile = None if slot_profile is None else load_profile(
            slot_profile, self.llm.model_id, self.llm.fingerprint)
        check_setup(reweight, self.slot_profile, self.llm.model_id, self.llm.fingerprint)

    def _learned_weights(self, scorer: Any, heads: HeadsArg):
        """``scorer``: "sum" (ICR/QRHead head sum), "learned" (the model's registered
        :class:`~attnrank.rerank.learned.LearnedHeadWeights`) or such an object."""
        from .learned import LearnedHeadWeights

        if isinstance(scorer, str) and scorer == "sum":
            return None
        if heads is not None:
            raise InputError(f"scorer={scorer!r} reads the heads its weights were trained on; drop heads={heads!r}")
        if isinstance(scorer, LearnedHeadWeights):
            return scorer
        if scorer == "learned":
            return LearnedHeadWeights.load(self.llm.model_id, self.llm.fingerprint)
        raise InputError(f"scorer={scorer!r} is not 'sum', 'learned' or a LearnedHeadWeights")

    @property
    def head_list(self) -> list[tuple[int, int]]:
        return list(self.capturer.heads)

    def __repr__(self) -> str:
        heads = "all" if self.heads is None else format_heads(self.heads)
        return f"AttentionReranker(model={self.llm.model_id!r}, heads={heads}, calibrate={self.calibrate})"

    # -- public API --------------------------------------------------------------------------
    def rank(self, query: str, docs: Sequence[Document | ScoredDocument | str] | RankedResults, k: int | None = None,
             *, query_id: str | None = None, return_evidence: bool = False) -> RankedResults:
        """Rerank ``docs`` (first-stage order) for ``query``; the best ``k`` (all if None)."""
        documents, previous = _as_documents(docs)
        if query_id is None and isinstance(docs, RankedResults):
            query_id = docs.query_id
        if not documents:
            return RankedResults(query, [], query_id, stage="attention")
        scores, evidence = self._score(query, documents, return_evidence, previous)
        res = rank_documents(query, documents, scores, stage="attention", query_id=query_id,
                             previous=previous, evidence=evidence)
        return res if k is None else res.top_k(k)

    def rank_batch(self, queries: Sequence[str], docs_per_query: Sequence[Sequence[Any]], k: int | None = None,
                   *, query_ids: Sequence[str] | None = None) -> list[RankedResults]:
        if len(queries) != len(docs_per_query):
            raise InputError(f"{len(queries)} queries but {len(docs_per_query)} document lists; give one list per query")
        it = range(len(queries))
        if self.show_progress:
            from tqdm.auto import tqdm

            it = tqdm(it, desc="rerank", unit="q")
        return [self.rank(queries[i], docs_per_query[i], k, query_id=None if query_ids is None else query_ids[i])
                for i in it]

    def score(self, query: str, docs: Sequence[Document | str]) -> np.ndarray:
        """Calibrated attention score of each document, in input order."""
        documents, _ = _as_documents(docs)
        return self._score(query, documents, False)[0]

    # -- internals ---------------------------------------------------------------------------
    def _score(self, query: str, docs: list[Document], evidence: bool, previous: list[ScoredDocument] | None = None):
        if self.learned is not None:  # linear head weighting (attnrank.rerank.learned)
            wins = self.windows(query, docs)
            first_stage = None if previous is None else [d.score for d in previous]
            return self.learned.score_windows(wins, len(docs), self.head_list, first_stage,
                                              _stage_scores(previous)), None
        scores = np.zeros(len(docs))
        ev: list[dict] | None = [{} for _ in docs] if evidence else None
        for w in self.windows(query, docs):
            tok = token_scores(w.rows)
            if self.reweight is None:
                doc_s = document_scores(tok, w.spans, use_filter=self.token_filter)
            else:
                doc_s = self._reweighted_scores(query, w)
            for j, (i, (s, e)) in enumerate(zip(w.doc_index, w.spans)):
                scores[i] = doc_s[j]
                if ev is not None:
                    ev[i]["attention_tokens"] = list(zip(w.input_ids[s:e], tok[s:e].round(6).tolist()))
        return scores, ev

    def _reweighted_scores(self, query: str, w: WindowRows) -> np.ndarray:
        assert self.reweight is not None
        tokens = self.llm.tokenizer.convert_ids_to_tokens(w.input_ids)
        terms = tokenized_query_terms(self.llm.tokenizer, query, self.reweight.idf_unit)
        return reweighted_document_scores(w, tokens, terms, self.reweight, use_filter=self.token_filter,
                                          slot_profile=self.slot_profile)

    def windows(self, query: str, docs: list[Document]) -> list[WindowRows]:
        """Score ``docs`` window by window; returns the per-head rows (features for learned scorers)."""
        if not isinstance(query, str) or not query.strip():
            raise InputError(f"query {query!r} is empty; give a non-empty query text")
        pair = build_rerank_prompts(self.llm.tokenizer, query, docs, **self.prompt_kw)
        n_windows = 1
        if len(pair.real.input_ids) > self.max_prompt_tokens:
            n_windows = math.ceil(len(pair.real.input_ids) / self.max_prompt_tokens)
            while n_windows <= len(docs):
                groups = [list(range(w, len(docs), n_windows)) for w in range(n_windows)]
                pairs = [build_rerank_prompts(self.llm.tokenizer, query, [docs[i] for i in g], **self.prompt_kw)
                         for g in groups]
                if max(len(p.real.input_ids) for p in pairs) <= self.max_prompt_tokens:
                    logger.info("prompt of %d tokens > %d: scored in %d round-robin windows",
                                len(pair.real.input_ids), self.max_prompt_tokens, n_windows)
                    return [self._window(p, g) for p, g in zip(pairs, groups)]
                n_windows += 1
            raise InputError(f"a single document does not fit max_prompt_tokens={self.max_prompt_tokens}; "
                             "lower max_doc_words/max_doc_tokens or raise max_prompt_tokens")
        return [self._window(pair, list(range(len(docs))))]

    def _window(self, pair: RerankPromptPair, doc_index: list[int]) -> WindowRows:
        dev = self.llm.device
        prefix_ids = torch.tensor([pair.prefix_ids], device=dev)
        P = prefix_ids.shape[1]
        prefix = self.capturer.prefill(prefix_ids)
        real = self._capture(pair.real_suffix_ids, prefix)[:, :P].double().cpu().numpy()
        null = None
        if self.calibrate:
            null = self._capture(pair.calibration_suffix_ids, prefix)[:, :P].double().cpu().numpy()
        return WindowRows(doc_index, pair.doc_spans, pair.prefix_ids, real, null)

    def _capture(self, suffix: list[int], prefix) -> torch.Tensor:
        start = len(suffix) - 1 if self.query_span == "last" else 0
        ids = torch.tensor([suffix], device=self.llm.device)
        return self.capturer.capture(ids, prefix=prefix, query_start=start)
