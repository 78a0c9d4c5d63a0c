"""In-context attention reranking (ICR, Chen et al. ICLR 2025; QRHead, Zhang et al. EMNLP 2025).

All candidates and the query go into one prompt (see :mod:`attnrank.llm.prompts`). The context
(everything up to the late instruction) is prefilled once; the query suffix and the
content-free "N/A" suffix then run over that cached context in one pass (neither attending to the
other), capturing only the chosen heads' attention rows for the query span, and only up to the
deepest chosen layer (see :mod:`attnrank.llm.attention`). Calibrated token scores
``Δ = a(q) − a(N/A)`` are summed over heads and aggregated per document with ICR's μ − 2σ filter
(:mod:`attnrank.llm.rows`).

Long candidate lists: if the prompt would exceed ``max_prompt_tokens`` (default: the model's
context length minus a margin), the candidates are dealt round-robin by first-stage rank into
the fewest windows that fit, so every window holds a similar mix of strong and weak
candidates and a similar number of documents; each window is scored on its own and the raw
calibrated scores (shares of the same query-attention budget) are merged as they are. ICR
reports that windowing loses quality, so it is a fallback, logged when used. Block attention
(``attention="block"``) windows the same way when its context spans more positions than that:
with ``rotated``/``sequential`` positions the query follows every block.

Optional re-weighting (``reweight=``: sink filtering, cross-document IDF, entropy
regularization, slot correction) replaces the plain aggregation; see
:mod:`attnrank.rerank.reweight` and :mod:`attnrank.rerank.position`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..llm.attention import AttentionCapturer, PrefixCache
from ..llm.blocks import BlockMemo, BlockPrompt, build_block_prompts
from ..llm.capture import capture_block_windows, capture_window
from ..llm.context import ContextBuffer
from ..llm.headspec import HeadsArg, format_heads, parse_heads
from ..llm.models import LLM, load_llm
from ..llm.prompts import RerankPromptPair, build_rerank_prompts
from ..llm.rows import WindowRows, document_scores, token_scores
from ..llm.states import StateCache
from ..llm.statestore import PassageStateStore, write_store
from ..registry import resolve_heads
from ..types import Document, RankedResults, ScoredDocument, as_documents, rank_documents
from .config import AUTO_OR_ALL, SIGNALS_AUTO, SIGNALS_ONLY, RerankConfig
from .fused import ATTENTION, FUSED_STAGE, resolve_fused
from .inputs import check_documents, check_k, check_texts
from .learned import LearnedHeadWeights
from .position import load_profile
from .reweight import check_setup, reweighted_document_scores, tokenized_query_terms
from .signals import SignalComputer
from .windows import fit_windows

logger = logging.getLogger(__name__)

_UNSET: Any = object()  # ``heads`` not given: the configuration's heads


def _stage_scores(previous: list[ScoredDocument] | None) -> dict[str, Sequence[float]] | None:
    """Each earlier stage's scores over the candidates (NaN where a candidate has none); a stage
    that scored none of them is left out, so weights that need it fail with a clear error."""
    if previous is None:
        return None
    names = dict.fromkeys(n for d in previous for n in d.stage_scores)
    return {n: [d.stage_scores.get(n, float("nan")) for d in previous] for n in names}


def _with_stage(
    docs: list[Document], previous: list[ScoredDocument] | None, stage: str, scores: np.ndarray
) -> list[ScoredDocument]:
    """``docs`` (input order) as scored documents carrying ``stage``'s score beside the earlier ones."""
    out = []
    for i, (d, s) in enumerate(zip(docs, scores)):
        prev = previous[i] if previous is not None else None
        out.append(
            ScoredDocument(
                d.id,
                float(s),
                i + 1,
                d.text,
                d.title,
                {**(prev.stage_scores if prev else {}), stage: float(s)},
                dict(prev.evidence) if prev else {},
                d.metadata,
            )
        )
    return out


