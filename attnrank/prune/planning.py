"""The scoring prompts of a pruning call: passages (or runs of their sentences) packed into
prompts of at most ``max_prompt_tokens`` tokens, each sentence's token span in them, and the
error that names what takes the room when a sentence cannot fit. Tokenizer work only, no model
call; :class:`~attnrank.prune.pruner.ContextPruner` decides when to chunk (see its module doc)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from ..errors import InputError, SentenceTooLong
from ..llm.blocks import BlockPrompt, build_block_prompts
from ..llm.prompts import RerankPromptPair, build_rerank_prompts
from ..llm.texts import tokenize
from ..rerank.windows import block_extent, prompt_extent
from ..types import Document
from .config import PruneConfig
from .context import ScoredSentence
from .segment import Sentence
from .spans import Piece, block_sentence_spans, make_piece, sentence_spans

Span = tuple[int, int]


# Fewer tokens than this left by the prompt around a sentence: no sentence fits, whatever its cut.
MIN_ROOM = 8


@dataclass
class Chunk:
    """One scoring prompt: its pieces, the real/"N/A" prompt pair, each sentence's token span."""

    pieces: list[Piece]
    pair: RerankPromptPair | BlockPrompt  # BlockPrompt in block-attention mode
    spans: list[list[Span]]
    length: int  # tokens of the longer of the two prompts, focus hint included


