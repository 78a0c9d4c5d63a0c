"""The model's chat template: the frame it puts around one user message, and prompt texts into ids.

:func:`chat_frame` renders the template around a placeholder message and splits it into the
text before and after (:class:`ChatFrame`), with the ids the tokenizer adds in front by itself
(BOS); :func:`render_chat` renders a conversation at a fixed date (:data:`TEMPLATE_DATE`) with
thinking off; :func:`turn_end_ids` is the token that closes an assistant turn. A prompt built
inside the frame is encoded by :func:`encode_text`, control tokens only in the template's own
text (:func:`framed_controls`). The reranking and answer prompts (:mod:`attnrank.llm.prompts`),
the block prompt (:mod:`attnrank.llm.blocks`) and the NIAH prompt
(:mod:`attnrank.heads.niah`) are built inside it.
"""

from __future__ import annotations

import datetime
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .texts import Span, tokenize

logger = logging.getLogger(__name__)

_SENTINEL = "\u0000ATTNRANK-CONTENT\u0000"


@dataclass(frozen=True)
class ChatFrame:
    """Text a chat template puts before and after one user message (incl. assistant header),
    and the ids the tokenizer adds in front of a text (e.g. BOS) that the prefix lacks."""

    prefix: str
    suffix: str
    lead_ids: tuple[int, ...] = ()


# The date a chat template that stamps "today" renders (Llama 3.x: "Today Date: ..."): a fixed
# one, so that a prompt, and with it every score, cached passage state and trained weight, does
# not change at midnight. It is the date Llama's own template falls back to.
TEMPLATE_DATE = datetime.datetime(2024, 7, 26)


def render_chat(tokenizer: Any, messages: list[dict[str, str]], **kwargs: Any) -> Any:
    """``tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)`` dated
    :data:`TEMPLATE_DATE`: ``date_string`` is what Llama's template reads when it is given, and a
    template that calls ``strftime_now`` regardless gets a macro of that name in front, which
    shadows the clock for the formats it names (render variables cannot: transformers passes a
    function given as one as the text "<function>"). With thinking off (``enable_thinking=False``,
    which Qwen3's and SmolLM3's templates read and others ignore): else the generator's answer
    opens with the model's reasoning, and the reranker reads a prompt that invites it."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str) and "strftime_now" in template:
        formats = {m[1] for m in re.findall(r"strftime_now\(\s*(['\"])(.*?)\1\s*\)", template)}
        table = ", ".join(f"{json.dumps(f)}: {json.dumps(TEMPLATE_DATE.strftime(f))}" for f in sorted(formats))
        kwargs["chat_template"] = f"{{%- macro strftime_now(f) -%}}{{{{ {{{table}}}[f] }}}}{{%- endmacro -%}}{template}"
    kwargs = {"enable_thinking": False, **kwargs}
    return tokenizer.apply_chat_template(
        messages, tokenize=False, date_string=TEMPLATE_DATE.strftime("%d %b %Y"), **kwargs
    )


def chat_frame(tokenizer: Any) -> ChatFrame:
    """The chat template's text around one user message, or a plain frame (suffix ``"\\n"``)."""
    lead = _lead_ids(tokenizer)
    if getattr(tokenizer, "chat_template", None):
        try:
            rendered = render_chat(tokenizer, [{"role": "user", "content": _SENTINEL}], add_generation_prompt=True)
        except Exception as e:
            logger.warning("chat template of %s failed (%s); using a plain prompt", type(tokenizer).__name__, e)
            rendered = ""
        if isinstance(rendered, str) and rendered.count(_SENTINEL) == 1:
            prefix, suffix = rendered.split(_SENTINEL)
            bos = tokenizer.decode(list(lead)) if lead else ""
            return ChatFrame(prefix, suffix, () if bos and prefix.startswith(bos) else lead)
        logger.warning("the chat template does not render a user message verbatim; using a plain prompt")
    return ChatFrame("", "\n", lead)


def turn_end_ids(tokenizer: Any) -> list[int]:
    """The special token the chat template closes an assistant turn with (``<|im_end|>``,
    ``<|eot_id|>``, ``<end_of_turn>``...), or none: where it is not among the tokenizer's or
    the generation config's end-of-sequence tokens, generation must still stop at it."""
    if not getattr(tokenizer, "chat_template", None):
        return []
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _SENTINEL}]
    try:
        rendered = render_chat(tokenizer, turns)
    except Exception:  # a template that refuses this conversation: nothing to add
        return []
    if not isinstance(rendered, str) or rendered.count(_SENTINEL) != 1:
        return []
    after = tokenizer(rendered.split(_SENTINEL)[1], add_special_tokens=False)["input_ids"]
    special = set(getattr(tokenizer, "all_special_ids", []) or [])  # and added special tokens not named as such:
    special |= {
        i for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items() if getattr(t, "special", False)
    }
    return [int(after[0])] if after and after[0] in special else []


def framed_controls(tokenizer: Any, text: str) -> list[Span]:
    """The chat template's own characters of a prompt ``text`` built inside :func:`chat_frame`
    (its prefix and suffix), where control tokens belong; none for a plain frame."""
    frame = chat_frame(tokenizer)
    if not frame.prefix or not text.startswith(frame.prefix) or not text.endswith(frame.suffix):
        return []
    return [(0, len(frame.prefix)), (len(text) - len(frame.suffix), len(text))]


def encode_text(tokenizer: Any, text: str, *, controls: Sequence[Span] | None = None) -> list[int]:
    """Token ids of a prompt text, with the tokenizer's leading special ids (e.g. BOS) added
    unless the text already starts with them. Control tokens only in ``controls``
    (:func:`~attnrank.llm.texts.tokenize`; None: the chat template's own prefix and suffix where
    the text is built inside them, :func:`framed_controls`, else none)."""
    if controls is None:
        controls = framed_controls(tokenizer, text)
    return with_lead_ids(tokenizer, tokenize(tokenizer, text, controls=controls)["input_ids"])


def with_lead_ids(tokenizer: Any, ids: list[int]) -> list[int]:
    """``ids`` with the tokenizer's leading special ids (e.g. BOS) before them, unless they start
    with them already: every prompt the model reads starts as it was trained to."""
    lead = list(_lead_ids(tokenizer))
    return ids if not lead or ids[: len(lead)] == lead else lead + ids


def _lead_ids(tokenizer: Any) -> tuple[int, ...]:
    """Ids the tokenizer puts before any text by itself (BOS for Llama/Gemma, none for Qwen)."""
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a", add_special_tokens=True)["input_ids"]
    at = next((i for i in range(len(full)) if full[i : i + len(plain)] == plain), 0)
    return tuple(full[:at])
