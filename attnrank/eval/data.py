"""Qrels and run files: TREC format (``qid Q0 docid rel`` / ``qid Q0 docid rank score tag``)
and BEIR's ``qrels/*.tsv`` (``query-id<TAB>corpus-id<TAB>score`` with a header line)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..config import fault_point
from ..errors import InputError
from ..files import atomic_path, check_file_target, is_attnrank_run, is_run, replace_guard
from ..records import text_lines
from ..types import RankedResults

Qrels = dict[str, dict[str, int]]
Run = dict[str, dict[str, float]]

logger = logging.getLogger(__name__)


def qrels_splits(folder: Path) -> list[Path]:
    """A BEIR folder's qrels files, ``qrels/test.tsv``, ``dev.tsv``, ``train.tsv`` in that order, those that exist."""
    return [folder / "qrels" / f"{s}.tsv" for s in ("test", "dev", "train") if (folder / "qrels" / f"{s}.tsv").exists()]


def read_qrels(path: str | Path) -> Qrels:
    """Read TREC qrels (4 columns) or BEIR qrels TSV (3 columns, optional header); a BEIR folder's
    ``qrels/test.tsv``, else ``dev.tsv``, else ``train.tsv`` (a warning names the choice where it
    holds several: give the file to read another). A pair judged twice with different labels keeps the last one, with a
    warning naming where."""
    p = Path(path)
    if p.is_dir():  # a BEIR folder: prefer test, then dev, then train
        found = qrels_splits(p)
        # (a warning: logged at INFO, never shown by `attnrank eval`, the other splits' queries went unscored unsaid)
        if len(found) > 1:
            logger.warning(
                "%s: reading the qrels of %s (beside %s); give the qrels file to read another",
                p,
                found[0].name,
                ", ".join(f.name for f in found[1:]),
            )
        p = found[0] if found else p
    if p.is_dir():  # (a qrels folder itself, or any other: "does not exist" said of a folder that does)
        raise InputError(
            f"{str(p)!r} is a folder with no qrels/test.tsv, dev.tsv or train.tsv; give the qrels .tsv file"
        )
    if not p.is_file():
        raise InputError(f"qrels file {str(p)!r} does not exist; give a TREC qrels file or a BEIR qrels/*.tsv")
    qrels: Qrels = {}
    dups: list[str] = []
    for lineno, line in text_lines(p):
        # tab-separated (BEIR) fields may hold spaces; TREC qrels are whitespace-separated
        parts = [x.strip() for x in line.rstrip("\r\n").split("\t")] if "\t" in line else line.split()
        fields = line.split()
        if len(parts) < 4 and len(fields) == 4 and fields[1] in ("0", "Q0") and any(" " in x for x in parts):
            # TREC's columns with a tab among them ("q1 0<TAB>d1<TAB>1": its iteration column "0"), not a
            # query "q1 0"; a BEIR id may hold a space ("q1<TAB>doc a<TAB>1" stays three fields)
            parts = fields
        while len(parts) > 3 and not parts[-1]:  # trailing tabs add nothing (they moved the columns)
            parts.pop()
        if not any(parts):
            continue
        if len(parts) == 4:
            qid, _, did, rel = parts
        elif len(parts) == 3:
            qid, did, rel = parts
        else:
            raise InputError(
                f"{p}:{lineno}: expected 'qid Q0 docid rel' or 'qid<TAB>docid<TAB>rel', got {line.strip()[:60]!r}"
            )
        try:
            value = float(rel)
        except ValueError:
            if lineno == 1 and len(parts) == 3 and _header_like(parts):
                continue  # BEIR's header "query-id corpus-id score"
            raise InputError(f"{p}:{lineno}: relevance {rel!r} is not a number") from None
        if not math.isfinite(value) or not value.is_integer():  # int() truncated 0.6 to 0, silently
            raise InputError(f"{p}:{lineno}: relevance {rel!r} is not a whole number; give graded labels 0, 1, 2, ...")
        label = int(value)
        if not qid or not did:  # (a relevant document no run can hold lowered the query's nDCG)
            raise InputError(f"{p}:{lineno}: empty {'query' if not qid else 'document'} id; give both ids")
        judged = qrels.setdefault(qid, {})
        if did in judged and judged[did] != label:
            dups.append(f"{p}:{lineno}")
        judged[did] = label
    if not qrels:
        raise InputError(f"{p}: no judgments found")
    if dups:
        logger.warning(
            "%s: %d (query, document) pair(s) judged again with another label, first at %s; kept the last label",
            p,
            len(dups),
            dups[0],
        )
    return qrels


