"""Generative LLM rerankers, the baselines attention reranking is measured against.

- :class:`PointwiseReranker`: one prompt per passage, score = logit("Yes") − logit("No") of the
  first answer token (the yes/no relevance scoring used by monoT5-style and LLM pointwise
  rerankers).
- :class:`ListwiseReranker`: RankGPT (Sun et al., EMNLP 2023): the model writes a permutation
  "[3] > [1] > ..." for a window of passages; windows of 20 slide from the bottom of the list
  to the top in steps of 10. Unparseable or missing identifiers keep their input order
  after the ones the model named, as RankGPT does.

Both return the same :class:`~attnrank.types.RankedResults` as the attention reranker.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import numpy as np
import torch

from ..errors import InputError
from ..llm.chat import render_chat, with_lead_ids
from ..llm.decoding import greedy_config, own_settings_off
from ..llm.models import LLM, load_llm
from ..llm.recording import forward_lock
from ..llm.texts import holds_special, tokenize
from ..types import Document, RankedResults, as_documents, is_count, rank_documents
from .inputs import check_documents, check_k, check_query

logger = logging.getLogger(__name__)


def _words(text: str, n: int | None) -> str:
    w = text.split()
    return text if n is None or len(w) <= n else " ".join(w[:n])


def _chat(tokenizer, messages: list[dict]) -> str:
    """``messages`` through the chat template (none: joined as plain text). A template that refuses
    the system turn (Gemma's, Mistral-Instruct's: "System role not supported", roles must
    alternate) gets its text at the head of the first user message instead."""
    if not getattr(tokenizer, "chat_template", None):
        return "\n\n".join(m["content"] for m in messages) + "\n"
    try:
        return render_chat(tokenizer, messages, add_generation_prompt=True)
    except Exception:  # (jinja's TemplateError, raised by the template's own raise_exception)
        if not messages or messages[0]["role"] != "system" or len(messages) < 2:
            raise
    system, user, *rest = messages
    folded = {**user, "content": f"{system['content']}\n\n{user['content']}"}
    return render_chat(tokenizer, [folded, *rest], add_generation_prompt=True)


def _chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of :func:`_chat`'s prompt, the messages' own text never a control token (a passage
    holding "<|im_end|>" would end the turn; :func:`~attnrank.llm.texts.tokenize`): the template
    is rendered around a marker per message, and only its own text may hold control tokens."""
    if not any(holds_special(tokenizer, str(m["content"])) for m in messages):  # (as always: nothing to split)
        return with_lead_ids(tokenizer, tokenizer(_chat(tokenizer, messages), add_special_tokens=False)["input_ids"])
    marks = [f"\x00{i}\x00" for i in range(len(messages))]
    framed = _chat(tokenizer, [{**m, "content": mark} for m, mark in zip(messages, marks)])
    if not all(framed.count(mark) == 1 for mark in marks):  # a template that rewrites its content
        raise InputError(
            "a passage or the query holds a special token's text, and this model's chat template rewrites the "
            "messages, so it cannot be kept apart from the template's own; remove that text"
        )
    out, controls = "", []
    for piece in re.split("(\x00\\d+\x00)", framed):
        if re.fullmatch("\x00\\d+\x00", piece):
            out += str(messages[int(piece[1:-1])]["content"])
        else:
            controls.append((len(out), len(out) + len(piece)))
            out += piece
    # (BOS where the tokenizer puts one, as every other prompt starts: a template without
    # {{bos_token}}, or none, had the baselines score prompts the model never saw)
    return with_lead_ids(tokenizer, tokenize(tokenizer, out, controls=controls)["input_ids"])


def _candidates(docs, k: int | None, query_id: str | None):
    """The candidates, the earlier stage's entries and the query id, as the attention reranker
    takes them: ``k`` None or positive, document ids unique."""
    check_k(k)
    documents, previous = as_documents(docs)
    check_documents(documents)
    if query_id is None and isinstance(docs, RankedResults):
        query_id = docs.query_id
    return documents, previous, query_id


