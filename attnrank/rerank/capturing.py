"""How an :class:`~attnrank.rerank.attention.AttentionReranker` reads attention: the candidates'
prompts cut into windows that fit the model (:mod:`attnrank.rerank.windows`), each captured with
the full prompt or block attention (:mod:`attnrank.llm.capture`), and passage states kept in
memory, read from a store or written to one (:mod:`attnrank.llm.statestore`). A mixin of the
reranker, which sets the attributes declared here."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..llm.attention import AttentionCapturer, PrefixCache
from ..llm.blocks import BlockMemo, BlockPrompt, EncodedBlock, build_block_prompts
from ..llm.capture import capture_block_windows, capture_window
from ..llm.context import ContextBuffer, context_limit, read_window
from ..llm.models import LLM
from ..llm.prompts import RerankPromptPair, build_rerank_prompts
from ..llm.rows import WindowRows
from ..llm.states import StateCache
from ..llm.statestore import PassageStateStore
from ..llm.statestore_write import check_store, write_store
from ..types import Document
from .config import RerankConfig
from .windows import block_windows, check_blocks_alone, check_fit_alone, fit_windows, prompt_extent


class WindowCapture:
    """Attention rows of a query's candidates, window by window."""

    config: RerankConfig
    prompt_kw: dict[str, Any]
    calibrate: bool
    query_span: str
    states: StateCache
    store: PassageStateStore | None
    _context_buffer: ContextBuffer
    _block_prefix: PrefixCache | None
    _blocks_memo: BlockMemo[EncodedBlock]

    @property
    def llm(self) -> LLM:
        raise NotImplementedError

    @property
    def capturer(self) -> AttentionCapturer:
        raise NotImplementedError

    @property
    def max_prompt_tokens(self) -> int:
        raise NotImplementedError

    def _check_query(self, query: Any) -> None:
        raise NotImplementedError

    def windows(self, query: str, docs: list[Document]) -> list[WindowRows]:
        """Score ``docs`` window by window; returns the per-head rows (features for learned scorers)."""
        self._check_query(query)
        tok, kw = self.llm.tokenizer, self.prompt_kw
        if self.config.attention == "block":  # tokenized once; windows select their blocks
            whole = build_block_prompts(tok, query, docs, memo=self._blocks_memo, **kw)
            cfg = self.config
            limit = context_limit(self.capturer)  # (a sliding window's: the windows keep below it)
            read = read_window(self.capturer)  # (and its heads' rows read every token of their window)
            cut = block_windows(whole, cfg.order, cfg.block_positions, self.max_prompt_tokens, limit, read)
            rows = self._block_windows([prompt for prompt, _ in cut])
            return [replace(w, doc_index=g) for w, (_, g) in zip(rows, cut)]
        build, size, limit, sliding = self._full_prompts(query, docs)
        return fit_windows(len(docs), build, size, self._window, limit, [d.id for d in docs], sliding=sliding)

    def _full_prompts(self, query: str, docs: Sequence[Document]) -> tuple[Callable, Callable, int, bool]:
        """How full prompts of ``docs`` are built (by input indices) and sized, the most positions one
        takes, and whether that is a sliding window's: less than the budget where a sliding-window
        layer holds a head (:func:`~attnrank.llm.context.read_window`: its heads read no further back)."""
        tok, kw = self.llm.tokenizer, self.prompt_kw
        budget, window = self.max_prompt_tokens, read_window(self.capturer)
        limit = window if window is not None and window < budget else budget
        return (
            lambda g: build_rerank_prompts(tok, query, [docs[i] for i in g], **kw),
            lambda p: prompt_extent(p, self.calibrate),
            limit,
            limit != budget,
        )

    def check_prompts_fit(self, query: str, docs: Sequence[Document]) -> None:
        """What :meth:`windows` refuses of ``docs`` over the full prompt (a document whose prompt alone
        does not fit), tokenizing only: a batch names it before its first query is scored."""
        if self.config.attention == "block":  # (its windows are cut and checked as its blocks are built)
            return
        build, size, limit, sliding = self._full_prompts(query, docs)
        check_fit_alone(len(docs), build, size, limit, [d.id for d in docs], sliding)

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
        self._check_read_window(docs)
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

    def check_passage_states(self, docs: Sequence[Document]) -> None:
        """What :meth:`write_passage_states` would refuse of ``docs`` with this model (tokenizing
        them only): checked before an index build embeds the corpus, not after it."""
        check_store(self.capturer, self.llm.tokenizer, docs, self.config.max_doc_words, self.config.max_doc_tokens)
        self._check_read_window(docs)

    def _check_read_window(self, docs: Sequence[Document]) -> None:
        """Refuse a passage that no search could read where heads sit in sliding-window layers: its
        block with the prefix and a one-word query's suffix past what they read (as :meth:`windows`
        refuses it; a store of hours was built, then refused at every search)."""
        read = read_window(self.capturer)
        if read is None or not docs:
            return
        whole = build_block_prompts(self.llm.tokenizer, "x", list(docs), **self.prompt_kw)
        check_blocks_alone(whole, context_limit(self.capturer), read)

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
