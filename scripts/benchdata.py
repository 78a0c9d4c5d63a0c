"""Readers for the shared benchmark data (``../shared/data`` or ``$ATTNRANK_DATA``) and output helpers.

Only labels that ship with the data are used: SciFact train qrels, TREC DL19 NIST qrels, and
HotpotQA's supporting-paragraph flags.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import json
import os
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path

from attnrank.corpus import load_corpus, load_queries
from attnrank.eval import read_qrels
from attnrank.types import Document

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "results"


def data_root(arg: str | None = None) -> Path:
    root = Path(arg or os.environ.get("ATTNRANK_DATA") or REPO.parent / "shared" / "data")
    if not root.is_dir():
        raise SystemExit(f"benchmark data folder {root} not found; pass --data DIR or set ATTNRANK_DATA")
    return root


@dataclass
class Dataset:
    name: str
    docs: list[Document]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    rel: int = 1  # minimum label for binary metrics
    candidates: dict[str, list[str]] = field(default_factory=dict)  # per-query candidate ids (reranking sets)


def scifact(root: Path) -> Dataset:
    d = root / "scifact"
    docs, _ = load_corpus(d / "corpus.jsonl.gz")
    qrels = read_qrels(d / "qrels" / "train.tsv")
    queries = {q: t for q, t in load_queries(d / "queries.jsonl").items() if q in qrels}
    return Dataset("scifact-train", docs, queries, qrels)


def _slug(title: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", title).strip("_")


def hotpotqa_rows(root: Path) -> list[dict]:
    with gzip.open(root / "hotpotqa" / "hotpotqa_dev_distractor_400.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def hotpotqa(root: Path) -> Dataset:
    """All questions' paragraphs pooled into one corpus (deduplicated by title and text);
    a question's two supporting paragraphs are its relevant documents; ``candidates`` holds
    each question's own 10 paragraphs (the distractor setting)."""
    docs: dict[tuple[str, str], Document] = {}
    ids: set[str] = set()
    queries, qrels, cands = {}, {}, {}
    for r in hotpotqa_rows(root):
        queries[r["id"]] = r["question"]
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
    return Dataset("hotpotqa-dev400", list(docs.values()), queries, qrels, candidates=cands)


def dl19(root: Path) -> Dataset:
    """TREC DL19 passage: 43 topics, NIST qrels (graded, rel ≥ 2 binary), Pyserini BM25 top-100."""
    d = root / "trec_dl"
    with gzip.open(d / "dl19_bm25_top100_passages.jsonl.gz", "rt", encoding="utf-8") as f:
        docs = [Document(p["_id"], p["text"], p.get("title", "")) for p in map(json.loads, f)]
    with gzip.open(d / "dl19_bm25_top100.jsonl.gz", "rt", encoding="utf-8") as f:
        run = [json.loads(line) for line in f]
    queries = {r["qid"]: r["query"] for r in run}
    cands = {r["qid"]: [c["docid"] for c in sorted(r["candidates"], key=lambda c: c["rank"])] for r in run}
    return Dataset("dl19-passage", docs, queries, read_qrels(d / "qrels.dl19-passage.txt"), rel=2, candidates=cands)


def environment() -> dict:
    import torch

    return {"date": _dt.date.today().isoformat(), "python": platform.python_version(),
            "torch": torch.__version__, "cpus": len(os.sched_getaffinity(0)), "threads": torch.get_num_threads(),
            "machine": platform.machine()}


def write_outputs(name: str, payload: dict, markdown: str, out_dir: Path = OUT) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(payload, indent=1), encoding="utf-8")
    (out_dir / f"{name}.md").write_text(markdown, encoding="utf-8")
    print(markdown)


def md_table(rows: list[dict], cols: list[str], fmt: dict[str, str] | None = None) -> str:
    fmt = fmt or {}
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c, "")
            if isinstance(v, float):
                cells.append("—" if v != v else format(v, fmt.get(c, ".4f")))  # NaN: not measured
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
