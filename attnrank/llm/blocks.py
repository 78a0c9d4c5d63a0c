"""Block attention: passages encoded independently, their key/value states reusable.

In the full prompt every passage attends to every passage before it, so a prefill costs
``O(n²)`` in the prompt length and nothing can be reused across queries. In *block attention*
(BlockRank, Gupta et al. arXiv 2510.05396; Block-Attention, Sun et al. arXiv 2409.15355) each
passage block attends only to the shared prefix (chat header and opening line) and to itself;
only the query suffix attends to everything. Cost then grows linearly with the number of
passages, and a block's key/value states depend on nothing but its own text: they can be
computed once and reused by every later query that retrieves the passage
(:mod:`attnrank.llm.states`).

Prompt (the full prompt's text, without the ``[i]`` numbers, which would tie a block to its
slot)::

    {chat prefix}Here are some paragraphs:\\n\\n  |  {title}\\n{text}\\n\\n  | ... |  {late instruction}\\n\\nQuery: {query}{chat suffix}
    prefix (shared)                                  one block per passage      suffix (real query / "N/A")

Position scheme (``positions``):

- ``"shared"`` (BlockRank's permutation-invariant positions, as in parallel context windows): every block starts at the position right after the prefix; the suffix continues
  after the longest block. A block's states are then the same in every prompt: reusable.
- ``"sequential"``: blocks take the positions they would have in the full prompt (prefix, then
  the blocks in prompt order) and the suffix continues after the last one. Closer to the full
  prompt's geometry, but a block's states depend on where it lands, so they are recomputed.
- ``"rotated"`` (Block-Attention's position re-encoding, training-free): states are computed
  (and reused) at the shared positions, and at assembly each block's cached keys are rotated to
  its sequential positions (rotary embeddings compose: ``R(a)R(b) = R(a+b)``); the suffix sits
  where ``"sequential"`` puts it. Exact in the first layer; deeper layers keep what the block
  computed at the shared positions (its distance to the prefix), an approximation. The
  reranker's and pruner's default: it measured best of the reusable schemes (``shared`` drops
  the first-stage order's position prior; docs/benchmarks.md, "Block attention").

The suffix's attention rows are captured over the assembled context ``prefix + blocks`` exactly
as in the full prompt (:func:`attnrank.llm.capture.capture_blocks`), so every scorer, the
calibration and the learned weights read them unchanged.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Generic, Protocol, TypeVar, cast

import numpy as np

from attnrank.errors import InputError
from attnrank.types import Document

from .chat import chat_frame
from .prompts import (
    CALIBRATION_QUERY,
    OPENING,
    SEPARATOR,
    Span,
    encode_cut,
    late_instruction,
    prompt_documents,
    prompt_positions,
    query_tail,
    suffix_range,
)
from .truncation import Truncation, truncate_texts

ATTENTION_MODES = ("full", "block")
BLOCK_POSITIONS = ("shared", "sequential", "rotated")
_NEXT = "x"  # a letter after the block's separator: what follows a block in every prompt


@dataclass
class BlockPrompt:
    """A reranking prompt cut into a shared prefix, one block per passage and the suffixes.

    ``blocks[i]`` are the ids of input document ``i`` (its text, then the separator);
    ``text_lengths[i]`` how many of them are the passage text (the rest is the separator);
    ``order[p]`` the input index of the block at prompt position ``p``.
    """

    prefix_ids: list[int]
    blocks: list[list[int]]
    text_lengths: list[int]
    order: list[int]
    real_suffix_ids: list[int]
    calibration_suffix_ids: list[int]
    doc_ids: list[str] = field(default_factory=list)
    truncated: list[Truncation] = field(default_factory=list)
    offsets: list[list[Span]] = field(default_factory=list)  # per block: each token's characters in its text

    def starts(self, positions: str) -> list[int]:
        """The first position id of each block (input order) under the position scheme."""
        check_positions(positions)
        base = len(self.prefix_ids)
        if positions == "shared":  # ("rotated" places the blocks where "sequential" does)
            return [base] * len(self.blocks)
        out = [0] * len(self.blocks)
        for i in self.order:
            out[i] = base
            base += len(self.blocks[i])
        return out

    def suffix_start(self, positions: str) -> int:
        """The position id of the suffix's first token."""
        check_positions(positions)
        lengths = [len(b) for b in self.blocks]
        return len(self.prefix_ids) + (max(lengths) if positions == "shared" else sum(lengths))

    def select(self, indices: Sequence[int], order: str) -> BlockPrompt:
        """The block prompt of input documents ``indices`` only, arranged by ``order`` (the one
        this prompt was built with), as :func:`build_block_prompts` would make it, without
        tokenizing again: a block's ids do not depend on its neighbours. Reranking windows are
        cut this way."""
        at = {i: j for j, i in enumerate(indices)}
        cuts = sorted((t for t in self.truncated if t.doc_index in at), key=lambda t: at[t.doc_index])
        return BlockPrompt(
            self.prefix_ids,
            [self.blocks[i] for i in indices],
            [self.text_lengths[i] for i in indices],
            prompt_positions(len(indices), order),
            self.real_suffix_ids,
            self.calibration_suffix_ids,
            [self.doc_ids[i] for i in indices],
            [replace(t, doc_index=at[t.doc_index]) for t in cuts],  # (stable: a word cut stays first)
            [self.offsets[i] for i in indices] if self.offsets else [],
        )

    @property
    def context_ids(self) -> list[int]:
        """The assembled context: prefix, then the blocks in prompt order."""
        return self.prefix_ids + [t for i in self.order for t in self.blocks[i]]

    def text_token_span(self, i: int, lo: int, hi: int) -> Span:
        """The :attr:`context_ids` tokens overlapping characters ``[lo, hi)`` of input document
        ``i``'s (truncated) text: ``[first token ending after lo, first token starting at/after hi)``."""
        starts, ends = self._token_bounds[i]
        at = self.doc_spans[i][0]
        return at + bisect.bisect_right(ends, lo), at + bisect.bisect_left(starts, hi)

    @cached_property
    def _token_bounds(self) -> list[tuple[list[int], list[int]]]:
        """Per block, its tokens' character starts and ends (for :meth:`text_token_span`)."""
        return [([a for a, _ in offs], [b for _, b in offs]) for offs in self.offsets]

    @cached_property
    def doc_spans(self) -> list[Span]:
        """Each input document's text span in :attr:`context_ids` (separator excluded)."""
        spans: list[Span] = [(0, 0)] * len(self.blocks)
        at = len(self.prefix_ids)
        for i in self.order:
            spans[i] = (at, at + self.text_lengths[i])
            at += len(self.blocks[i])
        return spans