def read_run(path: str | Path) -> Run:
    """Read a TREC run file (``qid Q0 docid rank score tag``).

    A (query, document) pair listed more than once keeps its FIRST line (the one a reader of the
    file meets first; trec_eval refuses such a run); the later lines are dropped and a warning
    says how many and where the first one is.
    """
    p = Path(path)
    if p.is_dir():
        raise InputError(f"run file {str(p)!r} is a folder; give the run's file (qid Q0 docid rank score tag)")
    if not p.is_file():
        raise InputError(f"run file {str(p)!r} does not exist")
    run: Run = {}
    ranks: dict[str, dict[str, int]] = {}
    dups: list[str] = []
    for lineno, line in text_lines(p):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 6:
            raise InputError(f"{p}:{lineno}: expected 6 columns 'qid Q0 docid rank score tag', got {len(parts)}")
        try:
            rank = int(parts[3])
        except ValueError:  # e.g. rank and score swapped: the order would come out reversed
            raise InputError(
                f"{p}:{lineno}: rank {parts[3]!r} is not an integer; the columns are 'qid Q0 docid rank score tag'"
            ) from None
        try:
            score = float(parts[4])
        except ValueError:
            raise InputError(f"{p}:{lineno}: score {parts[4]!r} is not a number") from None
        if score != score or score in (float("inf"), float("-inf")):
            raise InputError(f"{p}:{lineno}: score {parts[4]!r} is not a finite number")
        docs = run.setdefault(parts[0], {})
        if parts[2] in docs:
            dups.append(f"{p}:{lineno}")
            continue
        docs[parts[2]] = score
        ranks.setdefault(parts[0], {})[parts[2]] = rank
    if not run:
        raise InputError(f"{p}: empty run file")
    _warn_ties_against_ranks(p, run, ranks)
    if dups:
        logger.warning(
            "%s: %d duplicate (query, document) line(s), first at %s; kept the first line of each pair",
            p,
            len(dups),
            dups[0],
        )
    return run


def highest_label(qrels: Mapping[str, Mapping[str, int]]) -> int:
    """The highest relevance label of ``qrels`` (0 where none is judged)."""
    return max((label for judged in qrels.values() for label in judged.values()), default=0)


def check_relevance_level(qrels: Qrels, rel: int, option: str = "--rel") -> None:
    """Refuse a relevance level ``rel`` above every label of ``qrels``: no document is relevant
    then, so every binary metric (recall, RR, P) reads 0 with nothing said (graded nDCG does not),
    and training finds no relevant candidate. The message names the highest label."""
    top = highest_label(qrels)
    if 1 <= top < rel:  # (qrels judging nothing relevant at any level are the user's to evaluate)
        raise InputError(
            f"{option} {rel} is above every label of the qrels (the highest is {top}), so no document counts as "
            f"relevant and every binary metric reads 0; give {option} {top} or lower"
        )


def _warn_ties_against_ranks(path: Path, run: Run, ranks: dict[str, dict[str, int]]) -> None:
    """Say where a query's scores put its documents in another order than its rank column: such
    a run is read, reranked and evaluated in trec_eval's order (:func:`trec_order`: by score, ties
    by doc id), so a run ranked by its rank column alone (every score 1.0, or the rank written as
    the score) lost its order without a word, and ``rerank --depth`` took other documents."""
    changed, tied = [], 0
    for qid, scores in run.items():
        order = [d for d, _ in trec_order(scores)]
        if order != sorted(order, key=lambda d: ranks[qid][d]):  # (stable: equal ranks keep trec_eval's order)
            changed.append(qid)
            tied += any(trec_score(scores[a]) == trec_score(scores[b]) for a, b in zip(order, order[1:]))
    if changed:
        logger.warning(
            "%s: %d quer(ies) (first %r; %d with tied scores) rank documents in another order by their scores "
            "than by their rank column; read by score (ties by doc id descending), as trec_eval reads them: give "
            "scores that fall as the rank rises (e.g. the negated rank) for the rank column's order",
            path,
            len(changed),
            changed[0],
            tied,
        )


