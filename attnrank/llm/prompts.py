"""Prompts: the in-context reranking prompt of ICR / QRHead, and a short-answer QA prompt.

The reranking prompt (ICR, Chen et al., ICLR 2025, arXiv 2410.02642; QRHead, Zhang et al.,
EMNLP 2025) is, with the model's chat template around it::

    {chat prefix}Here are some paragraphs:\\n\\n[1] {title}\\n{text}\\n\\n ... [N] ...\\n\\n
    {late instruction}\\n\\nQuery: {query}{chat suffix}

Documents come in first-stage order (``docs[0]`` = rank 1); by default (``order="reverse"``,
ICR's ``--reverse_doc_order``) rank 1 is placed last, nearest the query. ``[i]`` numbers
prompt positions. The prompt is tokenized in two parts, the *context* (everything before the
late instruction, ending with the separator) and the *query part* (instruction, query, chat
suffix), and the ids are concatenated; so the context ids (``input_ids[:query_start]``) do not
depend on the query, and a KV cache of the context can serve both the real query and ICR's
content-free calibration query ``"N/A"``. Each part is tokenized with its neighbouring text
present and then cut at the boundary, so the ids equal those of tokenizing the whole string for
tokenizers whose pre-tokenization splits at a newline/letter boundary (GPT-2, Llama 3, Qwen2,
SentencePiece); a tokenizer that merges across it is refused rather than silently misaligned.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from attnrank.errors import InputError, ModelError
from attnrank.types import Document, ScoredDocument, as_documents, check_texts, check_unicode, is_blank

from .chat import ChatFrame, chat_frame
from .texts import Span, tokenize
from .truncation import Truncation, truncate_texts

SEPARATOR = "\n\n"
OPENING = "Here are some paragraphs:"
INSTRUCTIONS = {
    "ie": "Please find information that are relevant to the following query in the paragraphs above.",
    "qa": "Please answer the following question based on the information in the paragraphs above.",
}
CALIBRATION_QUERY = "N/A"
DEFAULT_MAX_DOC_WORDS = 300  # ICR's --truncate_by_space 300
ANSWER_INSTRUCTION = (
    "Answer the question based on the context below. Give a short answer (a few words), without explanation."
)


@dataclass
class RerankPrompt:
    """A tokenized reranking prompt and where each document and the query lie in it.

    ``doc_spans[i]`` is the token range ``[start, end)`` of the block ``[k] title\\ntext`` of
    input document ``i`` (original index, whatever its position); ``query_start`` is the first
    token of the late instruction, and the query span runs to the end (chat suffix included).
    ``offsets[t]`` is token ``t``'s character range in ``text`` ((0, 0) for an added BOS).
    """

    input_ids: list[int]
    offsets: list[Span]
    doc_spans: list[Span]
    query_start: int
    text: str
    query: str
    order: list[int]  # order[p] = input index of the document at prompt position p
    truncated: list[Truncation] = field(default_factory=list)

    @property
    def query_end(self) -> int:
        return len(self.input_ids)

    @property
    def prefix_ids(self) -> list[int]:
        """The query-independent context ids (reusable as a KV-cache prefix)."""
        return self.input_ids[: self.query_start]

    @property
    def suffix_ids(self) -> list[int]:
        return self.input_ids[self.query_start :]


@dataclass
class RerankPromptPair:
    """The real-query and calibration prompts of one document list; they share the context."""

    real: RerankPrompt
    calibration: RerankPrompt

    @property
    def prefix_ids(self) -> list[int]:
        return self.real.prefix_ids

    @property
    def real_suffix_ids(self) -> list[int]:
        return self.real.suffix_ids

    @property
    def calibration_suffix_ids(self) -> list[int]:
        return self.calibration.suffix_ids

    @property
    def doc_spans(self) -> list[Span]:
        return self.real.doc_spans

    @property
    def query_start(self) -> int:
        return self.real.query_start

    @property
    def truncated(self) -> list[Truncation]:
        return self.real.truncated


def build_rerank_prompts(
    tokenizer: Any,
    query: str,
    docs: Sequence[Document | str],
    *,
    calibration_query: str = CALIBRATION_QUERY,
    instruction: str = "ie",
    order: str = "reverse",
    max_doc_words: int | None = DEFAULT_MAX_DOC_WORDS,
    max_doc_tokens: int | None = None,
) -> RerankPromptPair:
    """The real and calibration prompts, built on one shared context (for two-suffix KV reuse).

    ``pair.prefix_ids`` is prefilled once; ``pair.real_suffix_ids`` and
    ``pair.calibration_suffix_ids`` continue it.

    ``instruction``: ``"ie"`` (default), ``"qa"`` or a custom late-instruction string.
    ``order``: ``"reverse"`` (rank 1 nearest the query) or ``"forward"``. Documents' text is
    cut to ``max_doc_words`` words, then ``max_doc_tokens`` tokens (None = no limit); every cut
    is reported in ``truncated`` and logged.
    """
    context = _Context.build(tokenizer, docs, instruction, order, max_doc_words, max_doc_tokens)
    return RerankPromptPair(context.with_query(query), context.with_query(calibration_query))


def build_answer_prompt(tokenizer: Any, question: str, context_passages: Sequence[Any] = ()) -> str:
    """A chat-formatted prompt asking for a short answer to ``question`` from the passages.

    Passages may be :class:`Document`, :class:`~attnrank.types.ScoredDocument` or ``str`` (or a
    :class:`~attnrank.types.RankedResults`); any other type is refused.
    Encode the returned text with :func:`~attnrank.llm.chat.encode_text` (it may already contain
    the BOS token).
    """
    if not question or is_blank(question):
        raise InputError("question is empty; pass the question to answer")
    # (as_documents refuses any other type in one line: a dict failed here, as an AttributeError)
    blocks = [_block(i, p.title, p.text) for i, p in enumerate(as_documents(context_passages)[0], start=1)]
    check_unicode(blocks, "context passage")  # (a lone surrogate failed inside the tokenizer, naming none)
    parts = [ANSWER_INSTRUCTION]
    if blocks:
        parts.append("Context:\n" + SEPARATOR.join(blocks))
    parts.append(f"Question: {question.strip()}")
    frame = chat_frame(tokenizer)
    body = SEPARATOR.join(parts)
    return f"{frame.prefix}{body}{frame.suffix}" if frame.prefix else f"{body}\nAnswer:"


def prompt_documents(docs: Sequence[Document | ScoredDocument | str]) -> list[Document]:
    """The passages of a prompt as documents (:func:`attnrank.types.as_documents`: a plain string
    gets its position as id; any other type is refused, not put in the prompt as its repr); at
    least one."""
    documents = as_documents(docs)[0]
    if not documents:
        raise InputError("no documents to rerank; pass at least one document")
    check_texts(documents)  # (windows() and the block builder met an empty one here, unchecked)
    return documents


def late_instruction(instruction: str) -> str:
    """The late instruction text for ``"ie"``, ``"qa"`` or a custom text (error if empty)."""
    late = INSTRUCTIONS.get(instruction.lower(), instruction).strip() if instruction else ""
    if not late:
        raise InputError(f"instruction={instruction!r} is empty; use 'ie', 'qa' or a text")
    return late


def prompt_positions(n: int, order: str) -> list[int]:
    """``positions[p]`` = input index of the document at prompt position ``p``."""
    if order not in ("reverse", "forward"):
        raise InputError(f"order={order!r} is not 'reverse' or 'forward'")
    return list(range(n))[:: -1 if order == "reverse" else 1]


def suffix_range(text: str, frame: ChatFrame) -> Span:
    """The characters of ``text`` (ending with a :func:`query_tail`) that are the chat suffix."""
    return (len(text) - len(frame.suffix), len(text))


def query_tail(instruction: str, query: str, frame: ChatFrame) -> str:
    """The query part of a reranking prompt: late instruction, query, chat suffix."""
    if not query or is_blank(query):
        raise InputError(
            f"query is empty; pass the query to rerank for (the calibration query is {CALIBRATION_QUERY!r})"
        )
    return f"{instruction}{SEPARATOR}Query: {query.strip()}{frame.suffix}"


# --------------------------------------------------------------------------- internals


def _block(position: int, title: str, text: str) -> str:
    title, text = (title or "").strip(), str(text).strip()
    return f"[{position}] {title}\n{text}" if title else f"[{position}] {text}"


@dataclass
class _Context:
    """The tokenized, query-independent part of a reranking prompt."""

    tokenizer: Any
    frame: ChatFrame
    instruction: str
    text: str  # ends with SEPARATOR
    ids: list[int]
    offsets: list[Span]
    doc_spans: list[Span]
    order: list[int]
    truncated: list[Truncation]

    @classmethod
    def build(
        cls,
        tokenizer: Any,
        docs: Sequence[Document | str],
        instruction: str,
        order: str,
        max_words: int | None,
        max_tokens: int | None,
    ) -> _Context:
        documents = prompt_documents(docs)
        late = late_instruction(instruction)
        positions = prompt_positions(len(documents), order)
        texts, truncated = truncate_texts(tokenizer, documents, max_words, max_tokens)
        frame = chat_frame(tokenizer)
        joiner = "" if not frame.prefix or frame.prefix[-1].isspace() else " "
        text = frame.prefix + joiner + OPENING + SEPARATOR
        char_spans: dict[int, Span] = {}
        for p, i in enumerate(positions, start=1):
            block = _block(p, documents[i].title, texts[i])
            char_spans[i] = (len(text), len(text) + len(block))
            text += block + SEPARATOR
        ids, offsets = encode_cut(tokenizer, text + late, 0, len(text), controls=[(0, len(frame.prefix))])
        lead = list(frame.lead_ids)
        ids, offsets = lead + ids, [(0, 0)] * len(lead) + offsets
        spans = _token_spans(offsets, len(lead), [char_spans[i] for i in range(len(documents))])
        return cls(tokenizer, frame, late, text, ids, offsets, spans, positions, truncated)

    def with_query(self, query: str) -> RerankPrompt:
        tail = query_tail(self.instruction, query, self.frame)
        # Tokenize after the separator (as in the whole prompt), keep only the tail's tokens.
        whole = SEPARATOR + tail
        ids, offsets = encode_cut(
            self.tokenizer, whole, len(SEPARATOR), None, controls=[suffix_range(whole, self.frame)]
        )
        shift = len(self.text) - len(SEPARATOR)
        offsets = [(a + shift, b + shift) for a, b in offsets]
        return RerankPrompt(
            input_ids=self.ids + ids,
            offsets=self.offsets + offsets,
            doc_spans=self.doc_spans,
            query_start=len(self.ids),
            text=self.text + tail,
            query=query.strip(),
            order=list(self.order),
            truncated=list(self.truncated),
        )


def encode_cut(
    tokenizer: Any, text: str, lo: int, hi: int | None, *, controls: Sequence[Span] = ()
) -> tuple[list[int], list[Span]]:
    """Tokens of ``text[lo:hi]`` as tokenized within the whole ``text`` (no special tokens added;
    control tokens only in the character ranges ``controls``, :func:`tokenize`).

    Raises :class:`ModelError` when a token crosses ``lo`` or ``hi``.
    """
    enc = tokenize(tokenizer, text, controls=controls, offsets=True)
    hi = len(text) if hi is None else hi
    ids: list[int] = []
    offsets: list[Span] = []
    for tok, (a, b) in zip(enc["input_ids"], enc["offset_mapping"]):
        if a < lo < b or a < hi < b:
            raise ModelError(
                f"the tokenizer merges text across the prompt boundary at "
                f"character {lo if a < lo < b else hi} ({text[a:b]!r}); the "
                "context/query split of the reranking prompt needs a token "
                "boundary there"
            )
        if lo <= a < hi or (a == b == lo and lo < hi):
            ids.append(tok)
            offsets.append((a, b))
    return ids, offsets


def _token_spans(offsets: list[Span], first: int, char_spans: list[Span]) -> list[Span]:
    """Token range ``[s, e)`` of the tokens overlapping each character range ``[start, end)``.

    Offsets of one tokenized text are non-decreasing, so binary searches suffice.
    """
    starts, ends = [a for a, _ in offsets], [b for _, b in offsets]
    spans = []
    for start, end in char_spans:
        s = bisect.bisect_right(ends, start, lo=first)  # first token ending after ``start``
        e = bisect.bisect_left(starts, end, lo=first)  # first token starting at/after ``end``
        if s >= e:  # pragma: no cover - a block is never empty
            raise ModelError(f"no token covers characters {start}..{end} of the prompt")
        spans.append((s, e))
    return spans
