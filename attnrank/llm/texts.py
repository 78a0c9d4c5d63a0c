"""User text into tokens: a passage or a query never becomes a control token.

A tokenizer reads the text of its special tokens (``<|im_end|>``, ``<|eot_id|>``, ``<s>``...) as
those tokens wherever it occurs, even with ``add_special_tokens=False``. In a passage or a query that
would end the user's turn, open another, or plant an attention sink in the prompt; here only a chat
template's own text may hold them.
"""

from __future__ import annotations

import copy
import threading
import weakref
from collections.abc import Sequence
from typing import Any

Span = tuple[int, int]


def tokenize(tokenizer: Any, text: str, *, controls: Sequence[Span] = (), offsets: bool = False) -> dict[str, Any]:
    """``tokenizer(text)`` without special tokens added, where only the character ranges
    ``controls`` (a chat template's own text) may hold control tokens: anywhere else the text of a
    special token (``<|im_end|>`` in a passage or a query) is read as the characters it is, so that
    no passage or query can end a turn, open another or plant an attention sink in the prompt.
    ``input_ids`` (and with ``offsets`` the ``offset_mapping``, characters of ``text``).

    Where no such text occurs outside ``controls`` (nearly always) the whole text is tokenized in
    one call, exactly as before; else piece by piece at the ranges' edges (a chat template's edges
    are token boundaries)."""
    pieces = _control_pieces(text, controls)
    kw: dict[str, Any] = {"add_special_tokens": False, **({"return_offsets_mapping": True} if offsets else {})}
    specials = special_texts(tokenizer)  # (once per call, not once per piece)
    if not any(s in text[a:b] for a, b, control in pieces if not control for s in specials):
        return dict(tokenizer(text, **kw))
    ids: list[int] = []
    spans: list[Span] = []
    splitting = _splitting_copy(tokenizer)
    for a, b, control in pieces:
        enc = tokenizer(text[a:b], **kw) if control else splitting(text[a:b], split_special_tokens=True, **kw)
        ids += enc["input_ids"]
        if offsets:
            spans += [(x + a, y + a) for x, y in enc["offset_mapping"]]
    return {"input_ids": ids, "offset_mapping": spans} if offsets else {"input_ids": ids}


_COPIES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_COPIES_LOCK = threading.Lock()


def _splitting_copy(tokenizer: Any) -> Any:
    """A copy of ``tokenizer`` that only ever splits special tokens. Why a copy: transformers sets
    ``split_special_tokens`` on the tokenizer's shared backend at each call, so a call that splits
    on the model's own tokenizer would let another thread's prompt lose its control tokens."""
    with _COPIES_LOCK:
        try:
            found = _COPIES.get(tokenizer)
        except TypeError:  # (not weakly referable: a copy per call)
            return copy.deepcopy(tokenizer)
        if found is None:
            found = _COPIES[tokenizer] = copy.deepcopy(tokenizer)
        return found


def _control_pieces(text: str, controls: Sequence[Span]) -> list[tuple[int, int, bool]]:
    """``text`` cut at the edges of ``controls``: (start, end, whether it is a control range)."""
    out, at = [], 0
    for a, b in sorted((max(0, a), min(len(text), b)) for a, b in controls):
        if a > at:
            out.append((at, a, False))
        if b > a:
            out.append((a, b, True))
        at = max(at, b)
    if at < len(text) or not out:
        out.append((at, len(text), False))
    return out


def holds_special(tokenizer: Any, text: str) -> bool:
    """Whether ``text`` holds the text of one of ``tokenizer``'s special tokens."""
    return any(t in text for t in special_texts(tokenizer))


def special_texts(tokenizer: Any) -> frozenset[str]:
    """The texts of ``tokenizer``'s special tokens (BOS, EOS, chat turn markers...); kept per
    tokenizer and its vocabulary size (every tokenization reads them; a tokenizer given added tokens
    since gets them read again)."""
    try:
        kept = _SPECIALS.get(tokenizer)
    except TypeError:  # (not weakly referable: read each time)
        return _read_special_texts(tokenizer)
    size = _vocab_size(tokenizer)
    if kept is None or kept[0] != size:
        kept = _SPECIALS[tokenizer] = (size, _read_special_texts(tokenizer))
    return kept[1]


_SPECIALS: weakref.WeakKeyDictionary[Any, tuple[int | None, frozenset[str]]] = weakref.WeakKeyDictionary()


def _vocab_size(tokenizer: Any) -> int | None:
    try:
        return len(tokenizer)
    except TypeError:
        return None


def _read_special_texts(tokenizer: Any) -> frozenset[str]:
    found = set(getattr(tokenizer, "all_special_tokens", None) or [])
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    found |= {str(t.content) for t in decoder.values() if getattr(t, "special", False)}
    return frozenset(t for t in found if t)
