"""Readers for the benchmark data sets, in the layout of the shared data folder.

The folder is ``data_root()``: an explicit path, else ``$ATTNRANK_DATA``, else
:data:`DEFAULT_DATA_ROOT` (``../shared/data``, relative to the working directory; callers may pass
their own ``default``). Only labels that ship with the data are used:

- ``scifact/``: BEIR SciFact, the train qrels (809 queries, binary);
- ``hotpotqa/``: HotpotQA dev distractor (400 questions), the supporting-paragraph flags;
- ``trec_dl/``: TREC DL19 passage, NIST qrels (graded 0–3, rel ≥ 2) and Pyserini's BM25 top-100;
- ``locomo/``: LoCoMo conversational memory (Maharana et al., 2024): the candidates of a question
  are its conversation's turns, the relevant ones the QA's evidence turns.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import random
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..corpus import load_corpus
from ..errors import InputError
from ..queries import load_queries
from ..types import Document, is_count
from .data import read_qrels

logger = logging.getLogger(__name__)

DEFAULT_DATA_ROOT = Path("..") / "shared" / "data"
HOTPOTQA_FILE = "hotpotqa_dev_distractor_400.jsonl.gz"
LOCOMO_FILE = "locomo10.json.gz"


def data_root(arg: str | Path | None = None, *, default: str | Path | None = None) -> Path:
    """The benchmark data folder: ``arg``, else ``$ATTNRANK_DATA``, else ``default``
    (:data:`DEFAULT_DATA_ROOT` if None); raises :class:`InputError` if it is not a folder."""
    root = Path(arg or os.environ.get("ATTNRANK_DATA") or (default if default is not None else DEFAULT_DATA_ROOT))
    if not root.is_dir():
        raise InputError(f"benchmark data folder {str(root)!r} not found; pass --data DIR or set ATTNRANK_DATA")
    return root


@dataclass
class Dataset:
    """A labelled retrieval set: documents, queries, graded qrels, the minimum label that counts as
    relevant for binary metrics (``rel``), optional per-query candidate ids (reranking sets, in
    first-stage or source order) and reference answers (QA sets)."""

    name: str
    docs: list[Document]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    rel: int = 1
    candidates: dict[str, list[str]] = field(default_factory=dict)
    answers: dict[str, list[str]] = field(default_factory=dict)
    # The ids the seeded sample order (:func:`sample_order`) is drawn over, where not the queries'
    # own: a loader fix that adds or drops a question reshuffles every position of that order, so
    # that "the first 400" (what presets were chosen on and weights trained on) would name others.
    sample_ids: list[str] = field(default_factory=list)

    def subset(self, qids: Iterable[str]) -> Dataset:
        """The same data restricted to ``qids`` (in that order); documents are shared."""
        qids = list(qids)
        return Dataset(
            self.name,
            self.docs,
            {q: self.queries[q] for q in qids},
            {q: self.qrels[q] for q in qids if q in self.qrels},
            self.rel,
            {q: self.candidates[q] for q in qids if q in self.candidates},
            {q: self.answers[q] for q in qids if q in self.answers},
            self.sample_ids,
        )


def check_sample_size(n: int | None) -> None:
    """A sample's query count: None or 0 (all of them), else a count >= 1."""
    if n is not None and not is_count(n, 0):
        raise InputError(f"n={n!r} queries: give a count >= 1 (or None/0 for all of them)")  # n<0 dropped the last


def sample_queries(qids: Iterable[str], n: int | None, seed: int = 0) -> list[str]:
    """A seeded sample: the sorted ids shuffled with ``random.Random(seed)``, first ``n`` (all if
    None or 0). Any prefix of the shuffled order is itself a sample, so smaller runs are subsets of larger."""
    check_sample_size(n)
    out = sorted(qids)
    random.Random(seed).shuffle(out)
    return out[:n] if n else out


def sample_order(ds: Dataset, seed: int = 0) -> list[str]:
    """``ds``'s queries in the seeded order: :func:`sample_queries` over ``ds.sample_ids`` where
    the dataset gives them (its queries only kept; a query they lack comes after them, in its own
    seeded order), else over its queries."""
    if not ds.sample_ids:
        return sample_queries(ds.queries, None, seed)
    known = set(ds.sample_ids)
    ordered = [q for q in sample_queries(known, None, seed) if q in ds.queries]
    return ordered + sample_queries([q for q in ds.queries if q not in known], None, seed)


def _need(path: Path) -> Path:
    if not path.exists():
        raise InputError(f"benchmark file {str(path)!r} not found; check the data folder (see its README)")
    return path


