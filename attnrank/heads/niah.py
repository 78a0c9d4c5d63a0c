"""Needle-in-a-haystack trials' material (Wu et al., ICLR 2025): the NIAH data and the prompt.

The NIAH folder (:func:`niah_folder`) holds Retrieval_Head's needles
(``retrieval_head/needles.jsonl``, :func:`load_needles`), its book haystack in three parts
(``retrieval_head/haystack_part{1,2,3}_p1.txt.gz``) and the Paul Graham essays
(``PaulGrahamEssays/*.txt``), read by :func:`load_haystack`. :func:`build_niah_prompt` cuts a
haystack to about a context length, inserts the needle at a sentence end near a depth (% of the
haystack) and asks the needle's question, inside the chat template; the copy-paste detector
(:mod:`attnrank.heads.copypaste`) runs its trials on these prompts.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..llm.chat import chat_frame

QUESTION_TEMPLATE = "\nBased on the content of the book, Question: {question}\nAnswer:"


@dataclass(frozen=True)
class Needle:
    needle: str
    question: str
    real_needle: str


def niah_folder(data: str | Path | None = None) -> Path:
    """The NIAH folder (``PaulGrahamEssays/``, ``retrieval_head/``): ``data`` itself, or its
    ``niah/`` subfolder; default ``$ATTNRANK_DATA``."""
    root = data or os.environ.get("ATTNRANK_DATA")
    if not root:
        raise InputError(
            "no NIAH data folder given; pass --data DIR (the shared data folder or "
            "its niah/ subfolder) or set ATTNRANK_DATA"
        )
    root = Path(root)
    for cand in (root, root / "niah"):
        if (cand / "retrieval_head" / "needles.jsonl").is_file():
            return cand
    raise InputError(
        f"{root} holds no retrieval_head/needles.jsonl (nor niah/...); pass the "
        "shared data folder or its niah/ subfolder"
    )


def load_needles(folder: Path) -> list[Needle]:
    path = folder / "retrieval_head" / "needles.jsonl"
    out = []
    for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except ValueError:
            r = None
        keys = ("needle", "question", "real_needle")
        if not isinstance(r, dict) or not all(isinstance(r.get(k), str) and r[k] for k in keys):
            raise InputError(
                f"{path} line {no} is not a needle: each line must be a JSON object whose "
                '"needle", "question" and "real_needle" are non-empty strings'
            )
        out.append(Needle(r["needle"], r["question"], r["real_needle"]))
    return out


_TEXT_FIELD = re.compile(r'"text":"((?:[^"\\]|\\.)*)"')


def load_haystack(folder: Path, part: int | None) -> str:
    """Haystack text: book part ``part`` (1-3, Retrieval_Head's ``haystack_for_detect``; its
    ``"text"`` strings read from the truncated JSON dump) or, for None, the PG essays by name."""
    if part is None:
        files = sorted((folder / "PaulGrahamEssays").glob("*.txt"))
        return "\n\n".join(f.read_text(encoding="utf-8") for f in files)
    with gzip.open(book_part(folder, part), "rt", encoding="utf-8") as f:
        raw = f.read()
    return "\n\n".join(json.loads(f'"{m}"') for m in _TEXT_FIELD.findall(raw))


def book_part(folder: Path, part: int) -> Path:
    """The file of book haystack part ``part``; an InputError if it is missing."""
    path = folder / "retrieval_head" / f"haystack_part{part}_p1.txt.gz"
    if not path.is_file():
        raise InputError(
            f"the book haystack {path} does not exist; pass a data folder that has it, or use the "
            "Paul Graham essays (haystack='essays', --haystack essays)"
        )
    return path


@dataclass
class NiahPrompt:
    ids: list[int]
    needle_span: tuple[int, int]  # tokens of real_needle (the scored span)
    text: str


def build_niah_prompt(tokenizer: Any, haystack: str, needle: Needle, context_length: int, depth: float) -> NiahPrompt:
    """Haystack cut to about ``context_length`` prompt tokens, the needle inserted at the last
    sentence end before ``depth`` % of it, then the question; inside the chat template."""
    if not 0 <= depth <= 100:
        raise InputError(f"needle depth {depth} is not a percentage in [0, 100]; give e.g. 0, 50 or 100")
    frame = chat_frame(tokenizer)
    tail = QUESTION_TEMPLATE.format(question=needle.question)

    def wrap(body: str) -> str:
        return f"{frame.prefix}{body}{frame.suffix}" if frame.prefix else body

    overhead = len(frame.lead_ids) + len(
        tokenizer(wrap(needle.needle + " " + tail), add_special_tokens=False)["input_ids"]
    )
    budget = context_length - overhead
    head = haystack[: 16 * max(budget, 1) + 1000]  # (a token is rarely over 16 characters)
    enc = tokenizer(head, add_special_tokens=False, return_offsets_mapping=True)
    if budget < 1 or len(enc["input_ids"]) < budget:
        # the limit the message gives counts the whole haystack, not the slice tokenized here
        n = (
            len(enc["input_ids"])
            if head == haystack
            else len(tokenizer(haystack, add_special_tokens=False)["input_ids"])
        )
        raise InputError(
            f"context length {context_length} does not fit: the needle and question take "
            f"{overhead} tokens and the haystack has {n}; use lengths in {overhead + 1}..{overhead + n}"
        )
    offsets = enc["offset_mapping"]
    cut = haystack[: offsets[budget - 1][1]]
    at = len(cut) if depth >= 100 else offsets[int(budget * depth / 100)][0]
    ends = [m.end() for m in re.finditer(r"[.!?][\"')\]]*\s+", cut[:at])]
    at = len(cut) if depth >= 100 else (ends[-1] if ends else 0)
    before, after = cut[:at].rstrip(), cut[at:].lstrip()
    context = " ".join(p for p in (before, needle.needle, after) if p)
    text = wrap(context + tail)
    start = len(frame.prefix) + (len(before) + 1 if before else 0)
    inner = needle.needle.lower().find(needle.real_needle.lower())
    lo, hi = (
        (start, start + len(needle.needle)) if inner < 0 else (start + inner, start + inner + len(needle.real_needle))
    )
    full = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    lead = len(frame.lead_ids)
    inside = [i + lead for i, (a, b) in enumerate(full["offset_mapping"]) if a < hi and b > lo]
    return NiahPrompt(list(frame.lead_ids) + full["input_ids"], (inside[0], inside[-1] + 1), text)
