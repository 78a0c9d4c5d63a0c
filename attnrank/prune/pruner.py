"""Attention-guided sentence pruning of retrieved passages before generation.

Methods followed: AttentionRAG (Fang et al., arXiv 2503.10720: the question recast
as next-token prediction with an answer hint, the attention of that one *focus* token to the
context, processed in chunks, sentences kept), Sentinel (Zhang et al., arXiv 2505.23277:
sentence-level attention features of a small proxy LLM, greedy selection under a token budget,
original order), and from EHPC (Fei et al., arXiv 2501.12959) only its point that a few heads
suffice (``heads=``; its evaluator-layer choice, observation window and token pooling are not
implemented, and every head is read by default).

Prompt: the ICR layout of the reranker (:func:`attnrank.llm.prompts.build_rerank_prompts`), one
``[i] title\\n<sentences>`` block per passage and the late instruction and query after them, in
the chat template; ``instruction="qa"`` by default, ICR's choice for every multi-hop QA set.
Sentences are mapped to token spans through the tokenizer's offset mapping; tokens are
never estimated. The selected heads' attention rows are captured (only up to the deepest head's
layer, the context prefilled once and shared by the real and "N/A" suffixes):

- ``method="query"`` (ICR): rows averaged over the query span (late instruction through the chat
  suffix), minus those of the content-free query "N/A" (``calibrate=True``), summed over heads.
- ``method="focus"`` (AttentionRAG variant): the assistant turn is started with the answer hint
  ``focus_hint`` (default ``"The answer is"``) after the same query suffix; only the row of the
  hint's last token, the one that predicts the answer, is used (calibrated the same way).
- ``method="probe"`` (Sentinel-style): the query-span rows of the probe's heads, per head and
  sentence, fed to a trained :class:`~attnrank.prune.probe.SentenceProbe` (``probe=``, default:
  the model's registered probe); see :mod:`attnrank.prune.probe`.

Sentence score = Σ of the calibrated token scores of its tokens (optionally ICR's μ − 2σ filter
within the sentence, off by default: sentences are short) divided by ``sqrt(n_tokens)``
(``length_norm="sqrt"``, default) or by nothing (``"none"``). A sentence's budget cost is its
token count, so the raw sum (≈ length × mean) would favour long sentences; with zero-mean
calibrated noise the sum's spread grows like ``sqrt(n)``, so ``sum / sqrt(n)`` ranks sentences of
different lengths on one noise scale while still rewarding longer evidence.

Selection: the budget counts *sentence* tokens only (the ``[i] title`` lines that stay with
every kept passage are not counted). ``budget_tokens`` is a hard cap; ``keep_ratio`` means
``floor(keep_ratio × context sentence tokens)``; one of the two is given, never both.
Sentences are taken greedily by score; one that does not fit is skipped and the next
tried (Sentinel stops at the first misfit instead). With ``neighbours=n`` a chosen sentence
brings the ``n`` sentences on each side within its passage, if that group fits, else it comes
alone. The kept sentences are always emitted in reading order. A budget covering the whole
context keeps everything without running the model (scores are NaN then).

Long contexts: when the prompt exceeds ``max_prompt_tokens`` (default:
:attr:`~attnrank.llm.models.LLM.prompt_budget`, the model's context length − 64; with full attention,
at most one less than the sliding window of a layer holding a head: :func:`~attnrank.llm.context.read_window`,
logged), consecutive passages are packed into chunks that fit (a passage that cannot fit
alone is cut between sentences); each chunk is its own prompt and its scores are merged as
they are for one global selection (AttentionRAG's chunked processing; logged when used; the
prompts are built by :mod:`attnrank.prune.planning`).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any, cast

import numpy as np

from ..errors import InputError
from ..llm.attention import AttentionCapturer, PrefixCache
from ..llm.blocks import BlockPrompt
from ..llm.capture import capture_blocks, capture_window
from ..llm.context import ContextBuffer, read_window
from ..llm.headspec import HeadsArg, format_heads, parse_heads
from ..llm.models import (
    LLM,
    check_model_arg,
    check_prompt_budget,
    load_llm,
    warn_if_configured_otherwise,
)
from ..llm.prompts import RerankPromptPair
from ..llm.rows import document_scores, per_head_document_scores, token_scores
from ..llm.states import StateCache
from ..rerank.inputs import check_unique_ids
from ..rerank.resolve import resolve_config_heads
from ..rerank.reweight import content_free_last, content_mask, sink_filtered_rows, spans_without
from ..types import Document, as_documents, check_text_fields, check_unicode, is_blank
from .config import PruneConfig
from .context import (
    PrunedContext,
    ScoredSentence,
    check_budget,
    check_neighbours,
    is_split,
    resolve_budget,
    select,
    skipped_note,
)
from .lookups import check_pruner_before_load
from .planning import Chunk, PromptPlanner, Span, check_prune_frame, hint_ids, prompt_settings, scored_sentences
from .probe import SentenceProbe, lexical_scores, probe_capture
from .segment import Sentence, document_sentences
from .spans import make_piece

logger = logging.getLogger(__name__)

_UNSET: Any = object()  # ``heads`` not given: the configuration's heads


class ContextPruner:
    """Keep the sentences of retrieved passages that an LLM's attention marks as relevant.

    Configured by a :class:`~attnrank.prune.config.PruneConfig` (``config``), whose fields keyword
    ``options`` override. ``model``: an :class:`LLM` (share the reranker's), a model name, or None (default LLM).
    ``heads``: None/"all", pairs, "l-h,l-h", a JSON file (see :func:`parse_heads`) or "auto"
    (the model's registered set, :mod:`attnrank.registry`).
    ``method``: "query", "focus" or "probe" (``probe``: a :class:`SentenceProbe`, default the
    model's registered one; it fixes the heads); ``calibrate``: subtract the "N/A" query's attention;
    ``length_norm``: "sqrt" or "none"; ``token_filter``: ICR's μ − 2σ filter per sentence;
    ``sink``: the reranker's sink filtering (:mod:`attnrank.rerank.reweight` step 1: each head's
    real and "N/A" rows zeroed outside the sentences' content tokens and renormalized over them
    before calibration; the other re-weighting steps are passage-level and do not apply).
    See the module docstring for the prompt, the scores, the budget and chunking.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | LLM | None = None,
        heads: HeadsArg | object = _UNSET,
        *,
        config: PruneConfig | None = None,
        probe: SentenceProbe | None = None,
        **options: Any,
    ):
        check_model_arg(model)
        if heads is not _UNSET:
            options["heads"] = heads
        if isinstance(model, (str, os.PathLike)):  # a Path is a model folder too
            options["model"] = os.fspath(model)
        if config is not None and not isinstance(config, PruneConfig):  # ("query" failed as an AttributeError)
            raise InputError(
                f"config={config!r} is not a PruneConfig; a pruner has no presets: give PruneConfig(method=...) or "
                "the options as keywords (method='query')"
            )
        self.config = cfg = (config or PruneConfig()).with_options(**options)
        if probe is not None and cfg.method != "probe":
            raise InputError(f"a probe was given, but method={cfg.method!r} reads none; pass method='probe' too")
        check_prompt_budget(cfg.max_prompt_tokens, model if isinstance(model, LLM) else cfg.model)  # before the load
        self.prompt_kw: dict[str, Any] = prompt_settings(cfg)
        if isinstance(model, LLM):
            warn_if_configured_otherwise(model, cfg, "PruneConfig")
        else:  # what the registry lacks, heads outside the model, a window no prompt fits: before the load
            check_pruner_before_load(cfg, probe_given=probe is not None)
        self.llm = model if isinstance(model, LLM) else load_llm(cfg.model, dtype=cfg.dtype, device=cfg.device)
        self.probe = None
        spec: Any = cfg.heads
        length_norm = cfg.length_norm
        if cfg.method == "probe":  # the probe fixes heads and length normalisation
            self.probe = probe or SentenceProbe.load(self.llm.model_id, self.llm.fingerprint)
            trained_with = self.probe.capture.get("adapter", "")
            if trained_with != self.llm.adapter:
                # (an adapted model keeps its base's fingerprint, so the base's probe was found and
                # scored another model's attention, as learned and fused weights refuse to; and a
                # probe of an adapted model scored the base model's)
                with_ = lambda a: f"the head adapter {a}" if a else "no head adapter"  # noqa: E731
                raise InputError(
                    f"the sentence probe was trained on a model with {with_(trained_with)}, and this one has "
                    f"{with_(self.llm.adapter)}: its features would be another model's; prune with method='query', "
                    "or on the model it was trained on"
                )
            self.probe.warn_if_applied_otherwise(probe_capture(cfg, self.llm.adapter))
            spec, length_norm = self.probe.head_pairs, self.probe.length_norm
        else:  # "auto", "auto:METHOD" and "auto-or-all" as the reranker reads them
            spec = resolve_config_heads(spec, self.llm)
        self.heads = parse_heads(spec)
        self.capturer = AttentionCapturer(self.llm.model, self.heads)
        self.method, self.calibrate, self.length_norm, self.sink = cfg.method, cfg.calibrate, length_norm, cfg.sink
        self.token_filter, self.max_sentence_words = cfg.token_filter, cfg.max_sentence_words
        self.focus_hint = cfg.focus_hint.strip()
        self.hint_ids = hint_ids(self.llm.tokenizer, cfg)
        check_prompt_budget(cfg.max_prompt_tokens, self.llm)  # (a model whose config could not be read before)
        self.max_prompt_tokens = cfg.max_prompt_tokens or self.llm.prompt_budget
        self.read_window = read_window(self.capturer)  # heads of sliding layers read no further back
        window = self.read_window if cfg.attention != "block" else None  # (block: checked per prompt, _plan)
        lowered = False
        if window is not None and window < self.max_prompt_tokens:
            logger.info("pruning prompts kept within %d tokens: a sliding-window layer holds a head", window)
            self.max_prompt_tokens, lowered = window, True
        # (lowered: refused in the window's words; it advised raising a max_prompt_tokens the user never set)
        check_prune_frame(self.llm.tokenizer, cfg, self.max_prompt_tokens, window=lowered)
        self.states = StateCache(cfg.state_cache_mb << 20)  # block attention's reusable passage states
        self._context_buffer = ContextBuffer()  # and the memory their windows are assembled in
        self._block_prefix: PrefixCache | None = None

    def __repr__(self) -> str:
        heads = "all" if self.heads is None else format_heads(self.heads)
        return (
            f"ContextPruner(model={self.llm.model_id!r}, heads={heads}, method={self.method!r}, "
            f"calibrate={self.calibrate})"
        )

    # -- public API --------------------------------------------------------------------------
    def prune(
        self,
        query: str,
        docs: Sequence[Any],
        *,
        budget_tokens: int | None = None,
        keep_ratio: float | None = None,
        neighbours: int = 0,
        keep_titles: bool = True,
        sentences: Sequence[Sequence[str] | None] | None = None,
    ) -> PrunedContext:
        """Prune ``docs`` (Document, ScoredDocument, str or RankedResults) for ``query``.

        Give ``budget_tokens`` (sentence tokens kept, hard cap) or ``keep_ratio`` (in (0, 1]).
        ``sentences[i]``: pre-split sentences of passage ``i`` (else its ``metadata["sentences"]``,
        else automatic segmentation).
        """
        check_budget(budget_tokens, keep_ratio)
        check_neighbours(neighbours)
        if not isinstance(keep_titles, (bool, np.bool_)):  # (a truthy "no" kept them)
            raise InputError(f"keep_titles={keep_titles!r} is not True or False")
        documents, chunks, scored = self._prepare(query, docs, sentences)
        original = sum(s.tokens for s in scored)
        target, source = resolve_budget(budget_tokens, keep_ratio, original, min((s.tokens for s in scored), default=1))
        result = PrunedContext(
            query.strip(), self.method, documents, scored, target, source, keep_ratio, keep_titles, chunks=len(chunks)
        )
        if target >= original:
            note = (
                f"budget of {target} tokens >= the context's {original} sentence tokens: kept everything (not scored)"
            )
            logger.info(note)
            result.notes.append(note)
            result.kept_all = True
            for s in scored:
                s.kept = True
            return result
        if min(s.tokens for s in scored) > target:  # (said before the attention pass, which could keep nothing)
            _nothing_kept(result, target)
            return result
        self._score(query, chunks, scored)
        skipped = select(scored, target, neighbours)
        if not result.kept:
            _nothing_kept(result, target)
        for note in skipped_note(skipped, result.kept, target, source):
            logger.info(note)
            result.notes.append(note)
        logger.info(
            "pruned %d -> %d sentence tokens (%.1fx, budget %d, %d chunk(s))",
            original,
            result.kept_tokens,
            result.compression,
            target,
            len(chunks),
        )
        return result

    def score_sentences(
        self, query: str, docs: Sequence[Any], *, sentences: Sequence[Sequence[str] | None] | None = None
    ) -> list[ScoredSentence]:
        """Every sentence of ``docs`` (reading order) with its token count and attention score."""
        _, chunks, scored = self._prepare(query, docs, sentences)
        self._score(query, chunks, scored)
        return scored

    def sentence_features(
        self, query: str, docs: Sequence[Any], *, sentences: Sequence[Sequence[str] | None] | None = None
    ) -> tuple[list[ScoredSentence], np.ndarray]:
        """Scored sentences and their per-head scores ``[S, H]`` (heads in capture order; the
        calibrated, length-normalised sum of each head's attention to the sentence): the features
        of :mod:`attnrank.prune.probe`. With ``token_filter=False`` a row sums to the
        ``method="query"`` score."""
        _, chunks, scored = self._prepare(query, docs, sentences)
        if not scored:  # (titles alone: no sentence, no pass)
            return scored, np.zeros((0, len(self.capturer.heads)), dtype=np.float32)
        feats = self._score(query, chunks, scored, features=True)
        assert feats is not None  # features=True always fills them
        return scored, feats

    def _prepare(
        self, query: str, docs: Sequence[Any], sentences
    ) -> tuple[list[Document], list[Chunk], list[ScoredSentence]]:
        """Check the input, segment, and plan the prompts (no model call)."""
        if not isinstance(query, str):  # (a list was "empty")
            raise InputError(f"query {query!r} is a {type(query).__name__}, not a text; give the query as a string")
        if is_blank(query):  # (zero-width spaces alone: refused later, as a rerank's)
            raise InputError(f"query {query!r} is empty; give the question the context is pruned for")
        check_unicode([query], "query")  # (a tokenizer's TypeError otherwise, deep in the planning)
        documents = as_documents(docs)[0]
        if not documents:
            raise InputError("no documents to prune; pass at least one passage")
        for i, d in enumerate(documents):  # (text None: a TypeError in the segmenter; a title NaN read as "nan")
            check_text_fields(i, d)
        check_unique_ids(documents)  # (two pruned passages came back under one id, as a reranker refuses it)
        # by input position (the planner's own check counted its pieces)
        check_unicode((d.full_text for d in documents), "document")
        if sentences is not None and not isinstance(sentences, Sequence):  # (a generator: len() a TypeError)
            sentences = list(sentences)
        if sentences is not None and len(sentences) != len(documents):
            raise InputError(
                f"sentences has {len(sentences)} entries for {len(documents)} documents; "
                "give one list (or None) per document"
            )
        if sentences is not None:  # an iterator was used up locating it, then kept as []: read once
            sentences = [list(pre) if isinstance(pre, Iterator) else pre for pre in sentences]
        sents = document_sentences(documents, sentences, self.max_sentence_words)
        if sentences is not None:  # kept_sentences numbers the given list: the metadata's own must not stand beside it
            documents = [
                replace(d, metadata={**d.metadata, "sentences": list(pre)})
                if pre is not None and d.metadata and is_split(d.metadata.get("sentences"))
                else d
                for d, pre in zip(documents, sentences)
            ]
        # (titles alone: nothing to prune, and each comes back with its title, as beside a passage with text;
        # refused, a retrieval of image nodes or title-only records failed a whole chain)
        if not any(sents) and all(is_blank(d.title or "") for d in documents):
            raise InputError(f"the {len(documents)} document(s) hold no text to prune; pass non-empty passages")
        if not any(sents):
            return documents, [], []
        chunks = self._plan(query, documents, sents)
        return documents, chunks, scored_sentences(documents, sents, chunks)

    # -- segmentation and prompt planning ----------------------------------------------------
    def _planner(self) -> PromptPlanner:
        return PromptPlanner(
            self.llm.tokenizer, self.prompt_kw, self.max_prompt_tokens, self.hint_ids, self.max_sentence_words
        )

    def _plan(self, query: str, docs: list[Document], sents: list[list[Sentence]]) -> list[Chunk]:
        """Prompts covering every sentence, each within ``max_prompt_tokens``."""
        planner = self._planner()
        pieces = [make_piece(i, s, range(len(s))) for i, s in enumerate(sents) if s]
        if self.config.attention == "block":  # blocks are independent: one prompt holds them all
            chunk = planner.build_blocks(query, docs, sents, pieces)
            needed = planner.block_reach(chunk, self.config.block_positions)
            if needed > self.max_prompt_tokens:
                raise InputError(
                    f"the block-attention pruning prompt reaches position {needed} > max_prompt_tokens="
                    f"{self.max_prompt_tokens}; give fewer or shorter passages, or prune with attention='full', "
                    "which scores a long context in chunks"
                )
            # (the query's rows come after every block in the cache: a sliding layer's read its latest keys only)
            prompt = cast(BlockPrompt, chunk.pair)
            suffix = max(len(prompt.real_suffix_ids), len(prompt.calibration_suffix_ids)) + len(planner.hint_ids)
            held = len(prompt.context_ids) + suffix
            if self.read_window is not None and held > self.read_window:
                raise InputError(
                    f"the block-attention pruning prompt holds {held} tokens > "
                    f"{self.read_window}, the most a sliding-window layer of the heads reads; give fewer or shorter "
                    "passages, or prune with attention='full', which scores a long context in chunks"
                )
            return [chunk]
        whole = planner.build(query, docs, sents, pieces)
        if whole.length <= self.max_prompt_tokens:
            return [whole]
        chunks = planner.pack(query, docs, sents, pieces)
        logger.info(
            "pruning prompt of %d tokens > max_prompt_tokens=%d: scored in %d chunks",
            whole.length,
            self.max_prompt_tokens,
            len(chunks),
        )
        return chunks

    # -- scoring -----------------------------------------------------------------------------
    def _score(
        self, query: str, chunks: list[Chunk], scored: list[ScoredSentence], features: bool = False
    ) -> np.ndarray | None:
        """Fill in the ``score`` of every sentence, one forward pass pair per chunk; return the
        per-head sentence scores ``[S, H]`` when asked for (or needed by the probe)."""
        index = {(s.doc_index, s.sentence_index): i for i, s in enumerate(scored)}
        feats = None
        content_free: set[int] = set()  # (sink filtering: sentences it reads no token of)
        for chunk in chunks:
            flat = [span for spans in chunk.spans for span in spans]
            rows, empty = self._rows(chunk.pair, flat)
            at = [index[(p.doc_index, k)] for p in chunk.pieces for k in p.sent_ids]
            content_free.update(i for i, e in zip(at, empty) if e)
            norms = np.array([math.sqrt(e - s) if self.length_norm == "sqrt" else 1.0 for s, e in flat])
            sums = document_scores(token_scores(rows), flat, use_filter=self.token_filter)
            for i, value, norm in zip(at, sums, norms):
                scored[i].score = float(value / norm)
            if features or self.probe is not None:
                feats = np.zeros((len(scored), rows.shape[0])) if feats is None else feats
                feats[at] = (per_head_document_scores(rows, flat, use_filter=False) / norms).T
        if self.probe is not None and feats is not None:
            lexical = lexical_scores(query, [s.text for s in scored]) if "bm25" in self.probe.extras else None
            values = self.probe.score(feats, [(s.doc_index, s.sentence_index) for s in scored], lexical)
            for s, value in zip(scored, values):
                s.score = float(value)
        if content_free:
            values = content_free_last(
                np.array([s.score for s in scored]), [i in content_free for i in range(len(scored))]
            )
            for s, value in zip(scored, values):
                s.score = float(value)
        return feats

    def _rows(self, pair: RerankPromptPair | BlockPrompt, spans: list[Span]) -> tuple[np.ndarray, list[bool]]:
        """``[heads, context tokens]`` rows of the query span or focus token, calibrated (and
        sink-filtered over the content tokens of ``spans`` when ``sink``), and for each span
        whether sink filtering read none of its tokens (none has content)."""
        span = "last" if self.method == "focus" else "full"
        if isinstance(pair, BlockPrompt):
            if self._block_prefix is None:  # the same for every query: prefilled once
                self._block_prefix = self.capturer.prefill(pair.prefix_ids)
            w = capture_blocks(
                self.capturer,
                pair,
                self._block_prefix,
                fingerprint=self.llm.weights_key,
                positions=self.config.block_positions,
                calibrate=self.calibrate,
                query_span=span,
                states=self.states,
                extra_ids=self.hint_ids,
                buffer=self._context_buffer,
            )
        else:
            w = capture_window(
                self.capturer, pair, calibrate=self.calibrate, extra_ids=self.hint_ids, query_span=span, spans=spans
            )
        if self.sink:
            mask = content_mask(self.llm.tokenizer.convert_ids_to_tokens(w.input_ids), spans, labelled=False)
            return sink_filtered_rows(w.real, w.null, mask), spans_without(mask, spans)
        return w.rows, [False] * len(spans)


def _nothing_kept(result: PrunedContext, target: int) -> None:
    """Say (logged, and in ``result``'s notes) that no sentence fits the budget of ``target`` tokens."""
    note = f"no sentence fits the budget of {target} tokens: nothing kept"
    logger.warning(note)
    result.notes.append(note)