@dataclass
class PromptPlanner:
    """Builds the pruner's prompts with ``tokenizer`` and ``prompt_kw`` (the arguments of
    :func:`~attnrank.llm.prompts.build_rerank_prompts`); ``hint_ids``: the focus hint's tokens,
    counted in every prompt's length; ``max_sentence_words`` is named in the misfit error."""

    tokenizer: Any
    prompt_kw: dict[str, Any]
    max_prompt_tokens: int
    hint_ids: list[int]
    max_sentence_words: int

    def pack(self, query: str, docs: list[Document], sents, pieces: list[Piece]) -> list[Chunk]:
        """Consecutive ``pieces`` packed into the fewest prompts that fit, of about equal sentence
        tokens (a piece that cannot fit alone cut between sentences first).

        Why balanced: a prompt's attention is shared among its own context tokens, so the
        sentences of a small prompt (filled greedily, the last one could hold one short passage)
        get larger calibrated scores and win the one selection over all prompts."""
        units: list[Piece] = []
        for p in pieces:
            alone = self.build(query, docs, sents, [p])
            units += [p] if alone.length <= self.max_prompt_tokens else self.split(query, docs, sents, p)
        greedy = self.fill(query, docs, sents, units)
        if len(greedy) < 2:
            return greedy
        weights = [sum(e - s for s, e in self.build(query, docs, sents, [u]).spans[0]) for u in units]
        groups = consecutive_groups(weights, len(greedy))
        chunks = [self.build(query, docs, sents, [units[i] for i in g]) for g in groups]
        # (the most even split by sentence tokens; its prompts, titles and all, may still not fit)
        return chunks if all(c.length <= self.max_prompt_tokens for c in chunks) else greedy

    def fill(self, query: str, docs: list[Document], sents, units: list[Piece]) -> list[Chunk]:
        """``units`` packed in order, each prompt filled as far as it fits (the fewest prompts)."""
        chunks: list[Chunk] = []
        cur: Chunk | None = None
        for u in units:
            trial = self.build(query, docs, sents, (cur.pieces if cur else []) + [u])
            if trial.length <= self.max_prompt_tokens:
                cur = trial
            else:
                if cur is not None:
                    chunks.append(cur)
                cur = self.build(query, docs, sents, [u])
        if cur is not None:
            chunks.append(cur)
        return chunks

    def split(self, query: str, docs, sents, piece: Piece) -> list[Piece]:
        """Cut one passage that cannot fit a prompt between sentences into runs that fit."""
        doc_sents = sents[piece.doc_index]
        out: list[Piece] = []
        run: list[int] = []
        for k in piece.sent_ids:
            if self.fits(query, docs, sents, make_piece(piece.doc_index, doc_sents, run + [k])):
                run.append(k)
                continue
            if not run or not self.fits(query, docs, sents, make_piece(piece.doc_index, doc_sents, [k])):
                raise self.misfit(query, docs, sents, make_piece(piece.doc_index, doc_sents, [k]))
            out.append(make_piece(piece.doc_index, doc_sents, run))
            run = [k]
        out.append(make_piece(piece.doc_index, doc_sents, run))
        return out

    def misfit(self, query: str, docs, sents, piece: Piece) -> SentenceTooLong:
        """The error for a one-sentence ``piece`` that does not fit a prompt, naming what takes
        the room: the sentence, or a long query (then every passage would fail the same way)."""
        alone = self.build(query, docs, sents, [piece])
        s, e = alone.spans[0][0]
        where = f"max_prompt_tokens={self.max_prompt_tokens}"
        n = len(tokenize(self.tokenizer, query.strip())["input_ids"])
        if 2 * n > self.max_prompt_tokens:
            return SentenceTooLong(
                f"the query ({n} tokens) and the prompt around it take {alone.length - (e - s)} tokens of "
                f"{where}, leaving too little for the passages",
                "shorten the query or raise max_prompt_tokens",
                "shorten the query",
            )
        sentence = sents[piece.doc_index][piece.sent_ids[0]]
        if sentence.given is not None:  # the caller's own sentence: max_sentence_words does not cut those
            name, fix = f"pre-split sentence #{sentence.given}", "split it in the sentences given"
            remedy: str | None = fix
        else:
            name, fix = f"sentence {piece.sent_ids[0]}", f"lower max_sentence_words (now {self.max_sentence_words})"
            remedy = None
        frame = alone.length - (e - s)
        if self.max_prompt_tokens - frame < MIN_ROOM:  # the frame (a long title, the instructions) took the room
            return SentenceTooLong(
                f"the prompt around {name} of document {docs[piece.doc_index].id!r} (the query, the instructions "
                f"and the document's title) takes {frame} tokens of {where}, leaving "
                f"{max(self.max_prompt_tokens - frame, 0)} for its {e - s}",
                "shorten the title or raise max_prompt_tokens (at most the model's context)",
                "shorten the title",
            )
        return SentenceTooLong(
            f"{name} of document {docs[piece.doc_index].id!r} ({e - s} tokens) does not fit {where} even alone "
            f"(the prompt around it takes {frame})",
            f"{fix} or raise max_prompt_tokens (at most the model's context)",
            remedy,
        )

    def fits(self, query: str, docs, sents, piece: Piece) -> bool:
        return self.build(query, docs, sents, [piece]).length <= self.max_prompt_tokens

    def build(self, query: str, docs: list[Document], sents, pieces: list[Piece]) -> Chunk:
        """The full-attention prompt pair of ``pieces`` (each passage cut to its pieces' text)."""
        texts = [
            Document(docs[p.doc_index].id, docs[p.doc_index].text[p.lo : p.hi], docs[p.doc_index].title) for p in pieces
        ]
        pair = build_rerank_prompts(self.tokenizer, query, texts, **self.prompt_kw)
        spans = sentence_spans(pair, texts, pieces, sents)
        length = prompt_extent(pair, calibrate=True) + len(self.hint_ids)
        return Chunk(pieces, pair, spans, length)

    def build_blocks(self, query: str, docs: list[Document], sents, pieces: list[Piece]) -> Chunk:
        """The block-attention prompt of ``pieces`` (whole passages: blocks are independent)."""
        texts = [Document(docs[p.doc_index].id, docs[p.doc_index].text, docs[p.doc_index].title) for p in pieces]
        prompt = build_block_prompts(self.tokenizer, query, texts, **self.prompt_kw)
        spans = block_sentence_spans(prompt, texts, pieces, sents)
        return Chunk(pieces, prompt, spans, len(prompt.context_ids) + len(prompt.real_suffix_ids))

    def block_reach(self, chunk: Chunk, positions: str) -> int:
        """Positions a block-attention chunk spans: its suffix's start by the ``positions``
        scheme, its longer suffix and the focus hint."""
        return block_extent(cast(BlockPrompt, chunk.pair), positions) + len(self.hint_ids)

    def check_frame(self, block_positions: str | None, window: bool = False) -> None:
        """Refuse a budget that no prompt fits: the prompt of a one-word query around a one-word
        passage (instructions, focus hint; block attention with ``block_positions``, else full)
        spans more. Found when the pruner is built, rather than at its first call. ``window``: the
        budget is what a sliding-window layer holding a head reads (not a setting to raise)."""
        docs, sents = [Document("frame", "x")], [[Sentence("x", 0, 1)]]
        pieces = [make_piece(0, sents[0], [0])]
        if block_positions is None:
            frame = self.build("x", docs, sents, pieces).length
        else:
            frame = self.block_reach(self.build_blocks("x", docs, sents, pieces), block_positions)
        if frame > self.max_prompt_tokens and window:
            raise InputError(
                f"a sliding-window layer among the heads reads only the last {self.max_prompt_tokens} tokens, and "
                f"the pruning prompt's instructions with a one-word query and passage already span {frame} "
                "positions; choose heads of full-attention layers (heads=, --heads)"
            )
        if frame > self.max_prompt_tokens:
            raise InputError(
                f"max_prompt_tokens={self.max_prompt_tokens} leaves no room for a passage: the pruning prompt's "
                f"instructions with a one-word query and passage already span {frame} positions; raise "
                "max_prompt_tokens (None: LLM.prompt_budget, the model's context less 64)"
            )