def check_positions(positions: str) -> str:
    if positions not in BLOCK_POSITIONS:
        raise InputError(f"block_positions={positions!r} is not one of {BLOCK_POSITIONS}")
    return positions


def check_attention_mode(mode: str) -> str:
    if mode not in ATTENTION_MODES:
        raise InputError(f"attention={mode!r} is not one of {ATTENTION_MODES}")
    return mode


def capture_name(attention: str, positions: str) -> str:
    """How attention is captured, as one name: ``"full"`` or ``"block:POSITIONS"`` (what trained
    weights record, so that a reranker capturing otherwise can say so)."""
    return "full" if check_attention_mode(attention) == "full" else f"block:{check_positions(positions)}"


def block_text(title: str, text: str) -> str:
    """One passage as a block's text (no slot number: a block must not depend on its slot)."""
    title, text = (title or "").strip(), str(text).strip()
    return f"{title}\n{text}" if title else text


def build_block_prompts(
    tokenizer: object,
    query: str,
    docs: Sequence[Document | str],
    *,
    calibration_query: str = CALIBRATION_QUERY,
    instruction: str = "ie",
    order: str = "reverse",
    max_doc_words: int | None = None,
    max_doc_tokens: int | None = None,
    memo: BlockMemo[EncodedBlock] | None = None,
) -> BlockPrompt:
    """Tokenize the block-attention prompt of ``docs`` for ``query`` (the options of
    :func:`~attnrank.llm.prompts.build_rerank_prompts`, except that no word cut applies unless
    ``max_doc_words`` is given: the reranker always gives its own). Each block is tokenized as it stands
    after a separator and before a letter, so its ids do not depend on its neighbours; ``memo``
    keeps them for later prompts of the same passages."""
    documents = prompt_documents(docs)
    late = late_instruction(instruction)
    positions = prompt_positions(len(documents), order)
    blocks, lengths, truncated, offsets = encode_blocks_text(tokenizer, documents, max_doc_words, max_doc_tokens, memo)
    frame = chat_frame(tokenizer)

    def suffix(q: str) -> list[int]:
        whole = SEPARATOR + query_tail(late, q, frame)
        return encode_cut(tokenizer, whole, len(SEPARATOR), None, controls=[suffix_range(whole, frame)])[0]

    return BlockPrompt(
        block_prefix_ids(tokenizer),
        blocks,
        lengths,
        positions,
        suffix(query),
        suffix(calibration_query),
        [d.id for d in documents],
        truncated,
        offsets,
    )


def block_prefix_ids(tokenizer: object) -> list[int]:
    """The shared prefix every block attends to: lead ids, chat header, opening line, separator."""
    frame = chat_frame(tokenizer)
    joiner = "" if not frame.prefix or frame.prefix[-1].isspace() else " "
    head = frame.prefix + joiner + OPENING + SEPARATOR
    return (
        list(frame.lead_ids) + encode_cut(tokenizer, head + _NEXT, 0, len(head), controls=[(0, len(frame.prefix))])[0]
    )


