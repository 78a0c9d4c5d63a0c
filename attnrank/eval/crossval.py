"""Held-out evaluation: k-fold over queries and leave-one-group-out (e.g. leave one dataset out).

The splits are plain lists of items (query ids, feature records, ...), so any model can be
evaluated: :func:`cross_validate` calls ``fit(train)`` on each split's training items and
``evaluate(model, test)`` on its test items. Fold means are pooled weighted by the number of
test items (:func:`pool`), which equals the mean over all held-out items of a per-item mean metric.

k-fold: the items (in the given order) are shuffled with ``random.Random(seed)`` and dealt round
robin into ``folds`` folds (``order[i::folds]``); a fold's training items keep the shuffled order.
Linked items (labelled queries sharing a relevant document, :func:`labelled_splits`) are dealt as
one, to the fold holding fewest items.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import (
    Any,
    Generic,
    TypeVar,
)

from ..errors import InputError
from ..types import is_count, is_real

logger = logging.getLogger(__name__)

T = TypeVar("T")
M = TypeVar("M")


@dataclass
class Split(Generic[T]):
    """One held-out split: its name (fold number or held-out group), training and test items."""

    name: str
    train: list[T]
    test: list[T]


def kfold_splits(
    items: Sequence[T], folds: int, *, seed: int = 0, links: Callable[[T], Iterable[Hashable]] | None = None
) -> list[Split[T]]:
    """``folds`` folds of ``items``: each fold is the test set once, the rest its training set.

    ``links``: keys of each item (:func:`relevant_links`: the documents judged relevant to a
    labelled query); items that share a key, directly or through others, stay in one fold. Items
    are shuffled (``seed``), then dealt in that order, each linked set at its first member's turn,
    to the fold holding fewest items (ties: the lowest): with no links, fold ``i`` is every
    ``folds``-th item from the ``i``-th, as before links existed.

    Why links: LoCoMo questions about one conversation share evidence turns, and SciFact repeats
    some claims with their judgements; dealt one by one, 313 of 394 test questions of a LoCoMo
    fold had an evidence turn relevant to a training question."""
    return _dealt(items, folds, seed, None if links is None else _linked_sets(items, links))


def _dealt(items: Sequence[T], folds: int, seed: int, sets: list[list[int]] | None) -> list[Split[T]]:
    """:func:`kfold_splits` of ``items`` with the linked ``sets`` (positions; None: each item alone)."""
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    if sets is None:
        groups = [[j] for j in order]
    else:  # each set in the shuffled order, the sets by their first member's turn
        turn = {j: t for t, j in enumerate(order)}
        groups = sorted((sorted(m, key=turn.__getitem__) for m in sets), key=lambda m: turn[m[0]])
    check_folds(folds, len(groups), "items" if sets is None else "sets of linked items")
    tests: list[list[int]] = [[] for _ in range(folds)]
    for members in groups:
        min(tests, key=len).extend(members)  # (min: the first of the smallest)
    out = []
    for i, test in enumerate(tests):
        held = set(test)
        out.append(Split(str(i), [items[j] for j in order if j not in held], [items[j] for j in test]))
    return out


def _linked_sets(items: Sequence[T], links: Callable[[T], Iterable[Hashable]]) -> list[list[int]]:
    """The positions of ``items`` grouped into sets that share a link, directly or through others."""
    parent = list(range(len(items)))

    def root(j: int) -> int:
        while parent[j] != j:
            parent[j] = parent[parent[j]]
            j = parent[j]
        return j

    owner: dict[Hashable, int] = {}
    for j, item in enumerate(items):
        for key in links(item):
            parent[root(j)] = root(owner.setdefault(key, j))
    sets: dict[int, list[int]] = {}
    for j in range(len(items)):
        sets.setdefault(root(j), []).append(j)
    return list(sets.values())


def labelled_splits(
    items: Sequence[T], folds: int, *, seed: int = 0, links: Callable[[T], Iterable[Hashable]] | None = None
) -> list[Split[T]]:
    """:func:`kfold_splits` of labelled queries with those that share a relevant document in one
    fold (``links``, default :func:`relevant_links`), where they form at least ``folds`` sets and
    none larger than a fold; else (a few documents relevant to many queries, as in a FAQ, whose
    folds would be lopsided: 96 of 100 queries tested by a model trained on 4) dealt one by one,
    warned once."""
    check_folds(folds, len(items), "items")
    sets = _linked_sets(items, links or relevant_links())
    if len(sets) >= folds and max(map(len, sets)) <= math.ceil(len(items) / folds):
        return _dealt(items, folds, seed, sets)
    if (len(items), folds) not in _WARNED:
        _WARNED.add((len(items), folds))
        logger.warning(
            "the %d labelled queries that share relevant documents cannot be kept together in folds=%d folds of "
            "about equal size; they are dealt one by one, so a query and another judged on its relevant document "
            "may sit on both sides of a fold",
            len(items),
            folds,
        )
    return _dealt(items, folds, seed, None)


_WARNED: set[tuple[int, int]] = set()


def relevant_links(rel: int = 1) -> Callable[[Any], list[Hashable]]:
    """:func:`kfold_splits`' ``links`` for labelled queries (anything with ``doc_ids``, ``labels``
    and optionally ``qrels``, its own ``rel`` and a ``group``): each document judged relevant to
    the query (label >= its ``rel``, else ``rel``), keyed by the query's group (its dataset)."""

    def keys(item: Any) -> list[Hashable]:
        judged = item.qrels if getattr(item, "qrels", None) else dict(zip(item.doc_ids, map(int, item.labels)))
        floor = getattr(item, "rel", None) or rel
        group = getattr(item, "group", "")
        return [(group, d) for d, label in judged.items() if label >= floor]

    return keys