def scifact(root: Path) -> Dataset:
    """BEIR SciFact: the corpus (``corpus.jsonl[.gz]``) and the queries that have train qrels."""
    d = Path(root) / "scifact"
    docs, _ = load_corpus(_need(d))
    qrels = read_qrels(_need(d / "qrels" / "train.tsv"))
    queries = {q: t for q, t in load_queries(d / "queries.jsonl").items() if q in qrels}
    return Dataset("scifact-train", docs, queries, qrels)


def _slug(title: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", title).strip("_")


def hotpotqa_rows(root: Path) -> list[dict[str, Any]]:
    """The raw HotpotQA rows (``id``, ``question``, ``answers``, ``paragraphs``, ...)."""
    with gzip.open(_need(Path(root) / "hotpotqa" / HOTPOTQA_FILE), "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def hotpotqa(root: Path) -> Dataset:
    """All questions' paragraphs pooled into one corpus (deduplicated by title and text); a
    question's two supporting paragraphs are its relevant documents; ``candidates`` holds each
    question's own 10 paragraphs (the distractor setting)."""
    docs: dict[tuple[str, str], Document] = {}
    ids: set[str] = set()
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    cands: dict[str, list[str]] = {}
    answers: dict[str, list[str]] = {}
    for r in hotpotqa_rows(root):
        queries[r["id"]] = r["question"]
        answers[r["id"]] = list(r.get("answers", []))
        cands[r["id"]] = []
        for p in r["paragraphs"]:
            key = (p["title"], p["text"])
            if key not in docs:
                base = _slug(p["title"]) or "p"
                did, n = base, 1
                while did in ids:
                    n += 1
                    did = f"{base}__{n}"
                ids.add(did)
                docs[key] = Document(did, " ".join(p["sentences"]) or p["text"], p["title"])
            did = docs[key].id
            cands[r["id"]].append(did)
            if p["is_supporting"]:
                qrels.setdefault(r["id"], {})[did] = 1
    return Dataset("hotpotqa-dev400", list(docs.values()), queries, qrels, candidates=cands, answers=answers)


def dl19(root: Path) -> Dataset:
    """TREC DL19 passage: 43 topics, NIST qrels (graded, rel ≥ 2 binary), Pyserini BM25 top-100
    as the candidates (rank order)."""
    d = Path(root) / "trec_dl"
    with gzip.open(_need(d / "dl19_bm25_top100_passages.jsonl.gz"), "rt", encoding="utf-8") as f:
        docs = [Document(p["_id"], p["text"], p.get("title", "")) for p in map(json.loads, f)]
    run = dl19_run_rows(root)
    queries = {r["qid"]: r["query"] for r in run}
    cands = {r["qid"]: [c["docid"] for c in sorted(r["candidates"], key=lambda c: c["rank"])] for r in run}
    return Dataset(
        "dl19-passage", docs, queries, read_qrels(_need(d / "qrels.dl19-passage.txt")), rel=2, candidates=cands
    )


def dl19_run_rows(root: Path) -> list[dict[str, Any]]:
    """The BM25 run as stored: ``{"qid", "query", "candidates": [{"docid", "rank", "score"}]}`` a query."""
    with gzip.open(_need(Path(root) / "trec_dl" / "dl19_bm25_top100.jsonl.gz"), "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _turn_text(turn: dict[str, Any]) -> str:
    text = f"{turn['speaker']}: {turn['text']}"
    if turn.get("blip_caption"):  # the shared photo, as LoCoMo's own RAG baselines render it
        text += f" [shares a photo of {turn['blip_caption']}]"
    return text


def _evidence_tokens(evidence: Iterable[str]) -> list[str]:
    """A QA's evidence strings as written; a few hold several ids (``"D8:6; D9:17"``)."""
    return [t for e in evidence for t in re.split(r"[;,\s]+", str(e)) if t]


def _gold_answer(qa: dict) -> str:
    """A LoCoMo question's gold answer as LoCoMo's own scorer reads it: a category-3 answer (a
    judgement, "Likely no; though she likes ...") without the rationale after its first ";", which
    made a right short answer score EM 0 and F1 0.31 and let a wrong one outscore it."""
    answer = str(qa["answer"])
    if qa.get("category") == 3 and ";" in answer:
        head = answer.split(";")[0].strip()
        return head or answer
    return answer


def _evidence_ids(evidence: Iterable[str]) -> list[str]:
    """Turn ids of a QA's evidence; two source strings spell one otherwise than the turns do
    (``"D30:05"``, ``"D:11:26"``): read as ``D30:5``, ``D11:26``."""
    out = []
    for t in _evidence_tokens(evidence):
        m = re.fullmatch(r"D:?(\d+):0*(\d+)", t)
        out.append(f"D{int(m[1])}:{int(m[2])}" if m else t)
    return out


def locomo(root: Path, *, categories: Iterable[int] = (1, 2, 3, 4, 5)) -> Dataset:
    """LoCoMo (10 conversations): every turn is a document (``"<sample_id>:<dia_id>"``, text
    ``"speaker: text"``, the speaker and the session's number and date in ``metadata``); a question (``"<sample_id>:q<i>"``)
    of the given ``categories`` (5 = adversarial) has its conversation's turns as candidates (in
    conversation order) and its evidence turns as relevant (label 1). Evidence ids that name no
    turn are skipped (3 in the source, once two misspelled ones are read and repeated items counted
    once); questions left without evidence are dropped (4), and a repeated question is read once (12).
    A category-3 answer's rationale after ";" is not part of the gold answer (:func:`_gold_answer`)."""
    with gzip.open(_need(Path(root) / "locomo" / LOCOMO_FILE), "rt", encoding="utf-8") as f:
        samples = json.load(f)
    keep = set(categories)
    docs: list[Document] = []
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    cands: dict[str, list[str]] = {}
    answers: dict[str, list[str]] = {}
    missed = dropped = repeated = 0
    legacy: list[str] = []  # the questions as the loader read them before 2026-12-05: the seeded order's ids
    for s in samples:
        conv, sid = s["conversation"], s["sample_id"]
        sessions = sorted((int(k.split("_")[1]), k) for k in conv if re.fullmatch(r"session_\d+", k))
        turns = []
        for n, key in sessions:
            for t in conv[key]:
                turns.append(f"{sid}:{t['dia_id']}")
                docs.append(
                    Document(
                        turns[-1],
                        _turn_text(t),
                        metadata={
                            "conversation": sid,
                            "session": n,
                            "date_time": conv.get(f"{key}_date_time", ""),
                            "speaker": t["speaker"],
                        },
                    )
                )
        known = set(turns)
        repeats = _repeated(s["qa"], keep)
        repeated += len(repeats)
        for i, qa in enumerate(s["qa"]):
            if qa.get("category") in keep and known & {f"{sid}:{t}" for t in _evidence_tokens(qa.get("evidence", []))}:
                legacy.append(f"{sid}:q{i}")  # (repeats read twice, misspelled evidence not read)
            if qa.get("category") not in keep or i in repeats:
                continue
            ev = list(dict.fromkeys(f"{sid}:{t}" for t in _evidence_ids(qa.get("evidence", []))))  # (once each)
            rel = {t: 1 for t in ev if t in known}
            missed += len(ev) - len(rel)
            if not rel:
                dropped += 1
                continue
            qid = f"{sid}:q{i}"
            queries[qid], qrels[qid], cands[qid] = qa["question"], rel, turns
            answers[qid] = [_gold_answer(qa)] if "answer" in qa else []
    if missed:
        logger.info("LoCoMo: %d evidence ids name no turn and were skipped", missed)
    if repeated:
        logger.info(
            "LoCoMo: %d repeated question(s) (same question and evidence) were read once, an adversarial copy "
            "of an answerable question left out",
            repeated,
        )
    if dropped:  # say so: a question count below the source's is otherwise unexplained
        logger.info(
            "LoCoMo: %d question(s) of categories %s have no evidence turn and were dropped", dropped, sorted(keep)
        )
    return Dataset("locomo10", docs, queries, qrels, candidates=cands, answers=answers, sample_ids=legacy)


def _repeated(qa: list[dict], keep: Collection[int]) -> set[int]:
    """Indices of the QA items of categories ``keep`` that repeat an earlier one of them in the
    conversation (the same question and evidence; the source repeats 11 of conv-48's): one
    question is counted once. Where one is answerable (categories 1-4) and its repeat adversarial
    (5; conv-30's "What did Gina receive from a dance contest?"), the answerable one, with its
    answer, is kept (an item of a category not loaded repeats nothing: ``keep=(5,)`` loads Gina's)."""
    first: dict[tuple, int] = {}
    kept = [(i, item) for i, item in enumerate(qa) if item.get("category") in keep]
    for i, item in sorted(kept, key=lambda x: x[1].get("category") == 5):  # answerable first
        asked = (
            " ".join(str(item["question"]).lower().split()),
            tuple(sorted(_evidence_ids(item.get("evidence", [])))),
        )
        first.setdefault(asked, i)
    return {i for i, _ in kept} - set(first.values())


LOADERS = {"scifact": scifact, "hotpotqa": hotpotqa, "dl19": dl19, "locomo": locomo}


def load_dataset(name: str, root: Path) -> Dataset:
    """One of :data:`LOADERS` by name."""
    if name not in LOADERS:
        raise InputError(f"dataset {name!r} is not one of {sorted(LOADERS)}")
    return LOADERS[name](root)