class PointwiseReranker:
    """Yes/no relevance per passage; score = logit(Yes) − logit(No) at the first answer token."""

    def __init__(
        self,
        model: str | LLM | None = None,
        *,
        max_doc_words: int | None = 300,
        batch_size: int = 8,
        dtype: str = "auto",
        device: str = "cpu",
    ):
        for name, value, none in (("max_doc_words", max_doc_words, True), ("batch_size", batch_size, False)):
            if (value is not None or not none) and (not is_count(value)):
                raise InputError(f"{name}={value!r} must be a positive integer" + (" or None (no cut)" if none else ""))
        self.llm = model if isinstance(model, LLM) else load_llm(model, dtype=dtype, device=device)
        self.max_doc_words = None if max_doc_words is None else int(max_doc_words)
        self.batch_size = int(batch_size)
        tok = self.llm.tokenizer
        self.yes, self.no = (tok.encode(w, add_special_tokens=False)[0] for w in ("Yes", "No"))

    def _messages(self, query: str, d: Document) -> list[dict]:
        passage = (d.title + "\n" if d.title else "") + _words(d.text, self.max_doc_words)
        msg = f"Passage: {passage}\n\nQuery: {query}\n\nIs the passage relevant to the query? Answer Yes or No."
        return [{"role": "user", "content": msg}]

    @torch.inference_mode()
    def score(self, query: str, docs: Sequence[Document]) -> np.ndarray:
        if not docs:
            return np.zeros(0)
        tok, model = self.llm.tokenizer, self.llm.model
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        out = []
        # (int8 linears scale a batch's input as one: a passage's score would depend on its neighbours)
        size = 1 if self.llm.quantization == "int8" else self.batch_size
        for i in range(0, len(docs), size):
            rows = [_chat_ids(tok, self._messages(query, d)) for d in docs[i : i + size]]
            for d, row in zip(docs[i : i + size], rows):
                if len(row) > self.llm.context_length:  # (past its positions the model's output means nothing)
                    raise InputError(
                        f"the prompt of document {d.id!r} is {len(row)} tokens, over the "
                        f"{self.llm.context_length}-token context of {self.llm.model_id}; set max_doc_words"
                    )
            # Padded on the left by hand, so the answer token is every row's last position and the
            # model's shared tokenizer is left as it is; positions count from each row's own start,
            # so a passage scores the same whatever it is batched with.
            n = max(len(r) for r in rows)
            ids = torch.tensor([[pad] * (n - len(r)) + r for r in rows], device=self.llm.device)
            mask = torch.tensor([[0] * (n - len(r)) + [1] * len(r) for r in rows], device=self.llm.device)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            with forward_lock(model):
                logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1).logits
            logits = logits[:, -1].float()
            out.append((logits[:, self.yes] - logits[:, self.no]).cpu().numpy())
        scores = np.concatenate(out)
        if not np.isfinite(scores).all():  # (an overflow; ranked last without a word otherwise)
            bad = docs[int(np.flatnonzero(~np.isfinite(scores))[0])].id
            raise InputError(
                f"non-finite Yes/No score for document {bad!r}; check the model dtype (use float32/bfloat16)"
            )
        return scores

    def rank(self, query: str, docs, k: int | None = None, *, query_id: str | None = None) -> RankedResults:
        check_query(query)
        documents, previous, query_id = _candidates(docs, k, query_id)
        if not documents:
            return RankedResults(query, [], query_id, stage="pointwise")
        res = rank_documents(
            query, documents, self.score(query, documents), stage="pointwise", query_id=query_id, previous=previous
        )
        return res if k is None else res.top_k(k)