def qrels_links(qrels: Mapping[str, Mapping[str, int]], rel: int = 1) -> Callable[[str], list[Hashable]]:
    """:func:`labelled_splits`' ``links`` for query ids judged in ``qrels`` (``{query id: {doc id:
    label}}``): each document judged relevant to the query (label >= ``rel``)."""

    def keys(qid: str) -> list[Hashable]:
        return [d for d, label in qrels.get(qid, {}).items() if label >= rel]

    return keys


def group_splits(
    items: Sequence[T], group: Callable[[T], Hashable], *, groups: Sequence[str] | None = None
) -> list[Split[T]]:
    """Leave-one-group-out: per group (``groups`` in that order, default all groups sorted by
    name), train on the other groups' items (input order), test on that group's."""
    present = {str(group(x)) for x in items}
    names = sorted(present) if groups is None else [str(g) for g in groups]
    missing = [g for g in names if g not in present]
    if missing:
        raise InputError(f"groups {missing} have no items; the items' groups are {sorted(present)}")
    if len(names) < 2:
        raise InputError(f"leave-one-group-out needs at least 2 groups, got {names}")
    twice = sorted({g for g in names if names.count(g) > 1})
    if twice:  # (each would be held out again, its items counted twice in the pooled means)
        raise InputError(f"groups {twice} are named more than once; name each group once")
    return [Split(g, [x for x in items if str(group(x)) != g], [x for x in items if str(group(x)) == g]) for g in names]


def cross_validate(
    splits: Iterable[Split[T]], fit: Callable[[list[T]], M], evaluate: Callable[[M, list[T]], Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Per split: ``{"fold", "n_train", "n_test", **evaluate(fit(train), test)}``."""
    return [
        {"fold": s.name, "n_train": len(s.train), "n_test": len(s.test), **evaluate(fit(s.train), s.test)}
        for s in splits
    ]


def pool(rows: Sequence[Mapping[str, Any]], n: str = "n_test") -> dict[str, float]:
    """Numeric columns of per-fold rows averaged with weights ``row[n]`` (test items per fold);
    a column holding a dict of them (``{"learned": {"nDCG@10": ...}}``, as
    :func:`~attnrank.rerank.learned.kfold_evaluate` gives) is pooled per key, as ``"learned
    nDCG@10"``; columns that are not numbers (Python or NumPy) in every row are left out."""
    if not rows:
        raise InputError("no fold rows to pool")
    rows = [_flat(r) for r in rows]
    total = sum(r[n] for r in rows)
    if not total > 0:  # (every fold empty divided by zero)
        raise InputError(f"the fold rows hold no test items ({n} sums to {total}); nothing to pool")
    keys = [c for c in rows[0] if c not in (n, "n_train", "fold") and all(is_real(r.get(c)) for r in rows)]
    return {c: sum(r[c] * r[n] for r in rows) / total for c in keys}


def _flat(row: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in row.items():
        out.update({f"{k} {ik}": iv for ik, iv in v.items()} if isinstance(v, Mapping) else {k: v})
    return out


def check_folds(folds: int, n: int, what: str) -> None:
    """``folds`` (the number of k-fold parts, as every k-fold in attnrank names it) within 2..``n``."""
    if not is_count(folds, 2) or folds > n:
        raise InputError(f"folds={folds!r} needs a whole number 2 <= folds <= {n} (the number of {what})")


def check_unique_queries(examples: Iterable[Any]) -> None:
    """Refuse labelled queries (anything with a ``qid``, and maybe a ``group``) that share a query
    id: runs, reports and held-out scores are keyed by it, so one would replace the other
    (datasets pooled with overlapping ids), and the two could sit on both sides of a fold."""
    seen: dict[str, Any] = {}
    for e in examples:
        group = getattr(e, "group", None)
        if e.qid in seen:
            where = "" if group is None else f" (groups {seen[e.qid]!r} and {group!r})"
            raise InputError(
                f"query id {e.qid!r} is in two examples{where}; give each query its own id (pooled "
                "datasets: e.g. prefix them with the dataset's name)"
            )
        seen[e.qid] = group
