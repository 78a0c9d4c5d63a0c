"""In-context attention reranking (ICR, Chen et al. ICLR 2025; QRHead, Zhang et al. EMNLP 2025).

All candidates and the query go into one prompt (see :mod:`attnrank.llm.prompts`). The context
(everything up to the late instruction) is prefilled once; the query suffix and the
content-free "N/A" suffix then run over that cached context in one pass (neither attending to the
other), capturing only the chosen heads' attention rows for the query span, and only up to the
deepest chosen layer (see :mod:`attnrank.llm.attention`). Calibrated token scores
``Δ = a(q) − a(N/A)`` are summed over heads and aggregated per document with ICR's μ − 2σ filter
(:mod:`attnrank.llm.rows`).

Long candidate lists are scored in round-robin windows (:mod:`attnrank.rerank.windows`) when
one prompt would exceed ``max_prompt_tokens``; window scores become document scores in
:mod:`attnrank.rerank.aggregation`.

Optional re-weighting (``reweight=``: sink filtering, cross-document IDF, entropy
regularization, slot correction) replaces the plain aggregation; see
:mod:`attnrank.rerank.reweight` and :mod:`attnrank.rerank.position`.

With fused weights the candidates' first-stage signals and the query likelihood join attention's
scores: :mod:`attnrank.rerank.fusing`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..artifacts import warn_if_scored_otherwise
from ..errors import InputError
from ..llm.attention import AttentionCapturer, PrefixCache
from ..llm.blocks import BlockMemo, EncodedBlock
from ..llm.context import ContextBuffer
from ..llm.headspec import HeadsArg, format_heads, parse_heads
from ..llm.models import (
    LLM,
    check_model_arg,
    check_prompt_budget,
    load_llm,
    unloaded_model,
    warn_if_configured_otherwise,
)
from ..llm.prompts import CALIBRATION_QUERY
from ..llm.states import StateCache
from ..llm.statestore import PassageStateStore, ids_by_position
from ..types import (
    Document,
    RankedResults,
    ScoredDocument,
    as_documents,
    check_query_id,
    rank_documents,
    stage_score_lists,
    with_stage,
)
from .aggregation import window_document_scores, without_attention_evidence
from .capturing import WindowCapture
from .config import RerankConfig
from .fused import FUSED_STAGE, LIKELIHOOD, UNTRAINED
from .fused_resolve import resolve_fused
from .fusing import FusedScoring
from .inputs import (
    check_document_lists,
    check_documents,
    check_id_types,
    check_k,
    check_query,
    check_query_list,
    check_texts,
)
from .likelihood import PromptIds
from .position import SlotProfile, load_profile
from .resolve import check_before_load, learned_weights, resolve_config_heads
from .reweight import check_setup, heads_label
from .signals import VECTOR_CACHE, SignalComputer, signal_embedder_setup
from .versions import SCORING_VERSION, scores_moved
from .windows import check_frame

logger = logging.getLogger(__name__)

_UNSET: Any = object()  # ``heads`` not given: the configuration's heads


class AttentionReranker(WindowCapture, FusedScoring):
    """Rerank passages by the LLM's reading of them: its query likelihood or the attention a
    query pays them in selected heads, alone or fused with the candidates' first-stage signals.

    Configured by a :class:`~attnrank.rerank.config.RerankConfig`, whose docstring says what each
    field does: ``config`` is a preset name (default ``"likelihood"``: the candidates' BM25, dense
    cosine and the LLM's query likelihood given each, z-scored and summed with equal weights or a
    user's ``attnrank train`` weights, no attention; ``"signals"``: the same without the
    likelihood, no LLM run; ``"fused"``: block attention from the heads its trained weights
    record, fused with BM25 and dense by those weights; ``"qrhead"``, ``"icr"``, ...: attention
    alone) or a config object, and keyword ``options`` override its fields. ``model`` may also be
    a loaded :class:`LLM`, used as it is; the preset ``signals`` loads none until :attr:`llm` is
    read. With ``slot_profile="auto"`` each window is corrected by the model's registered profile
    closest to its number of documents (:meth:`profile_for`); evidence tokens always hold the
    plain calibrated scores.
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
        check_model_arg(model)
        if heads is not _UNSET:
            options["heads"] = heads
        if isinstance(model, (str, os.PathLike)):  # a Path is a model folder too
            options["model"] = os.fspath(model)
        if isinstance(config, RerankConfig):
            cfg = config.with_options(**options)
        else:  # the options take part in choosing an unnamed preset (config.preset_for)
            cfg = RerankConfig.preset(config or "", **options)
        self.config = cfg
        # Reranking by the signals alone never runs the model: it is loaded only if asked for (.llm).
        self._llm = model if isinstance(model, LLM) else None
        if self._llm is not None:
            warn_if_configured_otherwise(self._llm, cfg, "RerankConfig")
        self._llm_lock = threading.Lock()
        check_before_load(cfg, self._llm)
        if self._llm is None and cfg.uses_llm:
            self._llm = load_llm(cfg.model, dtype=cfg.dtype, device=cfg.device)
        self.model_id, self.fingerprint = (
            (self._llm.model_id, self._llm.fingerprint) if self._llm is not None else unloaded_model(cfg.model)
        )
        self.learned = learned_weights(cfg.scorer, self.model_id, self.fingerprint)
        loaded_adapter = self._llm.adapter if self._llm is not None else None  # (None: no model loaded)
        self.fused = resolve_fused(cfg.signals, self.model_id, self.fingerprint, loaded_adapter)
        if self.fused is not None and not cfg.uses_attention:
            self.fused = self.fused.without_attention()
        if self.fused is not None:
            self.fused.warn_if_cut_otherwise(cfg.max_doc_words, cfg.max_doc_tokens)
            if self.fused.uses_llm:
                recorded = self.fused.scoring_version
                moved = scores_moved(
                    recorded, attention=self.fused.uses_attention, likelihood=LIKELIHOOD in self.fused.features
                )
                warn_if_scored_otherwise(self.fused.LABEL, recorded, moved, SCORING_VERSION, self.fused.TRAIN)
            self.fused.warn_if_prompted_otherwise(cfg.prompt_settings())
        # the candidates' embedder runs in the model's precision: the config's, or a given model's
        dtype = cfg.dtype if self._llm is None else str(self._llm.dtype).removeprefix("torch.")
        # state_cache_mb=0: nothing kept from one query to the next, the candidates' vectors neither
        self.signals = SignalComputer(
            self.fused.embedder if self.fused else None,
            *signal_embedder_setup(cfg.device, dtype),
            cache_vectors=VECTOR_CACHE if cfg.state_cache_mb else 0,
        )
        self._set_heads(cfg)
        self.states = StateCache(cfg.state_cache_mb << 20)  # reusable passage states (block attention, likelihood)
        self._context_buffer = ContextBuffer()  # and the memory their windows are assembled in
        self._block_prefix: PrefixCache | None = None  # block_prefix_ids depend on the tokenizer only
        self._blocks_memo: BlockMemo[EncodedBlock] = BlockMemo()  # tokenized passages, beside their states
        self._prompt_memo: BlockMemo[PromptIds] = BlockMemo()  # and the query likelihood's prompts
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
            else load_profile(cfg.slot_profile, self.model_id, self.fingerprint, calibrated=self.calibrate)
        )
        self._profiles: dict[int, SlotProfile] = {}  # "auto": the registered profile per window size
        adapter = self._llm.adapter if self._llm is not None else ""
        label = heads_label(self.heads) if self.uses_attention else None
        check_setup(self.slot_profile, self.model_id, self.fingerprint, adapter, self.calibrate, label)

    def _set_heads(self, cfg: RerankConfig) -> None:
        """The heads read and how (calibration, token filter, query span, prompt arguments): the
        learned weights' where they fix them, else the config's; checked against the model now,
        not at the first query."""
        calibrate, token_filter = cfg.calibrate, cfg.token_filter
        heads: HeadsArg
        if self.learned is not None:  # the weights fix the heads, calibration and filter
            self.learned.check_adapter(self._llm.adapter if self._llm is not None else "")
            self.learned.warn_if_captured_otherwise(cfg.capture)
            self.learned.warn_if_prompted_otherwise(cfg.prompt_settings())
            recorded = self.learned.config.scoring_version
            moved = scores_moved(recorded, attention=True, likelihood=False)
            warn_if_scored_otherwise(self.learned.LABEL, recorded, moved, SCORING_VERSION, "attnrank heads train")
            heads = self.learned.heads
            calibrate, token_filter = self.learned.fixed_options(calibrate, token_filter)
        elif not self.uses_attention:  # heads are never read: no registered set needed, none warned of
            heads = None
        else:
            heads = resolve_config_heads(cfg.heads, self.llm, None if self.fused is None else self.fused.heads)
        self.heads = parse_heads(heads)
        if self.uses_attention and self.fused is not None and self.learned is None:
            reweighted = cfg.reweight is not None and cfg.reweight.changes_scores
            self.fused.warn_if_applied_otherwise(self.heads, cfg.capture, reweighted)
        if self.uses_attention:  # checks the heads against the model now, not at the first query
            self.capturer  # noqa: B018
        self.calibrate, self.query_span, self.token_filter = calibrate, cfg.query_span, token_filter
        self.prompt_kw: dict[str, Any] = cfg.prompt_kw
        if self.uses_attention:  # (a model whose config could not be read before its load)
            check_prompt_budget(cfg.max_prompt_tokens, self.llm)
            check_frame(
                self.llm.tokenizer,
                self.prompt_kw,
                self.max_prompt_tokens,
                calibrate=calibrate,
                block_positions=cfg.block_positions_read,
            )

    @property
    def llm(self) -> LLM:
        """The model; the preset without attention loads it only here, when something asks for it
        (an answer, an explanation): reranking by it never runs the model (``likelihood`` loads it
        when built)."""
        if self._llm is not None:  # every capture reads it: no lock once loaded
            return self._llm
        with self._llm_lock:  # two threads asking at once load it once
            if self._llm is None:
                self._llm = load_llm(self.config.model, dtype=self.config.dtype, device=self.config.device)
            return self._llm

    @functools.cached_property
    def capturer(self) -> AttentionCapturer:
        """Reads the heads' attention rows from the model (built on first use)."""
        return AttentionCapturer(self.llm.model, self.heads)

    @property
    def max_prompt_tokens(self) -> int:
        """Tokens one prompt (window) may span: the config's, else :attr:`LLM.prompt_budget`."""
        return self.config.max_prompt_tokens or self.llm.prompt_budget

    @property
    def uses_attention(self) -> bool:
        """False when the fused weights have no attention feature: then the candidates' first-stage
        signals alone score them (with the query likelihood for ``likelihood``: :attr:`uses_llm`)."""
        return self.fused is None or self.fused.uses_attention

    @property
    def uses_llm(self) -> bool:
        """Whether reranking runs the LLM (attention, or the query likelihood of preset ``likelihood``)."""
        return self.uses_attention or (self.fused is not None and self.fused.uses_llm)

    @property
    def head_list(self) -> list[tuple[int, int]]:
        """The heads read, as (layer, head) pairs; none for the preset without attention."""
        return list(self.capturer.heads) if self.uses_attention else []

    def __repr__(self) -> str:
        heads = "all" if self.heads is None else format_heads(self.heads)
        if not self.uses_attention:
            fused = self.fused
            shown = (
                f"features={fused.features}, weights={fused.weights}"
                if fused is not None and (fused.uses_llm or fused.trained_on != UNTRAINED)
                else "signals='only'"
            )
            return f"AttentionReranker(model={self.model_id!r}, preset={self.config.name!r}, {shown})"
        return (
            f"AttentionReranker(model={self.model_id!r}, preset={self.config.name!r}, heads={heads}, "
            f"scorer={'learned' if self.learned is not None else 'sum'}, calibrate={self.calibrate}, "
            f"attention={self.config.capture}, "
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
        self._check_query(query)
        check_k(k)
        if not isinstance(return_evidence, (bool, np.bool_)):  # ("no" is truthy: evidence came back)
            raise InputError(
                f"return_evidence={return_evidence!r} is a {type(return_evidence).__name__}; give True or False"
            )
        check_query_id(query_id)
        if return_evidence and (self.learned is not None or not self.uses_attention):  # none would come, silently
            what = "the learned scorer has" if self.learned is not None else f"preset {self.config.name!r} computes"
            raise InputError(f"{what} no per-token attention evidence; use e.g. preset 'qrhead' to explain")
        documents, previous = as_documents(docs)
        check_documents(documents)
        if query_id is None and isinstance(docs, RankedResults):
            query_id = docs.query_id
        if not documents:  # the stage name the list would have had
            return RankedResults(query, [], query_id, stage="attention" if self.fused is None else FUSED_STAGE)
        attention, evidence = None, None
        if self.uses_attention:
            with _ids_of(docs):
                attention, evidence = self._attention_scores(query, documents, return_evidence, previous)
            if previous is not None:  # an earlier attention stage's token scores are not this one's
                previous = [without_attention_evidence(p) for p in previous]
        stage, scores = "attention", attention
        if self.fused is not None:  # keep the LLM's own scores (attention, likelihood) beside the fused one
            scores, kept = self._fuse(query, documents, attention)
            stage = FUSED_STAGE
            for name, values in kept.items():
                previous = with_stage(documents, previous, name, values)
        res = rank_documents(
            query, documents, scores, stage=stage, query_id=query_id, previous=previous, evidence=evidence
        )
        return res if k is None else res.top_k(k)

    def _check_query(self, query: Any) -> None:
        """A query text; with calibrated attention, not the content-free calibration query itself
        (its calibrated scores would all be 0: the first-stage order, labelled as attention's)."""
        check_query(query)
        if self.uses_attention and self.calibrate and query.strip() == CALIBRATION_QUERY:
            raise InputError(
                f"query {query!r} is the calibration query attention is measured against; rephrase the query"
            )

    def rank_batch(
        self,
        queries: Sequence[str],
        docs_per_query: Sequence[Sequence[Any]],
        k: int | None = None,
        *,
        query_ids: Sequence[str] | None = None,
    ) -> list[RankedResults]:
        check_query_list(queries, query_ids)
        if query_ids is not None and len(query_ids) != len(queries):
            raise InputError(f"{len(queries)} queries but {len(query_ids)} query_ids; give one id per query")
        check_k(k)
        self.check_batch(queries, docs_per_query, query_ids)  # all before any work, not query by query
        it = range(len(queries))
        if self.show_progress:
            from tqdm.auto import tqdm

            it = tqdm(it, desc="rerank", unit="q")
        return [
            self.rank(queries[i], docs_per_query[i], k, query_id=None if query_ids is None else query_ids[i])
            for i in it
        ]

    def check_batch(
        self,
        queries: Sequence[str],
        docs_per_query: Sequence[Sequence[Any]],
        query_ids: Sequence[str] | None = None,
    ) -> None:
        """What :meth:`rank` would refuse in any of these queries, all named before any work (tokenizing
        only): :class:`InputError` naming the query (its id where given, else its number). A caller
        that ranks query by query (the CLI over a run) loses nothing to its last query's mistake."""
        check_query_list(queries, query_ids)
        check_document_lists(queries, docs_per_query)  # (zip below read as many as the shorter held)
        for i, (query, docs) in enumerate(zip(queries, docs_per_query)):
            try:
                self._check_query(query)
                documents = as_documents(docs)[0]
                check_documents(documents)
                self._check_fits(query, documents)
                if self.uses_attention:  # (a passage its window cannot hold: at its turn, all before it done)
                    self.check_prompts_fit(query, documents)
            except InputError as e:
                raise InputError(f"query {'#' + str(i) if query_ids is None else repr(query_ids[i])}: {e}") from None

    def score(self, query: str, docs: Sequence[Document | ScoredDocument | str] | RankedResults) -> np.ndarray:
        """The reranker's score of each document, in input order: the calibrated attention score,
        or with ``signals`` the fused score, a sum of z-scores over these documents: comparable
        within one call only (a lone document scores 0). ScoredDocument candidates give learned
        weights their first-stage and stage scores, as in :meth:`rank`."""
        self._check_query(query)  # (the calibration query scored all zeros here, where rank refused it)
        documents, previous = as_documents(docs)
        check_id_types(documents)  # (the kept states are looked up by id)
        check_texts(documents)
        if not documents:  # as rank() gives no results, whatever the preset computes
            return np.zeros(0)
        with _ids_of(docs):
            return self._score(query, documents, False, previous)[0]

    # -- internals ---------------------------------------------------------------------------
    def _score(self, query: str, docs: list[Document], evidence: bool, previous: list[ScoredDocument] | None = None):
        if not self.uses_attention:
            return self._fuse(query, docs, None)[0], None
        scores, ev = self._attention_scores(query, docs, evidence, previous)
        return (scores if self.fused is None else self._fuse(query, docs, scores)[0]), ev

    def _attention_scores(
        self, query: str, docs: list[Document], evidence: bool, previous: list[ScoredDocument] | None
    ) -> tuple[np.ndarray, list[dict] | None]:
        if self.learned is not None:  # linear head weighting (attnrank.rerank.learned)
            wins = self.windows(query, docs)
            first_stage = None if previous is None else [d.score for d in previous]
            return self.learned.score_windows(
                wins, len(docs), self.head_list, first_stage, stage_score_lists(previous)
            ), None
        reweighting = None
        if self.reweight is not None:
            reweighting = (self.llm.tokenizer, query, self.reweight, self.profile_for)
        return window_document_scores(
            self.windows(query, docs),
            len(docs),
            token_filter=self.token_filter,
            reweighting=reweighting,
            evidence=evidence,
        )

    def profile_for(self, n_slots: int) -> SlotProfile | None:
        """The slot profile that corrects a window of ``n_slots`` documents: with ``slot_profile="auto"``
        the model's registered profile closest to ``n_slots`` (a profile is best measured at the K
        it corrects, :mod:`attnrank.rerank.position`), else the one given."""
        if not (isinstance(self.config.slot_profile, str) and self.config.slot_profile == "auto"):
            return self.slot_profile
        if n_slots not in self._profiles:
            profile = load_profile("auto", self.model_id, self.fingerprint, n_slots=n_slots, calibrated=self.calibrate)
            check_setup(
                profile, self.model_id, self.fingerprint, self.llm.adapter, self.calibrate, heads_label(self.heads)
            )
            self._profiles[n_slots] = profile
        return self._profiles[n_slots]


def _ids_of(docs: Any) -> contextlib.AbstractContextManager[None]:
    """Where ``docs`` were given as plain texts, their ids ("0", "1", ...) are their positions, not
    the stored passages of those ids (:func:`~attnrank.llm.statestore.ids_by_position`)."""
    texts = isinstance(docs, Sequence) and bool(docs) and all(isinstance(d, str) for d in docs)
    return ids_by_position() if texts else contextlib.nullcontext()
