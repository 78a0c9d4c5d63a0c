"""Query likelihood: how likely the LLM finds the query as a question about each passage.

UPR (Sachan et al., "Improving Passage Retrieval with Zero-Shot Question Generation", EMNLP 2022)
scores a passage ``z`` for a question ``q`` by the language model's mean log-likelihood of the
question's tokens after the passage and an instruction to write a question about it:

    ``s(z) = 1/|q| · Σ_t log p(q_t | q_<t, "Passage: z. Please write a question based on this passage.")``

Our prompt (:func:`passage_prompt`) differs in form, for a decoder-only model: the title (if any)
on the passage's first line, newlines between the parts, and a ``Question:`` cue the query
follows, ``"Passage: {title}\n{text}\nPlease write a question based on this passage.\nQuestion:"``;
the query is scored as ``" " + q`` (the tokenizer's own BOS before the prompt, no special token
after it), and no end-of-sequence token is scored (UPR's T5 scores the question's closing ``</s>``).

The mean and the sum order one query's candidates alike (``|q|`` is the same for all); the mean
keeps the value comparable across queries. Each passage is its own prompt, so a passage's score
does not depend on the other candidates or their order. It is a fused scorer feature
(``"likelihood"``, :mod:`attnrank.rerank.fused`), not an attention score: the preset
``likelihood`` sums its per-query z-score with BM25's and the dense cosine's (or weighs them by a
user's registered :class:`~attnrank.rerank.fused.LikelihoodWeights`, ``attnrank train``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError
from ..llm.blocks import BlockMemo, memo_key
from ..llm.chat import encode_text
from ..llm.context import ContextBuffer
from ..llm.likelihood import DEFAULT_BATCH_TOKENS, continuation_logprob
from ..llm.models import LLM
from ..llm.states import StateCache
from ..llm.texts import tokenize
from ..llm.truncation import truncate_texts
from ..types import Document
from .inputs import check_query

UPR_INSTRUCTION = "Please write a question based on this passage."


def passage_prompt(title: str | None, text: str) -> str:
    """The prompt the query follows (UPR's, with the passage's title on its first line). The title
    and the text are read without their edge whitespace, as the attention prompts read them (a
    title of spaces is none): a passage scores alike however its fields are padded. The text's
    leading whitespace also mattered to the token cut (:func:`~attnrank.llm.truncation.truncate_texts`),
    which counts the text without it: kept, a cut text overran its limit by that whitespace's tokens."""
    title, text = (title or "").strip(), text.strip()
    passage = f"{title}\n{text}" if title else text
    return f"Passage: {passage}\n{UPR_INSTRUCTION}\nQuestion:"


@dataclass(frozen=True)
class PromptIds:
    """One passage's prompt (:func:`passage_prompt`) as token ids (int32), as a memo keeps it."""

    ids: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.ids.nbytes)


def prompt_ids(
    tok: Any,
    docs: Sequence[Document],
    max_doc_words: int | None,
    max_tokens: Sequence[int],
    memo: BlockMemo[PromptIds] | None,
) -> list[list[int]]:
    """Each document's prompt token ids, its text cut to ``max_doc_words`` words then its own
    ``max_tokens[i]`` tokens. ``memo`` (keyed by the text, the title and the word limit, for one
    tokenizer) serves a prompt whose ids number at most that limit: its text then has fewer
    tokens still, so the token cut, which moves with the query's length, cannot have cut it."""
    keys = [(*memo_key(d, max_doc_words, None), "likelihood") for d in docs]
    if memo is not None:
        memo.bind(tok)
    found = [None if memo is None else memo.get(k) for k in keys]
    found = [f if f is not None and len(f.ids) <= limit else None for f, limit in zip(found, max_tokens)]
    for limit in sorted({max_tokens[i] for i, f in enumerate(found) if f is None}):
        todo = [i for i, f in enumerate(found) if f is None and max_tokens[i] == limit]
        texts, cuts = truncate_texts(tok, [docs[i] for i in todo], max_doc_words, limit)
        token_cut = {todo[c.doc_index] for c in cuts if c.unit == "tokens"}
        for i, text in zip(todo, texts):  # (UPR's prompt is plain text, no chat template: controls=())
            entry = PromptIds(
                np.asarray(encode_text(tok, passage_prompt(docs[i].title, text), controls=()), dtype=np.int32)
            )
            found[i] = entry
            if memo is not None and i not in token_cut:  # a token-cut prompt depends on the limit
                memo.put(keys[i], entry)
    return [f.ids.tolist() for f in found if f is not None]


