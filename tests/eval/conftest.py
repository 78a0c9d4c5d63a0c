"""A slice of the shared benchmark data folder in its own layout, built from tests/data."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

DATA = Path(__file__).parents[1] / "data"


def _gz(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as f, gzip.open(dst, "wb") as g:
        shutil.copyfileobj(f, g)


@pytest.fixture(scope="session")
def shared_mini(tmp_path_factory) -> Path:
    """``scifact/``, ``trec_dl/`` (from dl19_mini: its run as the BM25 top-k), ``hotpotqa/`` (3
    questions) and ``locomo/`` (one conversation, 2 sessions) in the shared data layout."""
    root = tmp_path_factory.mktemp("shared") / "data"
    sf = DATA / "scifact_mini"
    (root / "scifact" / "qrels").mkdir(parents=True)
    _gz(sf / "corpus.jsonl", root / "scifact" / "corpus.jsonl.gz")
    shutil.copy(sf / "queries.jsonl", root / "scifact" / "queries.jsonl")
    shutil.copy(sf / "qrels" / "train.tsv", root / "scifact" / "qrels" / "train.tsv")
    dl, td = DATA / "dl19_mini", root / "trec_dl"
    _gz(dl / "passages.jsonl", td / "dl19_bm25_top100_passages.jsonl.gz")
    shutil.copy(dl / "qrels.txt", td / "qrels.dl19-passage.txt")
    topics = dict(line.rstrip("\n").split("\t") for line in (dl / "topics.tsv").read_text().splitlines() if line)
    run: dict[str, list[dict]] = {}
    for line in (dl / "run.bm25.trec").read_text().splitlines():
        q, _, d, rank, score, _ = line.split()
        run.setdefault(q, []).append({"docid": d, "rank": int(rank), "score": float(score)})
    with gzip.open(td / "dl19_bm25_top100.jsonl.gz", "wt", encoding="utf-8") as f:
        for q, c in run.items():
            f.write(
                json.dumps({"qid": q, "query": topics[q], "candidates": c[::-1]}) + "\n"
            )  # stored out of rank order
    _gz(DATA / "hotpotqa_mini" / "hotpotqa.jsonl", root / "hotpotqa" / "hotpotqa_dev_distractor_400.jsonl.gz")
    _gz(DATA / "locomo_mini" / "locomo.json", root / "locomo" / "locomo10.json.gz")
    return root
