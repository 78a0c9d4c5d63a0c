"""How an :class:`~attnrank.rerank.attention.AttentionReranker` scores with fused weights
(:mod:`attnrank.rerank.fused`): the candidates' first-stage signals (:mod:`attnrank.rerank.signals`,
the dense one read from an index's stored vectors where it can be), the LLM's query likelihood given
each (:mod:`attnrank.rerank.likelihood`) and attention's scores, combined by the weights. A mixin
of the reranker, which sets the attributes declared here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InputError
from ..index.retriever import HybridRetriever
from ..llm.blocks import BlockMemo, EncodedBlock
from ..llm.context import ContextBuffer
from ..llm.models import LLM
from ..llm.states import StateCache
from ..types import Document, RankedResults, ScoredDocument, as_documents
from .config import RerankConfig
from .fused import ATTENTION, LIKELIHOOD, FusedWeights
from .inputs import check_query, check_texts
from .likelihood import PromptIds, TextRoom, query_likelihood, text_room
from .shortlist import fused_on_shortlist
from .signals import SignalComputer


class FusedScoring:
    """Fused scores of a query's candidates, and the query likelihood they may read."""

    config: RerankConfig
    fused: FusedWeights | None
    signals: SignalComputer
    states: StateCache
    _context_buffer: ContextBuffer
    _prompt_memo: BlockMemo[PromptIds]
    _blocks_memo: BlockMemo[EncodedBlock]

    @property
    def llm(self) -> LLM:
        raise NotImplementedError

    def forget_passages(self) -> None:
        """Forget what was kept from earlier queries (passage states, tokenized passages and
        prompts, candidates' vectors): the next query runs as a first visit does. Benchmarks time
        cold queries so; a reranker that kept the tokenization was timed cold without it."""
        self.states.clear()
        self._blocks_memo.clear()
        self._prompt_memo.clear()
        self.signals.forget()

    def use_index(self, retriever: HybridRetriever) -> bool:
        """Candidates from ``retriever``'s corpus get their dense signal from its stored vectors
        instead of a pass of the embedder over them (:meth:`SignalComputer.use_index`; same
        embedder only; scores agree with embedding them to the embedder's precision). True when
        the vectors will be read."""
        return self.fused is not None and self.signals.use_index(retriever)

    def _fuse(
        self, query: str, docs: list[Document], attention: np.ndarray | None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The fused score (:mod:`attnrank.rerank.fused`) of the candidates from their attention
        (None: weights without attention), and the LLM's scores it read (attention, likelihood)."""
        assert self.fused is not None
        room = self._check_fits(query, docs)  # (a query too long for the likelihood: named before the signals run)
        texts, ids = [d.full_text for d in docs], [d.id for d in docs]
        signals: dict[str, Any] = dict(self.signals(query, texts, self.fused.text_signals, ids=ids))
        kept: dict[str, np.ndarray] = {}
        if attention is not None:
            kept[ATTENTION] = attention
        depth = self.config.likelihood_depth
        if LIKELIHOOD in self.fused.features and depth is not None and depth < len(docs):
            return self._fuse_shortlist(query, docs, signals, depth, room)
        if LIKELIHOOD in self.fused.features:
            kept[LIKELIHOOD] = self._likelihood(query, docs, room)
        return self.fused.score({**signals, **kept}), kept

    def _fuse_shortlist(
        self, query: str, docs: list[Document], signals: dict[str, Any], depth: int, room: TextRoom | None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """:meth:`_fuse` with the likelihood read for the ``depth`` candidates the other signals
        rank highest (:mod:`attnrank.rerank.shortlist`); the others' likelihood is NaN (not read)."""
        assert self.fused is not None

        def read(top: np.ndarray) -> np.ndarray:
            # (each document's title tokens, for the shortlist's alone)
            part = None if room is None else (room[0], room[1], [room[2][i] for i in top])
            return self._likelihood(query, [docs[i] for i in top], part)

        scores, top, likelihood = fused_on_shortlist(self.fused, signals, depth, read)
        kept = np.full(len(docs), np.nan)
        kept[top] = likelihood
        return scores, {LIKELIHOOD: kept}

    def _check_fits(self, query: str, docs: Sequence[Document]) -> TextRoom | None:
        """Where the query likelihood is read: :class:`InputError` unless the query and each
        title leave a passage room in the model's context (:func:`text_room`, returned for the
        likelihood to read; tokenizing only)."""
        if self.fused is not None and LIKELIHOOD in self.fused.features:
            return text_room(self.llm, query, docs)
        return None

    def likelihood(self, query: str, docs: Sequence[Document | ScoredDocument | str] | RankedResults) -> np.ndarray:
        """UPR's score of each of ``docs`` (Sachan et al. EMNLP 2022): the mean log-probability of
        the query's tokens after a prompt with the passage, in nats per token, cut as configured
        (:func:`~attnrank.rerank.likelihood.query_likelihood`); what the preset ``likelihood`` fuses.
        The documents are taken and checked as
        :meth:`~attnrank.rerank.attention.AttentionReranker.score` takes them."""
        check_query(query)
        documents, _ = as_documents(docs)
        check_texts(documents)
        return self._likelihood(query, documents)

    def _likelihood(self, query: str, docs: Sequence[Document], room: TextRoom | None = None) -> np.ndarray:
        """Each document's UPR score: the mean log-probability (nats) of the query's tokens
        (``room``: :func:`text_room` of these, where the caller has it)."""
        scores = query_likelihood(
            self.llm,
            query,
            docs,
            room=room,
            max_doc_words=self.config.max_doc_words,
            max_doc_tokens=self.config.max_doc_tokens,
            states=self.states,
            buffer=self._context_buffer,
            memo=self._prompt_memo,
        ).mean(axis=1, dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(scores))
        if bad.size:  # (the fusion's message told the user to give the signal a value)
            raise InputError(
                f"the query likelihood of document {docs[int(bad[0])].id!r} is {scores[bad[0]]}; check the model's "
                "dtype (an overflow: use float32 or bfloat16, --dtype)"
            )
        return scores