class ListwiseReranker:
    """RankGPT sliding-window permutation generation (window 20, step 10 by default)."""

    SYSTEM = "You are RankGPT, an intelligent assistant that can rank passages based on their relevancy to the query."

    def __init__(
        self,
        model: str | LLM | None = None,
        *,
        window: int = 20,
        step: int = 10,
        max_doc_words: int | None = 300,
        dtype: str = "auto",
        device: str = "cpu",
    ):
        for name, value in (("window", window), ("step", step)):
            if not is_count(value):
                raise InputError(f"{name}={value!r} must be a positive integer (passages a window holds / it moves)")
        if max_doc_words is not None and not is_count(max_doc_words):  # (0 ranked empty passages)
            raise InputError(f"max_doc_words={max_doc_words!r} must be a positive integer or None (no cut)")
        if not step <= window:
            raise InputError(f"need 0 < step <= window, got window={window}, step={step}")
        self.llm = model if isinstance(model, LLM) else load_llm(model, dtype=dtype, device=device)
        self.window, self.step = int(window), int(step)
        self.max_doc_words = None if max_doc_words is None else int(max_doc_words)

    def _messages(self, query: str, docs: list[Document]) -> list[dict]:
        n = len(docs)
        body = "\n".join(f"[{i}] {_words(d.full_text, self.max_doc_words)}" for i, d in enumerate(docs, start=1))
        user = (
            f"I will provide you with {n} passages, each indicated by number identifier []. "
            f"Rank the passages based on their relevance to query: {query}.\n\n{body}\n\n"
            f"Search Query: {query}. Rank the {n} passages above based on their relevance to the search "
            "query. The passages should be listed in descending order using identifiers. The most relevant "
            "passages should be listed first. The output format should be [] > [], e.g., [1] > [2]. "
            "Only respond with the ranking results, do not say any word or explain."
        )
        return [{"role": "system", "content": self.SYSTEM}, {"role": "user", "content": user}]

    @torch.inference_mode()
    def permutation(self, query: str, docs: list[Document]) -> list[int]:
        """The model's order of ``docs`` (0-based indices), completed with the unnamed ones."""
        tok = self.llm.tokenizer
        ids = torch.tensor([_chat_ids(tok, self._messages(query, docs))], device=self.llm.device)
        needed = ids.shape[1] + 6 * len(docs)
        if needed > self.llm.context_length:  # (past its positions the model's output means nothing)
            raise InputError(
                f"the ranking prompt of {len(docs)} passages is {ids.shape[1]} tokens, which with its "
                f"{6 * len(docs)}-token answer is over the {self.llm.context_length}-token context of "
                f"{self.llm.model_id}; lower window or max_doc_words"
            )
        with forward_lock(self.llm.model), own_settings_off(self.llm.model):
            gen = self.llm.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                generation_config=greedy_config(
                    6 * len(docs), pad_token_id=tok.eos_token_id if tok.pad_token_id is None else tok.pad_token_id
                ),
            )
        text = tok.decode(gen[0, ids.shape[1] :], skip_special_tokens=True)
        named = []
        for m in re.findall(r"\d+", text):
            i = int(m) - 1
            if 0 <= i < len(docs) and i not in named:
                named.append(i)
        return named + [i for i in range(len(docs)) if i not in named]

    def rank(self, query: str, docs, k: int | None = None, *, query_id: str | None = None) -> RankedResults:
        check_query(query)
        documents, previous, query_id = _candidates(docs, k, query_id)
        if not documents:
            return RankedResults(query, [], query_id, stage="listwise")
        order = list(range(len(documents)))
        end = len(order)
        while True:  # slide from the bottom of the list to the top, as RankGPT does
            start = max(0, end - self.window)
            win = order[start:end]
            perm = self.permutation(query, [documents[i] for i in win])
            order[start:end] = [win[p] for p in perm]
            if start == 0:
                break
            end -= self.step
        scores = np.empty(len(documents))
        scores[order] = -np.arange(len(order), dtype=float)  # rank position as score
        res = rank_documents(query, documents, scores, stage="listwise", query_id=query_id, previous=previous)
        return res if k is None else res.top_k(k)