def encode_blocks_text(
    tokenizer: object,
    documents: Sequence[Document],
    max_doc_words: int | None,
    max_doc_tokens: int | None,
    memo: BlockMemo[EncodedBlock] | None = None,
) -> tuple[list[list[int]], list[int], list[Truncation], list[list[Span]]]:
    """Each document's block ids (title and text, then the separator), how many of them precede
    the separator, the cuts, and each token's character range in the document's text (the
    title's tokens get negative ones). Documents ``memo`` holds are not tokenized again."""
    keys = [memo_key(d, max_doc_words, max_doc_tokens) for d in documents]
    if memo is not None:
        memo.bind(tokenizer)
    found = [None if memo is None else memo.get(k) for k in keys]
    todo = [i for i, e in enumerate(found) if e is None]
    texts, cuts = truncate_texts(tokenizer, [documents[i] for i in todo], max_doc_words, max_doc_tokens)
    cuts_of: dict[int, list[Truncation]] = {}
    for c in cuts:  # a text cut to max_doc_words and then to max_doc_tokens has two cuts
        cuts_of.setdefault(todo[c.doc_index], []).append(c)
    for i, text in zip(todo, texts):
        found[i] = entry = _encode_block(tokenizer, documents[i].title, text, tuple(cuts_of.get(i, ())))
        if memo is not None:
            memo.put(keys[i], entry)
    encoded = cast(list[EncodedBlock], found)  # every document is now found or encoded
    truncated = [
        replace(c, doc_index=i, doc_id=d.id) for i, (d, e) in enumerate(zip(documents, encoded)) for c in e.cuts
    ]
    return (
        [e.ids.tolist() for e in encoded],
        [e.text_length for e in encoded],
        truncated,
        [[(a, b) for a, b in e.offsets.tolist()] for e in encoded],
    )


@dataclass(frozen=True)
class EncodedBlock:
    """One passage tokenized as a block: its ids (text, then the separator; int32), how many
    precede the separator, each token's characters in the text (int32 ``[n, 2]``) and the cuts
    that shortened it (none if whole)."""

    ids: np.ndarray
    text_length: int
    offsets: np.ndarray
    cuts: tuple[Truncation, ...]

    @property
    def nbytes(self) -> int:
        return int(self.ids.nbytes + self.offsets.nbytes)


def _encode_block(tokenizer: object, title: str, text: str, cuts: tuple[Truncation, ...]) -> EncodedBlock:
    body = block_text(title, text)
    whole = SEPARATOR + body + SEPARATOR
    ids, offsets = encode_cut(tokenizer, whole + _NEXT, len(SEPARATOR), len(whole))
    length = sum(a < len(SEPARATOR) + len(body) for a, _ in offsets)
    text_at = len(SEPARATOR) + len(body) - len(text.strip()) - (len(text) - len(text.lstrip()))
    spans = np.asarray([(a - text_at, b - text_at) for a, b in offsets], dtype=np.int32).reshape(-1, 2)
    return EncodedBlock(np.asarray(ids, dtype=np.int32), length, spans, cuts)


def memo_key(doc: Document, max_doc_words: int | None, max_doc_tokens: int | None) -> tuple:
    """A :class:`BlockMemo` key: a digest of the title and text (the memo does not keep the
    texts themselves alive) and the truncation limits."""
    # (a title of None reads as none, as the prompts read it; JSON keeps title and text apart)
    digest = hashlib.blake2b(json.dumps([doc.title or "", doc.text]).encode(), digest_size=16).digest()
    return (digest, max_doc_words, max_doc_tokens)


class _Sized(Protocol):
    @property
    def nbytes(self) -> int: ...


E = TypeVar("E", bound=_Sized)


# What an entry costs beside its arrays' bytes: the key (a tuple holding a digest), the arrays'
# and the entry's object headers and the ordered dict's slot. Measured with tracemalloc: 380
# bytes per entry of 80-token prompt ids (CPython 3.11, NumPy 2); counted without it, a 64 MB
# memo of short passages held about twice that.
ENTRY_OVERHEAD = 384


class BlockMemo(Generic[E]):
    """Recently tokenized passages, least recently used first out past ``max_bytes`` (their
    arrays' bytes and :data:`ENTRY_OVERHEAD` each): a warm query (its passages' states cached)
    then skips tokenizing them too. Keyed by :func:`memo_key`, for one tokenizer (another one
    empties it: :meth:`bind`). Entries are block attention's :class:`EncodedBlock` (about 12
    bytes per token) or whatever else has ``nbytes`` (the query likelihood's prompt ids). Safe to
    share between threads (a reranker's ``rank`` runs in a server's or a framework's threads)."""

    def __init__(self, max_bytes: int = 64 << 20):
        self._lock = threading.Lock()
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._entries: OrderedDict[tuple, E] = OrderedDict()
        self._tokenizer: object | None = None  # held (compared by identity, so never a reused address)

    def bind(self, tokenizer: object) -> None:
        """Serve ``tokenizer``: entries are its ids, so another tokenizer starts the memo afresh."""
        with self._lock:
            if self._tokenizer is not tokenizer:
                self._entries.clear()
                self.nbytes = 0
                self._tokenizer = tokenizer

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._entries.clear()
            self.nbytes = 0

    def get(self, key: tuple) -> E | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: tuple, entry: E) -> None:
        size = entry.nbytes + ENTRY_OVERHEAD
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            self.nbytes += size - (0 if old is None else old.nbytes + ENTRY_OVERHEAD)
            self._entries[key] = entry
            while self.nbytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self.nbytes -= evicted.nbytes + ENTRY_OVERHEAD
