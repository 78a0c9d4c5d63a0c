"""Answer generation from (pruned) passages with a causal LM: greedy decoding, optional streaming.

The prompt is :func:`attnrank.llm.prompts.build_answer_prompt` (chat template, short-answer
instruction, ``[i] title\\ntext`` passages, then the question). Decoding is greedy (no
sampling, one beam) and stops at the tokenizer's or the generation config's end-of-sequence
tokens, at the chat template's end of an assistant turn (a prompt without a chat template: at the
end of the answer's first line), or after ``max_new_tokens``. The
generator may be another (bigger) Hugging Face model than the reranker's; pass the same
:class:`~attnrank.llm.models.LLM` object to share one load.
Streaming hands each decoded piece (whole words, as transformers' ``TextStreamer`` flushes
them) to a callback as soon as it is generated.
"""

from __future__ import annotations

import copy
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch

from .errors import InputError
from .llm.chat import chat_frame, encode_text, turn_end_ids
from .llm.decoding import FirstLine, first_line, greedy_config, own_settings_off
from .llm.modelconfig import model_context_length
from .llm.models import LLM, check_model_arg, load_llm
from .llm.prompts import build_answer_prompt
from .llm.recording import forward_lock
from .types import check_unicode, is_count, refuse_one_passage

logger = logging.getLogger(__name__)

StreamCallback = Callable[[str], Any]


@dataclass
class Answer:
    """A generated answer: its text, how many tokens were generated, and the wall time (s);
    ``truncated``: it stopped at ``max_new_tokens``, not at its end (an end-of-turn token, or a
    base model's first line), so its text may be cut mid-sentence."""

    text: str
    tokens: int
    seconds: float
    prompt_tokens: int = 0
    model_id: str = ""
    truncated: bool = False


# the end an answer leaves out: whitespace, and U+FFFD, what the bytes of a character cut by
# max_new_tokens (or by an end-of-turn token in the middle of one) decode to
_LOOSE_END = re.compile(r"[\s\ufffd]+\Z")


def _trim_end(text: str) -> str:
    return _LOOSE_END.sub("", text)


def _streamer(tokenizer: Any, callback: StreamCallback, first_line_only: bool) -> Any:
    """A transformers streamer that passes each finalized text piece to ``callback``, so that the
    pieces joined are the answer's text: whitespace before the first word is left out, whitespace
    and U+FFFD are held back until a word follows them (the answer's end is trimmed), and with
    ``first_line_only`` (a prompt without a chat template) nothing after the first line's end.

    Why: the pieces were the raw tokens, so a client joining ``/v1/ask``'s token events, or ``ask``
    printing the stream, showed line breaks and a second line the answer itself leaves out."""
    from transformers import TextStreamer

    class _CallbackStreamer(TextStreamer):
        started, ended, held = False, False, ""

        def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
            if self.ended:
                return
            if not self.started:
                text = text.lstrip()
                self.started = bool(text)
            if first_line_only and "\n" in text:
                text, self.ended = text.split("\n", 1)[0], True
            text = self.held + text
            body = _trim_end(text)
            self.held = "" if self.ended else text[len(body) :]  # (at the stream's end: left out)
            if body:
                callback(body)

    return _CallbackStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)