def query_likelihood(
    llm: LLM,
    query: str,
    docs: Sequence[Document],
    *,
    max_doc_words: int | None = None,
    max_doc_tokens: int | None = None,
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
    states: StateCache | None = None,
    buffer: ContextBuffer | None = None,
    memo: BlockMemo[PromptIds] | None = None,
    room: TextRoom | None = None,
) -> np.ndarray:
    """Log-probability (nats, float32) of each of ``query``'s tokens (:func:`query_ids`) after
    each document's prompt (:func:`passage_prompt`): shape [docs, query tokens], input order;
    UPR's score of a document is its row's mean (nats per token). Texts are cut to
    ``max_doc_words`` words, then to ``max_doc_tokens`` tokens and to what the model's context
    leaves beside the query. With ``states``, a prompt scored before (for any
    query) reuses its kept key/value states, so only the query's tokens are computed
    (:func:`~attnrank.llm.likelihood.continuation_logprob`); ``memo`` keeps the prompts'
    token ids, so a passage seen before is not tokenized again. ``room``: :func:`text_room` of
    this query and these documents where the caller has it (it checked them before any work)."""
    tok = llm.tokenizer
    ids, space, title_tokens = room if room is not None else text_room(llm, query, docs)
    # (a max_doc_tokens below 1 reaches truncate_texts, which refuses it)
    limits = [min(space - n, space if max_doc_tokens is None else max_doc_tokens) for n in title_tokens]
    contexts = prompt_ids(tok, docs, max_doc_words, limits, memo)
    return continuation_logprob(llm, contexts, ids, batch_tokens=batch_tokens, states=states, buffer=buffer)


# The query's token ids, the tokens a passage's title and text have beside them, each document's title tokens.
TextRoom = tuple[list[int], int, list[int]]


def query_room(tok: Any, context_length: int, model_id: str, query: str) -> tuple[list[int], int]:
    """The query's ids (:func:`query_ids`) and the tokens a ``context_length``-token context leaves
    a passage's title and text beside them; :class:`InputError` where it leaves none. Tokenizing
    only, with the tokenizer alone: checked before the model loads (:func:`check_queries_fit`)."""
    check_query(query)
    ids = query_ids(tok, query)
    # each prompt starts with BOS where the model's tokenizer puts one (Llama, Gemma), as it was trained
    frame = len(encode_text(tok, passage_prompt(None, ""), controls=()))
    room = context_length - len(ids) - frame - 8  # 8: a title line's joins re-tokenized
    if room < 1:
        raise InputError(
            f"the query is {len(ids)} tokens, too long for a passage beside it in the "
            f"{context_length}-token context of {model_id}; shorten the query"
        )
    return ids, room


def check_queries_fit(tok: Any, context_length: int, model_id: str, queries: dict[str, str]) -> None:
    """:func:`query_room` of every query (``{query id: text}``), the first refused named by its id:
    a run's queries checked with the tokenizer before the model loads, not after."""
    for qid, query in queries.items():
        try:
            query_room(tok, context_length, model_id, query)
        except InputError as e:
            raise InputError(f"query {qid!r}: {e}") from None


def text_room(llm: LLM, query: str, docs: Sequence[Document]) -> TextRoom:
    """The query's ids (:func:`query_ids`), the tokens the context leaves a passage's title and
    text beside them, and each document's title tokens; :class:`InputError` where the query or a
    title leaves a passage no room. Cheap (tokenizing only): a batch checks it before any work."""
    tok = llm.tokenizer
    ids, room = query_room(tok, llm.context_length, llm.model_id, query)
    # each passage's own limit: its score must not depend on the other candidates' titles
    titles = [(d.title or "").strip() for d in docs]  # (as passage_prompt reads them)
    title_tokens = [len(tokenize(tok, t)["input_ids"]) if t else 0 for t in titles]
    for d, n in zip(docs, title_tokens):
        if room - n < 1:
            raise InputError(
                f"the title of document {d.id!r} is {n} tokens, more than the {room} the "
                f"{llm.context_length}-token context leaves beside the query; shorten it"
            )
    return ids, room, title_tokens


def query_ids(tok: Any, query: str) -> list[int]:
    """The query's token ids as its likelihood reads them: after a space, without special tokens."""
    return list(tokenize(tok, " " + query.strip())["input_ids"])


def query_prior(llm: LLM, query: str) -> np.ndarray:
    """Log-probability (nats, float32) of each of ``query``'s tokens (:func:`query_ids`) after the
    prompt with an empty passage: what the model expects of the query without any evidence, so
    that ``query_likelihood(...) - query_prior(...)`` is each token's pointwise mutual
    information with the passage."""
    check_query(query)
    context = encode_text(llm.tokenizer, passage_prompt(None, ""), controls=())
    ids = query_ids(llm.tokenizer, query)
    if len(context) + len(ids) > llm.context_length:  # (the generic check advised a passage cut: there is none)
        raise InputError(
            f"the query is {len(ids)} tokens, too long for the {llm.context_length}-token context of "
            f"{llm.model_id} after the prompt's {len(context)}; shorten the query"
        )
    return continuation_logprob(llm, [context], ids)[0]
