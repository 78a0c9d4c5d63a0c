"""Qrels and run files: TREC format (``qid Q0 docid rel`` / ``qid Q0 docid rank score tag``)
and BEIR's ``qrels/*.tsv`` (``query-id<TAB>corpus-id<TAB>score`` with a header line)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Mapping

from ..errors import InputError
from ..types import RankedResults

Qrels = dict[str, dict[str, int]]
Run = dict[str, dict[str, float]]


def read_qrels(path: str | Path) -> Qrels:
    """Read TREC qrels (4 columns) or BEIR qrels TSV (3 columns, optional header)."""
    p = Path(path)
    if p.is_dir():  # a BEIR folder: prefer test, then dev, then train
        p = next((p / "qrels" / f"{s}.tsv" for s in ("test", "dev", "train") if (p / "qrels" / f"{s}.tsv").exists()), p)
    if not p.is_file():
        raise InputError(f"qrels file {str(p)!r} does not exist; give a TREC qrels file or a BEIR qrels/*.tsv")
    qrels: Qrels = {}
    with open(p, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) == 4:
                qid, _, did, rel = parts
            elif len(parts) == 3:
                qid, did, rel = parts
            else:
                raise InputError(f"{p}:{lineno}: expected 'qid Q0 docid rel' or 'qid<TAB>docid<TAB>rel', got {line.strip()[:60]!r}")
            try:
                qrels.setdefault(qid, {})[did] = int(float(rel))
            except ValueError:
                if lineno == 1:  # BEIR header "query-id corpus-id score"
                    continue
                raise InputError(f"{p}:{lineno}: relevance {rel!r} is not a number") from None
    if not qrels:
        raise InputError(f"{p}: no judgments found")
    return qrels


def read_run(path: str | Path) -> Run:
    """Read a TREC run file (``qid Q0 docid rank score tag``)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"run file {str(p)!r} does not exist")
    run: Run = {}
    with open(p, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 6:
                raise InputError(f"{p}:{lineno}: expected 6 columns 'qid Q0 docid rank score tag', got {len(parts)}")
            try:
                run.setdefault(parts[0], {})[parts[2]] = float(parts[4])
            except ValueError:
                raise InputError(f"{p}:{lineno}: score {parts[4]!r} is not a number") from None
    if not run:
        raise InputError(f"{p}: empty run file")
    return run


def results_to_run(results: Iterable[RankedResults]) -> Run:
    run: Run = {}
    for i, res in enumerate(results):
        qid = res.query_id if res.query_id is not None else str(i)
        run[qid] = {r.id: r.score for r in res}
    return run


def write_run(run: Mapping[str, Mapping[str, float]] | Iterable[RankedResults], path: str | Path, tag: str = "attnrank") -> None:
    """Write a TREC run file atomically (ranks follow descending score, ties by doc id)."""
    if not isinstance(run, Mapping):
        run = results_to_run(run)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for qid, docs in run.items():
            ranked = sorted(docs.items(), key=lambda kv: (-kv[1], kv[0]))
            for rank, (did, score) in enumerate(ranked, start=1):
                f.write(f"{qid} Q0 {did} {rank} {score:.6f} {tag}\n")
    os.replace(tmp, p)