class AttentionReranker:
    """Rerank passages by the attention a query pays them, read from selected heads.

    Configured by a :class:`~attnrank.rerank.config.RerankConfig`: ``config`` is a preset name
    (default ``"signals"``: the first-stage signals fused without attention; ``"fused"``: the registered
    heads' attention fused with them) or a config
    object, and keyword ``options`` override its fields (``model`` may also be a loaded
    :class:`LLM`). The fields, as the reranker reads them:

    ``heads``: None/"all" (ICR: every head), a list of (layer, head) pairs, "l-h,l-h" text, or a
    JSON file (QRHead). ``calibrate``: subtract the content-free "N/A" query's attention.
    ``query_span``: "full" (instruction through chat suffix, as ICR/QRHead) or "last" (only the
    last token: ICR's attention-sorting ablation). ``token_filter``: ICR's μ − 2σ filter.
    ``reweight``: re-weighting steps (:class:`~attnrank.rerank.reweight.Reweighting`; None =
    plain ICR aggregation); ``slot_profile``: the profile (or its JSON path, or ``"auto"``: the
    model's registered profile with the most slots) that ``reweight.slot_correction`` needs. Evidence tokens always hold the plain calibrated scores.
    ``heads="auto"`` / ``"auto:METHOD"``: the model's registered set (:mod:`attnrank.registry`).
    ``signals``: fuse the attention score with the candidates' BM25, dense cosine and first-stage
    rank (:mod:`attnrank.rerank.fused`; ``"auto"``: the registered fused weights).
    ``scorer``: "sum" (default), "learned" (the model's registered linear head weights,
    :mod:`attnrank.rerank.learned`; they fix heads, calibration and filter) or a
    :class:`~attnrank.rerank.learned.LearnedHeadWeights`.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | LLM | None = None,
        heads: HeadsArg | object = _UNSET,
        *,
        config: RerankConfig | str | None = None,
        show_progress: bool = False,
        **options: Any,
    ):
        if heads is not _UNSET:
            options["heads"] = heads
        if isinstance(model, (str, os.PathLike)):  # a Path is a model folder too
            options["model"] = os.fspath(model)
        if isinstance(config, RerankConfig):
            cfg = config.with_options(**options)
        else:  # the options take part in choosing an unnamed preset (config.preset_for)
            cfg = RerankConfig.preset(config or "", **options)
        self.config = cfg
        self.llm = model if isinstance(model, LLM) else load_llm(cfg.model, dtype=cfg.dtype, device=cfg.device)
        self.learned = self._learned_weights(cfg.scorer)
        signals = SIGNALS_AUTO if cfg.signals == SIGNALS_ONLY else cfg.signals
        self.fused = resolve_fused(signals, self.llm.model_id, self.llm.fingerprint, attention=cfg.uses_attention)
        if self.fused is not None and not cfg.uses_attention:
            self.fused = self.fused.without_attention()
        device = cfg.device if cfg.device != "auto" else "cpu"  # dense cosines: the embedder the weights fit
        self.signals = SignalComputer(self.fused.embedder if self.fused else None, device=device)
        calibrate, token_filter = cfg.calibrate, cfg.token_filter
        if self.learned is not None:  # the weights fix the heads, calibration and filter
            heads = self.learned.heads
            calibrate, token_filter = self.learned.fixed_options(calibrate, token_filter)
        elif not self.uses_attention:  # heads are never read: no registered set needed, none warned of
            heads = None
        else:
            heads = self._resolve_heads(cfg.heads)
        self.heads = parse_heads(heads)
        self.capturer = AttentionCapturer(self.llm.model, self.heads)
        self.calibrate, self.query_span, self.token_filter = calibrate, cfg.query_span, token_filter
        self.prompt_kw: dict[str, Any] = dict(
            instruction=cfg.instruction,
            order=cfg.order,
            max_doc_words=cfg.max_doc_words,
            max_doc_tokens=cfg.max_doc_tokens,
        )
        if (cfg.max_prompt_tokens or 0) > self.llm.context_length:  # past it, positions are untrained
            raise InputError(
                f"max_prompt_tokens={cfg.max_prompt_tokens} exceeds the {self.llm.context_length}-token context "
                f"of {self.llm.model_id}; lower it (None: the context minus 64)"
            )
        self.max_prompt_tokens = cfg.max_prompt_tokens or self.llm.context_length - 64
        self.states = StateCache(cfg.state_cache_mb << 20)  # block attention's reusable passage states
        self._context_buffer = ContextBuffer()  # and the memory their windows are assembled in
        self._block_prefix: PrefixCache | None = None  # block_prefix_ids depend on the tokenizer only
        self._blocks_memo = BlockMemo()  # tokenized passages, beside their states
        self.store = (
            None
            if cfg.passage_states is None
            else PassageStateStore.open(
                cfg.passage_states,
                self.capturer,
                self.llm.tokenizer,
                self.llm.weights_key,
                max_doc_words=cfg.max_doc_words,
                max_doc_tokens=cfg.max_doc_tokens,
            )
        )
        self.show_progress = show_progress
        self.reweight = cfg.reweight
        self.slot_profile = (
            None
            if cfg.slot_profile is None
            else load_profile(cfg.slot_profile, self.llm.model_id, self.llm.fingerprint)
        )
        check_setup(self.reweight, self.slot_profile, self.llm.model_id, self.llm.fingerprint)

    def _resolve_heads(self, heads: HeadsArg) -> HeadsArg:
        """Registered sets for ``"auto"``/``"auto:METHOD"``; ``"auto-or-all"`` falls back to all
        heads (with a warning) for a model that has none registered."""
        if not isinstance(heads, str):
            return heads
        spec = heads.strip().lower()
        if spec == AUTO_OR_ALL:
            try:
                return resolve_heads("auto", self.llm)
            except InputError:
                logger.warning(
                    "no retrieval-head set is registered for %s: reranking with all heads (ICR); "
                    "detect one with `attnrank heads detect`",
                    self.llm.model_id,
                )
                return None
        return resolve_heads(heads, self.llm) if spec.startswith("auto") else heads

    def _learned_weights(self, scorer: Any) -> LearnedHeadWeights | None:
        """``scorer``: "sum" (ICR/QRHead head sum), "learned" (the model's registered
        :class:`~attnrank.rerank.learned.LearnedHeadWeights`) or such an object."""
        if isinstance(scorer, str) and scorer == "sum":
            return None
        if isinstance(scorer, LearnedHeadWeights):
            return scorer
        if scorer == "learned":
            return LearnedHeadWeights.load(self.llm.model_id, self.llm.fingerprint)
        raise InputError(f"scorer={scorer!r} is not 'sum', 'learned' or a LearnedHeadWeights")

    @property
    def uses_attention(self) -> bool:
        """False when the fused weights have no attention feature: then the candidates' first-stage
        signals alone score them and the model is not run."""
        return self.fused is None or self.fused.uses_attention

    @property
    def head_list(self) -> list[tuple[int, int]]:
        return list(self.capturer.heads)

    def __repr__(self) -> str:
        heads = "all" if self.heads is None else format_heads(self.heads)
        if not self.uses_attention:
            return f"AttentionReranker(model={self.llm.model_id!r}, preset={self.config.name!r}, signals='only')"
        return (
            f"AttentionReranker(model={self.llm.model_id!r}, preset={self.config.name!r}, heads={heads}, "
            f"scorer={'learned' if self.learned is not None else 'sum'}, calibrate={self.calibrate}, "
            f"signals={'fused' if self.fused is not None else 'none'})"
        )

    # -- public API --------------------------------------------------------------------------
    def rank(
        self,
        query: str,
        docs: Sequence[Document | ScoredDocument | str] | RankedResults,
        k: int | None = None,
        *,
        query_id: str | None = None,
        return_evidence: bool = False,
    ) -> RankedResults:
        """Rerank ``docs`` (first-stage order) for ``query``; the best ``k`` (all if None).

        ``k`` must be None or a positive integer; document ids must be unique."""
        check_k(k)
        if return_evidence and (self.learned is not None or not self.uses_attention):  # none would come, silently
            what = "the learned scorer has" if self.learned is not None else f"preset {self.config.name!r} computes"
            raise InputError(f"{what} no per-token attention evidence; use e.g. preset 'qrhead' to explain")
        documents, previous = as_documents(docs)
        check_documents(documents)
        if query_id is None and isinstance(docs, RankedResults):
            query_id = docs.query_id
        if not documents:  # the stage name the list would have had
            return RankedResults(query, [], query_id, stage="attention" if self.fused is None else FUSED_STAGE)
        if not self.uses_attention:
            stage, scores, evidence = FUSED_STAGE, self._fuse(query, documents, None), None
        else:
            attention, evidence = self._attention_scores(query, documents, return_evidence, previous)
            stage, scores = "attention", attention
            if self.fused is not None:  # keep the attention score beside the fused one
                stage, scores = FUSED_STAGE, self._fuse(query, documents, attention)
                previous = _with_stage(documents, previous, "attention", attention)
        res = rank_documents(
            query, documents, scores, stage=stage, query_id=query_id, previous=previous, evidence=evidence
        )
        return res if k is None else res.top_k(k)

    def rank_batch(
        self,
        queries: Sequence[str],
        docs_per_query: Sequence[Sequence[Any]],
        k: int | None = None,
        *,
        query_ids: Sequence[str] | None = None,
    ) -> list[RankedResults]:
        if len(queries) != len(docs_per_query):
            raise InputError(
                f"{len(queries)} queries but {len(docs_per_query)} document lists; give one list per query"
            )
        if query_ids is not None and len(query_ids) != len(queries):
            raise InputError(f"{len(queries)} queries but {len(query_ids)} query_ids; give one id per query")
        check_k(k)
        it = range(len(queries))
        if self.show_progress:
            from tqdm.auto import tqdm

            it = tqdm(it, desc="rerank", unit="q")
        return [
            self.rank(queries[i], docs_per_query[i], k, query_id=None if query_ids is None else query_ids[i])
            for i in it
        ]

    def score(self, query: str, docs: Sequence[Document | ScoredDocument | str] | RankedResults) -> np.ndarray:
        """The reranker's score of each document, in input order: the calibrated attention score,
        or with ``signals`` the fused score (ScoredDocument candidates give learned weights their
        first-stage and stage scores, as in :meth:`rank`)."""
        documents, previous = as_documents(docs)
        check_texts(documents)
        return self._score(query, documents, False, previous)[0]

    # -- internals ---------------------------------------------------------------------------
    def _score(self, query: str, docs: list[Document], evidence: bool, previous: list[ScoredDocument] | None = None):
        if not self.uses_attention:
            return self._fuse(query, docs, None), None
        scores, ev = self._attention_scores(query, docs, evidence, previous)
        return (scores if self.fused is None else self._fuse(query, docs, scores)), ev

    def _fuse(self, query: str, docs: list[Document], attention: np.ndarray | None) -> np.ndarray:
        """The fused score (:mod:`attnrank.rerank.fused`) of the candidates from their attention
        (None: weights without attention)."""
        assert self.fused is not None
        signals: dict[str, Any] = dict(self.signals(query, [d.full_text for d in docs], self.fused.base_features))
        if attention is not None:
            signals[ATTENTION] = attention
        return self.fused.score(signals)

    def _attention_scores(
        self, query: str, docs: list[Document], evidence: bool, previous: list[ScoredDocument] | None
    ) -> tuple[np.ndarray, list[dict] | None]:
        if self.learned is not None:  # linear head weighting (attnrank.rerank.learned)
            wins = self.windows(query, docs)
            first_stage = None if previous is None else [d.score for d in previous]
            return self.learned.score_windows(
                wins, len(docs), self.head_list, first_stage, _stage_scores(previous)
            ), None
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
        return reweighted_document_scores(
            w, tokens, terms, self.reweight, use_filter=self.token_filter, slot_profile=self.slot_profile
        )

    def windows(self, query: str, docs: list[Document]) -> list[WindowRows]:
        """Score ``docs`` window by window; returns the per-head rows (features for learned scorers)."""
        if not isinstance(query, str) or not query.strip():
            raise InputError(f"query {query!r} is empty; give a non-empty query text")
        tok, kw = self.llm.tokenizer, self.prompt_kw
        if self.config.attention == "block":  # tokenized once; windows select their blocks
            whole = build_block_prompts(tok, query, docs, memo=self._blocks_memo, **kw)
            cut = fit_windows(  # the windows' prompts, captured together (one suffix pass)
                len(docs),
                lambda g: whole if len(g) == len(docs) else whole.select(g, self.config.order),
                self._block_extent,
                lambda prompt, g: (prompt, g),
                self.max_prompt_tokens,
            )
            rows = self._block_windows([prompt for prompt, _ in cut])
            return [replace(w, doc_index=g) for w, (_, g) in zip(rows, cut)]
        return fit_windows(
            len(docs),
            lambda g: build_rerank_prompts(tok, query, [docs[i] for i in g], **kw),
            lambda p: len(p.real.input_ids),
            self._window,
            self.max_prompt_tokens,
        )

    def _window(self, pair: RerankPromptPair, doc_index: list[int]) -> WindowRows:
        return capture_window(
            self.capturer, pair, calibrate=self.calibrate, query_span=self.query_span, doc_index=doc_index
        )

    def write_passage_states(
        self,
        folder: Path,
        docs: Sequence[Document],
        *,
        storage: str = "float16",
        progress: Callable[[int], object] | None = None,
    ) -> dict[str, Any]:
        """Store every passage's block states in ``folder`` for this reranker's model, heads and
        truncation: what ``passage_states=`` then serves (:mod:`attnrank.llm.statestore`)."""
        return write_store(
            folder,
            self.capturer,
            self.llm.tokenizer,
            docs,
            model_id=self.llm.model_id,
            fingerprint=self.llm.weights_key,
            storage=storage,
            max_doc_words=self.config.max_doc_words,
            max_doc_tokens=self.config.max_doc_tokens,
            progress=progress,
        )

    def _block_extent(self, prompt: BlockPrompt) -> int:
        """Positions the block prompt spans: its suffix's start plus the longer suffix."""
        suffix = max(len(prompt.real_suffix_ids), len(prompt.calibration_suffix_ids))
        return prompt.suffix_start(self.config.block_positions) + suffix

    def _block_windows(self, prompts: list[BlockPrompt]) -> list[WindowRows]:
        """Block-attention windows: each block attends to the prefix and itself; their states
        come from :attr:`states` (or the store) when seen before."""
        if self._block_prefix is None:  # the same for every query: prefilled once
            self._block_prefix = self.capturer.prefill(prompts[0].prefix_ids)
        return capture_block_windows(
            self.capturer,
            prompts,
            self._block_prefix,
            fingerprint=self.llm.weights_key,
            positions=self.config.block_positions,
            calibrate=self.calibrate,
            query_span=self.query_span,
            states=self.states,
            store=None if self.config.block_positions == "sequential" else self.store,
            buffer=self._context_buffer,
        )
