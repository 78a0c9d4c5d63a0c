"""The benchmarks' row cache: every head's attention rows per query, captured once and reused.

Attention-reranking benchmarks need, per query, all heads' rows (real query and "N/A") over the
same candidate prompt; capturing them is the expensive part (seconds per query on CPU), so they
are stored as ``.npz`` under ``<cache>/<setting key>_<model fingerprint[:12]>/<query name>.npz``
(a file name no other query id shares, :func:`cache_file`; arrays ``seconds`` and per window
``w<i>_doc_index``, ``w<i>_spans``, ``w<i>_input_ids``, ``w<i>_real``, ``w<i>_null`` as float32).
First-stage signals of the candidates are cached as JSON (``<cache>/signals_<setting key>.json``).
The cache is derived data (the benchmarks keep it in the git-ignored ``indexes/bench-cache``); a
file is written atomically, so an interrupted run leaves no half file.

The capturer is anything with ``windows(query, docs)`` (e.g. an ``AttentionReranker``) and an
``llm.fingerprint``; this module does not import the reranker (``attnrank.eval`` sits below it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..errors import InputError
from ..files import atomic_path, held_lock
from ..types import Document

logger = logging.getLogger(__name__)

_SAFE_LENGTH = 64  # keeps a file name well under file systems' 255-byte limit
_SAFE_STEM = re.compile(rf"[0-9a-z]{{1,{_SAFE_LENGTH}}}")  # ids that are their own file name


class RowCapturer(Protocol):
    """What :func:`capture_all` needs: the rows of one query over its candidates, and the model."""

    llm: Any

    def windows(self, query: str, docs: list[Document]) -> list[Any]: ...


@dataclass
class StoredRows:
    """One window's rows as cached: the fields of the reranker's ``WindowRows`` (``doc_index``,
    ``spans``, ``input_ids``, ``real``, ``null``, ``labelled``), kept as the float32 the model produced (half
    the memory of float64: 800 SciFact queries would not fit otherwise); :attr:`rows` is computed
    in float64 as the reranker computes it."""

    doc_index: list[int]
    spans: list[tuple[int, int]]
    input_ids: list[int]
    real: np.ndarray
    null: np.ndarray | None = None
    labelled: bool = True  # spans begin with their [i] slot label (full prompts; blocks have none)

    @property
    def rows(self) -> np.ndarray:
        """Calibrated rows ``real − null`` in float64 (``real`` without calibration)."""
        real = self.real.astype(np.float64)
        return real if self.null is None else real - self.null.astype(np.float64)


def setting_key(setting: str) -> str:
    """A file-name key for a setting without its sample size ``(N queries)`` / ``(N questions)``:
    larger samples are supersets of smaller ones (seeded shuffle / file order), so rows captured
    for 50 queries serve a run over 200. HotpotQA's ``(N seeded questions)`` keeps its size in the
    key (the caches recorded runs read are named so): each size captures its own rows."""
    return re.sub(r"[^A-Za-z0-9]+", "_", re.sub(r"\s*\(\d+ (queries|questions)\)", "", setting))


def cache_file(cache: Path | None, setting: str, qid: str, fingerprint: str) -> Path | None:
    """Where the rows of ``qid`` in ``setting`` for the model ``fingerprint`` live (None: no cache).

    ``fingerprint`` is the LLM's ``weights_key``: ``FINGERPRINT+int8`` for an int8 model, whose
    rows go to their own folder (``..._<hash12>-int8``)."""
    if cache is None:
        return None
    digest, _, quant = fingerprint.partition("+")
    tag = digest[:12] + (f"-{quant}" if quant else "")
    return Path(cache) / f"{setting_key(setting)}_{tag}" / f"{file_stem(qid)}.npz"


def file_stem(qid: str) -> str:
    """A file name for ``qid`` that no other id shares, even on a case-insensitive file system.

    An id that is already a safe name (digits and lowercase letters: SciFact's and TREC DL's
    numbers, HotpotQA's hex ids) is its own name, as it always was, so their cached rows stay
    valid. Any other id is a readable slug plus a hash of the exact id (``q_1-<16 hex>``); these
    names hold a ``-``, which safe names never do, so the two kinds cannot meet. Such ids used to
    be named by the slug alone, where ``a.b`` and ``a_b`` shared one file; files written under
    those old names are no longer read (their rows are captured again), which is safe for a
    rebuildable cache."""
    if _SAFE_STEM.fullmatch(qid):
        return qid
    slug = re.sub(r"[^A-Za-z0-9]+", "_", qid)[:_SAFE_LENGTH]
    return f"{slug}-{hashlib.sha256(qid.encode()).hexdigest()[:16]}"


def save_windows(path: Path, wins: Sequence[Any], seconds: float, doc_ids: Sequence[str] | None = None) -> None:
    """Store a query's windows and capture time (float32 rows; written atomically), and the
    digest of the candidate list (``doc_ids``, in order) they were captured over."""
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, Any] = {"seconds": np.array(seconds)}
    if doc_ids is not None:
        arrays["candidates"] = np.array(candidates_digest(doc_ids))
    for i, w in enumerate(wins):
        if w.null is None:
            raise InputError("the row cache stores calibrated windows (real and N/A rows); capture with calibration")
        arrays.update(
            {
                f"w{i}_doc_index": np.array(w.doc_index),
                f"w{i}_spans": np.array(w.spans),
                f"w{i}_input_ids": np.array(w.input_ids),
                f"w{i}_real": w.real.astype(np.float32),
                f"w{i}_null": w.null.astype(np.float32),
                f"w{i}_labelled": np.array(getattr(w, "labelled", True)),
            }
        )
    # (a temporary name of this writer's own: with one fixed name, two runs sharing a cache renamed
    # each other's half-written file into place)
    with atomic_path(path, fsync=False) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)


def stored_candidates(path: Path) -> str | None:
    """The candidate-list digest a cached query's windows record (None: written before they did)."""
    with np.load(path) as z:
        return str(z["candidates"]) if "candidates" in z else None


def load_windows(path: Path) -> tuple[list[StoredRows], float]:
    """A query's cached windows and the seconds their capture took."""
    with np.load(path) as z:
        wins, i = [], 0
        while f"w{i}_real" in z:
            wins.append(
                StoredRows(
                    z[f"w{i}_doc_index"].tolist(),
                    [tuple(s) for s in z[f"w{i}_spans"].tolist()],
                    z[f"w{i}_input_ids"].tolist(),
                    z[f"w{i}_real"],
                    z[f"w{i}_null"],
                    bool(z[f"w{i}_labelled"]) if f"w{i}_labelled" in z else True,  # older files: as before
                )
            )
            i += 1
        return wins, float(z["seconds"])


def capture_all(
    capturer: RowCapturer,
    setting: str,
    queries: Mapping[str, str],
    cands: Mapping[str, list[Document]],
    cache: Path | None,
) -> dict[str, dict[str, Any]]:
    """All-head real and N/A rows per query, ``{qid: {"windows": [...], "seconds": s}}``: read
    from ``cache`` where present and captured over the same candidate list (rows are placed by
    candidate position; :func:`_cached_windows`), else captured (and stored unless ``cache`` is
    None)."""
    out: dict[str, dict[str, Any]] = {}
    for qid, q in queries.items():
        f = cache_file(cache, setting, qid, getattr(capturer.llm, "weights_key", capturer.llm.fingerprint))
        ids = [d.id for d in cands[qid]]
        found = _cached_windows(f, cands[qid], capturer.llm.tokenizer) if f is not None and f.exists() else None
        if found is None:
            t = time.perf_counter()
            found = capturer.windows(q, cands[qid]), time.perf_counter() - t
            if f is not None:
                save_windows(f, *found, ids)
            logger.info("%s: captured %s in %.1f s (%d/%d)", setting, qid, found[1], len(out) + 1, len(queries))
        wins, secs = found
        out[qid] = {"windows": wins, "seconds": secs}
    logger.info("%s: %d queries captured", setting, len(out))
    return out


def _cached_windows(path: Path, docs: Sequence[Document], tokenizer: Any) -> tuple[list[StoredRows], float] | None:
    """:func:`load_windows` of ``path`` if it was captured over ``docs`` (in order), else None
    (logged). A file from before the candidate list was recorded is read only if each candidate's
    span of its stored prompt tokens decodes to text holding that candidate's first words; it is
    then written again with the list's digest."""
    ids = [d.id for d in docs]
    recorded = stored_candidates(path)
    if recorded is not None and recorded != candidates_digest(ids):
        logger.info("%s was captured over another candidate list; capturing again", path)
        return None
    wins, secs = load_windows(path)
    if recorded is None:
        if not _spans_hold(wins, docs, tokenizer):
            logger.info("%s holds other candidates than the %d given; capturing again", path, len(docs))
            return None
        save_windows(path, wins, secs, ids)  # checked: stamped with the list
    return wins, secs


def _spans_hold(wins: Sequence[StoredRows], docs: Sequence[Document], tokenizer: Any) -> bool:
    """Whether every candidate's span in the stored windows decodes to text that holds the
    candidate's first three words (and every candidate has exactly one span)."""
    placed = sorted(i for w in wins for i in w.doc_index)
    if placed != list(range(len(docs))):
        return False
    for w in wins:
        for i, (s, e) in zip(w.doc_index, w.spans):
            head = " ".join(docs[i].text.split()[:3])
            if head and head not in " ".join(tokenizer.decode(w.input_ids[s:e]).split()):
                return False
    return True


Signals = dict[str, dict[str, np.ndarray]]


CANDIDATES_KEY = "candidate ids sha1"  # a cached entry's record of the candidate list it was computed over


def candidates_digest(doc_ids: Sequence[str]) -> str:
    """What a cached entry records of its query's candidate list (ids, in order)."""
    return hashlib.sha1("\0".join(doc_ids).encode()).hexdigest()


def cached_signals(
    setting: str,
    qids: Sequence[str],
    compute: Callable[[list[str]], Mapping[str, Any]],
    cache: Path | None,
    candidates: Mapping[str, Sequence[str]] | None = None,
) -> Signals:
    """Per-query first-stage signals ``{qid: {name: scores over its candidates}}``: those in
    ``<cache>/signals_<setting key>.json`` are read, the others computed with ``compute(qids)``
    (``{qid: {name: [float, ...]}}``, NaN allowed) and added to the file. With ``candidates``
    (``{qid: [doc id, ...]}`` in the order the scores follow) an entry is read only if it was
    computed over that list: one computed over another (the first stage changed since) would give
    its scores to the wrong documents, so it is computed again."""
    path = None if cache is None else Path(cache) / f"signals_{setting_key(setting)}.json"
    known = json.loads(path.read_text()) if path is not None and path.exists() else {}
    digest = {q: candidates_digest(candidates[q]) for q in qids} if candidates is not None else {}
    todo = [q for q in qids if q not in known or (digest and known[q].get(CANDIDATES_KEY) != digest[q])]
    if todo:
        fresh = {q: dict(v) for q, v in compute(todo).items()}
        for q in fresh if digest else ():
            fresh[q][CANDIDATES_KEY] = digest[q]
        known.update(fresh)
        if path is not None:  # (read again under a lock: two runs sharing a cache dropped each other's entries)
            path.parent.mkdir(parents=True, exist_ok=True)
            with held_lock(path.with_name(f".{path.name}.lock")):
                current = json.loads(path.read_text()) if path.exists() else {}
                current.update(fresh)
                with atomic_path(path, fsync=False) as tmp:
                    tmp.write_text(json.dumps(current))
    return {q: {k: np.array(v, dtype=np.float64) for k, v in known[q].items() if k != CANDIDATES_KEY} for q in qids}


# -- runs over candidate lists ----------------------------------------------------------------
def run_of(
    cands: Mapping[str, Sequence[Document]], scores: Mapping[str, Sequence[float]]
) -> dict[str, dict[str, float]]:
    """A run ``{qid: {doc id: score}}`` from per-query scores in candidate order (one each)."""
    return {q: scores_by_id(q, [d.id for d in c], scores[q]) for q, c in cands.items()}


def scores_by_id(qid: str, doc_ids: Sequence[str], scores: Sequence[float] | np.ndarray) -> dict[str, float]:
    """One query's ``{doc id: score}`` from scores in candidate order, one each: zip would drop the
    candidates without a score from the run, as if never retrieved."""
    if len(scores) != len(doc_ids):
        raise InputError(f"query {qid!r} has {len(scores)} scores for {len(doc_ids)} candidates; give one each")
    return {d: float(s) for d, s in zip(doc_ids, scores)}


def first_stage_run(cands: Mapping[str, Sequence[Document]]) -> dict[str, dict[str, float]]:
    """The candidates' own order as a run (score ``len − position``)."""
    return {q: {d.id: float(len(c) - i) for i, d in enumerate(c)} for q, c in cands.items()}