def results_to_run(results: Iterable[RankedResults]) -> Run:
    """``{query id: {doc id: score}}`` of ``results``, each with its query id: a result without one
    is refused (numbered by its position, a ranking was evaluated against the judgments of the
    query whose id was that number: nDCG@10 0.048 for 0.821, exit 0). A query id twice is refused
    (the later ranking replaced the earlier one, and the run silently lacked a query). Tied scores
    are made strictly decreasing in the ranking's own order (each the next float below the one
    before): trec_eval, and :func:`trec_order`, would break the tie by doc id, and evaluate (and
    write) another order than the ranking's."""
    run: Run = {}
    for i, res in enumerate(results):
        qid = res.query_id
        if qid is None:
            raise InputError(
                f"results #{i} (query {res.query[:60]!r}) have no query_id, by which qrels and run files key a "
                "ranking; search with query_ids=[...] or a {query_id: text} mapping (rank(..., query_id=...))"
            )
        if qid in run:
            raise InputError(f"results #{i} repeat the query id {qid!r}; give each ranking its own query_id")
        seen = {r.id for r in res}
        if len(seen) < len(res):  # (the run keeps one score a document: the later, lower one was written)
            twice = next(d for d in (r.id for r in res) if sum(x.id == d for x in res) > 1)
            raise InputError(f"results of query {qid!r} list the document {twice!r} twice; a ranking lists each once")
        run[qid] = strictly_decreasing((r.id, r.score) for r in res)
    return run


def as_run(run: Any) -> Run:
    """``run`` as ``{query id: {doc id: score}}``: a mapping of that shape as it is, or
    :class:`RankedResults` (one, or a list) through :func:`results_to_run`. Why one function:
    ``write_run`` took a list of results and ``evaluate`` did not, and a wrong shape (one
    ``RankedResults``, ``{qid: [doc ids]}``, a line of text) failed as an AttributeError."""
    if isinstance(run, RankedResults):
        run = [run]
    if isinstance(run, Mapping):
        bad = next(((q, v) for q, v in run.items() if not isinstance(v, Mapping)), None)
        if bad is not None:
            raise InputError(
                f"the run's query {bad[0]!r} holds a {type(bad[1]).__name__}, not {{doc id: score}}; a run is "
                "{query id: {doc id: score}}, or a list of RankedResults"
            )
        return run  # type: ignore[return-value]
    items = list(run) if isinstance(run, Iterable) and not isinstance(run, (str, bytes)) else None
    if items is None or not all(isinstance(r, RankedResults) for r in items):
        raise InputError(
            f"the run is a {type(run).__name__}; give {{query id: {{doc id: score}}}}, or a list of RankedResults"
        )
    return results_to_run(items)


def _header_like(parts: list[str]) -> bool:
    """Whether a qrels line's three fields name columns (BEIR's ``query-id corpus-id score``), not a
    judgment whose label is mistyped (which is refused, not dropped as a header)."""
    names = {p.strip().lower().replace("_", "-") for p in parts}
    return bool(names & {"query-id", "qid", "query", "corpus-id", "doc-id", "docid", "score", "relevance", "label"})


def trec_score(score: float) -> float:
    """``score`` as trec_eval holds a run's score: a 32-bit float (its ``float sim``; pytrec_eval
    and ir-measures read runs so too). Two scores that differ only past 32-bit precision are a tie
    there, broken by doc id: ranked by their 64-bit values, attnrank evaluated and wrote another
    order than trec_eval reads (RR 1.0 where trec_eval gave 0.5)."""
    with np.errstate(over="ignore"):  # (past float32's range: inf, as trec_eval reads such a score)
        return float(np.float32(score))


def strictly_decreasing(ranked: Iterable[tuple[str, float]]) -> dict[str, float]:
    """``{doc id: score}`` of ``(doc id, score)`` pairs in rank order, each score that is not below
    the one before as trec_eval reads scores (:func:`trec_score`) made the next 32-bit float below
    it, so that trec_eval ranks them in this order (not by doc id). NaN (ranked last) stays NaN; so
    do ties at -inf, which have no float below them."""
    scores: dict[str, float] = {}
    last = None  # (not +inf: a first score of +inf became the largest finite float, past the finiteness check)
    previous = 0.0  # the last score given, as given
    for doc_id, value in ranked:  # (ranked: scores never rise)
        score = float(value)
        if last is not None and trec_score(score) >= last:
            stepped = float(np.nextafter(np.float32(last), np.float32(-np.inf)))
            # (past float32's range, a finite score has no 32-bit step below: a 64-bit one, not -inf)
            score = (
                stepped
                if math.isfinite(stepped) or not math.isfinite(previous)
                else math.nextafter(previous, -math.inf)
            )
        scores[doc_id] = score
        if not math.isnan(score):
            last, previous = trec_score(score), score
    return scores