def prompt_settings(cfg: PruneConfig) -> dict[str, Any]:
    """The pruner's prompt arguments (:func:`~attnrank.llm.prompts.build_rerank_prompts`'s) from its
    configuration: the sentences are the passages' own, never cut by words or tokens."""
    return dict(instruction=cfg.instruction, order=cfg.order, max_doc_words=None, max_doc_tokens=None)


def hint_ids(tokenizer: Any, cfg: PruneConfig) -> list[int]:
    """The focus hint's token ids (method ``focus``; none otherwise)."""
    return tokenize(tokenizer, cfg.focus_hint.strip())["input_ids"] if cfg.method == "focus" else []


def check_prune_frame(tokenizer: Any, cfg: PruneConfig, max_prompt_tokens: int, window: bool = False) -> None:
    """Refuse a ``max_prompt_tokens`` that not even a one-word passage's pruning prompt of ``cfg``
    fits (:meth:`PromptPlanner.check_frame`; ``window``: it is a sliding window's), read with
    ``tokenizer`` alone: before a model loads."""
    planner = PromptPlanner(
        tokenizer, prompt_settings(cfg), max_prompt_tokens, hint_ids(tokenizer, cfg), cfg.max_sentence_words
    )
    planner.check_frame(cfg.block_positions if cfg.attention == "block" else None, window)


def consecutive_groups(weights: list[int], n: int) -> list[list[int]]:
    """Indices ``0..len(weights)-1`` in at most ``n`` consecutive groups whose heaviest is as light
    as can be (the smallest cap under which filling groups in order needs at most ``n``)."""

    def fill(cap: int) -> list[list[int]]:
        groups: list[list[int]] = [[]]
        total = 0
        for i, w in enumerate(weights):
            if groups[-1] and total + w > cap:
                groups.append([])
                total = 0
            groups[-1].append(i)
            total += w
        return groups

    low, high = max(weights, default=0), sum(weights)
    while low < high:  # the smallest cap that needs at most n groups
        mid = (low + high) // 2
        low, high = (low, mid) if len(fill(mid)) <= n else (mid + 1, high)
    return fill(low)


def scored_sentences(docs: list[Document], sents: list[list[Sentence]], chunks: list[Chunk]) -> list[ScoredSentence]:
    """Every sentence in reading order, with its token count and the chunk that holds it."""
    where = {
        (p.doc_index, k): (c, e - s)
        for c, chunk in enumerate(chunks)
        for p, spans in zip(chunk.pieces, chunk.spans)
        for k, (s, e) in zip(p.sent_ids, spans)
    }
    return [
        ScoredSentence(
            i, docs[i].id, k, s.text, s.start, s.end, where[(i, k)][1], chunk=where[(i, k)][0], given_index=s.given
        )
        for i, doc_sents in enumerate(sents)
        for k, s in enumerate(doc_sents)
    ]