class Generator:
    """Greedy short-answer generation: ``answer(question, context_docs)`` -> :class:`Answer`.

    ``model``: an :class:`LLM` (e.g. the reranker's), a model name/path, or None (default LLM).
    """

    def __init__(
        self, model: str | LLM | None = None, max_new_tokens: int = 64, *, dtype: str = "auto", device: str = "cpu"
    ):
        check_model_arg(model)
        if isinstance(model, LLM):
            check_max_new_tokens(max_new_tokens)  # (its context is checked at each answer, with the prompt)
        else:  # under the model's context, from its config, before the load (it was found at the answer)
            check_answer_room(max_new_tokens, None if model is None else os.fspath(model))
        self.llm = model if isinstance(model, LLM) else load_llm(model, dtype=dtype, device=device)
        self.max_new_tokens = int(max_new_tokens)

    def __repr__(self) -> str:
        return f"Generator(model={self.llm.model_id!r}, max_new_tokens={self.max_new_tokens})"

    def with_max_new_tokens(self, max_new_tokens: int) -> Generator:
        """This generator with another answer length limit, sharing its model and the stop tokens
        it found (a server's request asks for its own limit; the chat template is not rendered again)."""
        check_max_new_tokens(max_new_tokens)
        self._stop_ids, self._plain  # noqa: B018 - found once, here, and kept by the copy
        other = copy.copy(self)
        other.max_new_tokens = int(max_new_tokens)
        return other

    def prompt(self, question: str, context_docs: Sequence[Any] = ()) -> str:
        """The chat prompt text the model reads (see :func:`build_answer_prompt`)."""
        refuse_one_passage(context_docs, "context_docs is", "passages")
        return build_answer_prompt(self.llm.tokenizer, question, context_docs)

    def answer(
        self,
        question: str,
        context_docs: Sequence[Any] = (),
        stream: StreamCallback | None = None,
        *,
        max_new_tokens: int | None = None,
    ) -> Answer:
        """Answer ``question`` from ``context_docs`` (Document, ScoredDocument or str), greedily.

        ``stream``: called with each decoded text piece while generating; the pieces joined are the
        answer's text. An answer cut by ``max_new_tokens`` is ``truncated``, and said in a warning,
        but to a ``stream`` caller, who prints the answer and says so itself, in an info line.
        """
        n_new = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        check_max_new_tokens(n_new)
        n_new = int(n_new)
        if not isinstance(question, str):  # (b"what" was answered as "b'what'", a number failed inside)
            raise InputError(f"question {question!r} is a {type(question).__name__}; pass the question as a str")
        check_unicode([question], "question")  # (the prompt refuses an empty one, and checks the passages)
        tok = self.llm.tokenizer
        ids = encode_text(tok, self.prompt(question, context_docs))  # (no passage text is a control token)
        if len(ids) + n_new > self.llm.context_length:
            bare = len(encode_text(tok, self.prompt(question)))  # the question and instruction alone
            fix = (
                "shorten the question or lower max_new_tokens"
                if bare + n_new > self.llm.context_length
                else "prune the context harder (smaller budget_tokens) or pass fewer passages"
            )
            raise InputError(
                f"the answer prompt has {len(ids)} tokens ({bare} without passages); with "
                f"max_new_tokens={n_new} it exceeds the model's {self.llm.context_length}-token context; {fix}"
            )
        input_ids = torch.tensor([ids], device=self.llm.device)
        plain = self._plain
        start = time.perf_counter()
        with forward_lock(self.llm.model), torch.inference_mode(), own_settings_off(self.llm.model):
            out = self.llm.model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                generation_config=self._config(n_new),
                streamer=_streamer(tok, stream, plain) if stream is not None else None,
                stopping_criteria=[FirstLine(tok, len(ids))] if plain else None,
            )
        seconds = time.perf_counter() - start
        new = out[0, len(ids) :].tolist()
        stops = set(self._stop_ids) | ({tok.pad_token_id} if tok.pad_token_id is not None else set())
        ended = bool(new) and new[-1] in stops
        while new and new[-1] in stops:
            new.pop()
        raw = tok.decode(new, skip_special_tokens=True)
        text = raw.strip()
        if plain:  # its first line ended (a newline after some text, the last token's too): the answer is whole
            ended = ended or "\n" in raw.lstrip()
            text = first_line(text)
        text = _trim_end(text)  # (a character cut by the limit: its bytes, not U+FFFD; as the stream ends)
        truncated = len(out[0]) - len(ids) >= n_new and not ended
        if truncated:  # (printed as a whole answer, exit 0)
            # a streaming caller prints the answer as it comes and says so itself (ask's [note], the
            # server's "truncated"): a warning landed in the middle of its printed line
            (logger.info if stream is not None else logger.warning)(
                "the answer reached max_new_tokens=%d before its end: it may be cut; raise it", n_new
            )
        logger.info("generated %d tokens in %.2f s (prompt %d tokens)", len(new), seconds, len(ids))
        return Answer(text, len(new), seconds, len(ids), self.llm.model_id, truncated)

    @cached_property
    def _plain(self) -> bool:
        """Whether the prompt has no chat template (a base model's ``...\\nAnswer:``): the answer
        then ends with its first line, where nothing else would end it."""
        return not chat_frame(self.llm.tokenizer).prefix

    @cached_property
    def _stop_ids(self) -> list[int]:
        """End-of-sequence ids of the tokenizer and the generation config, and the chat template's
        end of an assistant turn (a base model's tokenizer may name only ``<|endoftext|>``); found
        once per generator (the turn end renders the chat template), not twice per answer."""
        ids: list[int] = []
        gen_eos = getattr(getattr(self.llm.model, "generation_config", None), "eos_token_id", None)
        for value in (self.llm.tokenizer.eos_token_id, gen_eos, turn_end_ids(self.llm.tokenizer)):
            if value is None:
                continue
            for v in value if isinstance(value, (list, tuple)) else [value]:
                if v not in ids:
                    ids.append(int(v))
        return ids

    def _config(self, max_new_tokens: int) -> Any:
        stops = self._stop_ids
        pad = self.llm.tokenizer.pad_token_id
        return greedy_config(
            max_new_tokens, eos_token_id=stops, pad_token_id=pad if pad is not None else (stops[0] if stops else None)
        )


def check_max_new_tokens(n: int) -> None:
    if not is_count(n):  # (numpy integers too)
        raise InputError(f"max_new_tokens={n!r} must be an integer >= 1 (tokens generated at most), e.g. 64")


def check_answer_room(n: int, model: str | None) -> None:
    """``max_new_tokens`` under the context of ``model`` (a name, None for the default), read from
    its config before anything loads (else found at the answer, after retrieval and pruning)."""
    check_max_new_tokens(n)
    context = model_context_length(model)
    if context is not None and n >= context:
        raise InputError(
            f"max_new_tokens={n} leaves no room for the prompt in the {context}-token context of "
            f"{model or 'the default model'}; give fewer (e.g. 64)"
        )