def trec_order(scores: Mapping[str, float]) -> list[tuple[str, float]]:
    """One query's ``(doc id, score)`` pairs in the order trec_eval ranks them: score descending as
    a 32-bit float (:func:`trec_score`), ties by doc id *descending* (trec_eval ignores the rank
    column), so the order attnrank reads from or writes into a run is the one its evaluation sees."""
    return sorted(scores.items(), key=lambda kv: (trec_score(kv[1]), kv[0]), reverse=True)


def unrunnable_ids(ids: Iterable[object]) -> list[str]:
    """The ids a TREC run line cannot hold (one field each): empty, or holding whitespace."""
    return [str(i) for i in ids if not str(i) or any(c.isspace() for c in str(i))]


def check_run_ids(kind: str, ids: Iterable[object], fix: str = "give ids without spaces") -> None:
    """Ids a TREC run line can hold (one field each), or one line naming the first that cannot be
    (``kind``: "query" or "document"; ``fix``: what the user should do)."""
    bad = next(iter(unrunnable_ids(ids)), None)
    if bad is not None:
        raise InputError(
            f"{kind} id {bad!r} is empty or holds whitespace, which a TREC run cannot hold (one field per column); {fix}"
        )


def _check_run(run: Mapping[str, Mapping[str, float]]) -> None:
    """Ids a TREC line can hold (one field each) and finite scores, or one line naming the first bad one."""
    check_run_ids("query", run)
    for qid, docs in run.items():
        check_run_ids("document", docs)
        for did, score in docs.items():
            if not math.isfinite(score):
                raise InputError(
                    f"query {qid!r}, document {did!r} has score {score}; a run needs finite scores "
                    "(check the model's dtype and weights)"
                )


def write_run(
    run: Mapping[str, Mapping[str, float]] | Iterable[RankedResults],
    path: str | Path,
    tag: str = "attnrank",
    guard: Callable[[Path], None] | None = None,
    *,
    force: bool = False,
) -> None:
    """Write a TREC run file atomically, ranked in :func:`trec_order` (ties by doc id descending,
    as trec_eval ranks them whatever the rank column says). Scores have
    6 decimals, or, in a query where that would tie two different scores, their full value: trec_eval
    re-ranks tied scores by doc id, so rounding would change the ranking it evaluates. ``tag``: the
    last column (no whitespace). ``guard``: called on the path before writing and just before it is
    replaced (:func:`attnrank.files.atomic_path`); without one, a file is replaced only if empty, a
    run attnrank wrote (every tag "attnrank...") or a run of this ``tag``, unless ``force``. A
    query without documents has no line; a run without any document is refused (:class:`InputError`),
    and nothing is written."""
    run = as_run(run)
    _check_run(run)
    if not isinstance(tag, str) or not tag or any(c.isspace() for c in tag):
        raise InputError(
            f"run tag {tag!r} is empty or holds whitespace, which a TREC run's last column cannot hold; "
            "give a tag without spaces"
        )
    p = Path(path)
    check_file_target(p, "the run file")
    if guard is None and not force:
        own = tag  # (a run of this tag: one the caller wrote before)
        guard = replace_guard(
            lambda f: is_attnrank_run(f) or is_run(f, lambda t: t.decode("utf-8", "replace") == own),
            "a TREC run",
            "the run file",
        )
    if guard is not None:  # (before the work, not only at the rename)
        guard(p)
    with atomic_path(p, guard=guard) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for qid, docs in run.items():
            ranked = trec_order(docs)
            text = [f"{score:.6f}" for _, score in ranked]
            # two different scores that read back alike (0.000000 and -0.000000 too) would let
            # trec_eval reorder them by doc id
            back = [trec_score(float(t)) for t in text]
            held = [trec_score(score) for _, score in ranked]
            if any(back[i] == back[i + 1] and held[i] != held[i + 1] for i in range(len(text) - 1)):
                text = [repr(float(score)) for _, score in ranked]
            for rank, ((did, _), score) in enumerate(zip(ranked, text), start=1):
                f.write(f"{qid} Q0 {did} {rank} {score} {tag}\n")
        if f.tell() == 0:  # (checked as written: a batch's run is read from its parts once)
            raise InputError(
                f"the run ranks no document, so nothing was written to {p}: an empty run file is no run to "
                "read_run, `attnrank eval` or trec_eval; give at least one query with a ranked document"
            )
        fault_point("run-write", p)
