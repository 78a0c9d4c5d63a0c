"""Answer metrics of extractive/short-answer QA: exact match and token F1 after SQuAD's answer
normalisation, as HotpotQA's official ``hotpot_evaluate_v1.py`` computes them (Rajpurkar et al.,
2016; Yang et al., 2018): lowercase, punctuation and the articles a/an/the removed, whitespace
collapsed; a yes/no/noanswer answer scores F1 only on an exact match (HotpotQA's rule; ``yes_no=False``
for plain SQuAD F1). Scores are in [0, 1]."""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Sequence

from ..errors import InputError

_PUNCT = frozenset(string.punctuation)
_SPECIAL = ("yes", "no", "noanswer")


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lowercase, no punctuation, no articles, single spaces."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 if the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str, *, yes_no: bool = True) -> float:
    """Token-overlap F1 of the normalised strings (bag of words); with ``yes_no`` (HotpotQA's rule),
    a yes/no/noanswer answer or gold scores only on an exact match."""
    p, g = normalize_answer(prediction), normalize_answer(gold)
    if yes_no and (p in _SPECIAL or g in _SPECIAL) and p != g:
        return 0.0
    common = collections.Counter(p.split()) & collections.Counter(g.split())
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p.split()), same / len(g.split())
    return 2 * precision * recall / (precision + recall)


def contains(prediction: str, gold: str) -> float:
    """1.0 if the normalised gold occurs as whole words inside the normalised prediction (for
    verbose generators); an answer that normalises to nothing never matches."""
    g = normalize_answer(gold)
    return float(bool(g) and f" {g} " in f" {normalize_answer(prediction)} ")


def answer_metrics(prediction: str, golds: Sequence[str], *, yes_no: bool = True) -> dict[str, float]:
    """``{"em", "f1", "contains"}``: each the maximum over the gold answers (a list: one string
    would be read as one answer per character, and is refused). ``yes_no``: HotpotQA's rule that a
    yes/no answer scores F1 only on an exact match; False for plain SQuAD F1 (LoCoMo's scorer has no
    such rule: "Yes, she would." against "Yes" is 0.5, not 0)."""
    if isinstance(golds, str):
        raise InputError(f"golds {golds[:40]!r} is one string; pass a list of gold answers, e.g. [{golds[:40]!r}]")
    if not golds:
        raise InputError("no gold answers given; answer metrics need at least one reference answer")
    return {
        "em": max(exact_match(prediction, g) for g in golds),
        "f1": max(f1_score(prediction, g, yes_no=yes_no) for g in golds),
        "contains": max(contains(prediction, g) for g in golds),
    }
