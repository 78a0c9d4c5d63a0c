"""Fixtures of the reliability suite: two small prebuilt indexes (copied per case), a tiny LLM,
and the results file that ``scripts/make_reliability_doc.py`` renders into docs/reliability.md."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import _harness

_T0 = time.perf_counter()
RESULTS_JSON = Path(
    os.environ.get("ATTNRANK_RELIABILITY_JSON", _harness.REPO / "build" / "reliability" / "results.json")
)

B_DOCS = [
    ("b0", "Kyoto temples and gardens in autumn."),
    ("b1", "Sourdough bread needs a starter culture."),
    ("b2", "Glaciers carve U-shaped valleys."),
    ("b3", "The violin has four strings."),
    ("b4", "Octopuses have three hearts."),
    ("b5", "Saturn's rings are mostly ice."),
]


@pytest.fixture(scope="session")
def prebuilt(tmp_path_factory, scifact_mini):
    """Index A (the SciFact slice, 55 documents) and index B (6 other documents), built once."""
    from attnrank.corpus import load_corpus
    from attnrank.index.retriever import HybridRetriever
    from attnrank.types import Document

    root = tmp_path_factory.mktemp("prebuilt")
    a = HybridRetriever().index(load_corpus(scifact_mini)[0], show_progress=False).save(root / "A")
    b = HybridRetriever().index([Document(i, t) for i, t in B_DOCS], show_progress=False).save(root / "B")
    return a, b


@pytest.fixture(scope="session")
def prebuilt_rrf(tmp_path_factory, scifact_mini):
    """Index A built with RRF fusion asked for explicitly (new indexes fuse convexly by default)."""
    from attnrank.corpus import load_corpus
    from attnrank.index.retriever import HybridRetriever

    r = HybridRetriever(fusion="rrf").index(load_corpus(scifact_mini)[0], show_progress=False)
    return r.save(tmp_path_factory.mktemp("prebuilt-rrf") / "A-rrf")


@pytest.fixture
def work(tmp_path):
    """A fresh working directory for one case."""
    d = tmp_path / "work"
    d.mkdir()
    return d


@pytest.fixture
def index_a(prebuilt, work):
    """A private copy of index A at ``work/indexes/a`` (the CLI's ``--index a``)."""
    target = work / "indexes" / "a"
    shutil.copytree(prebuilt[0], target)
    return target


@pytest.fixture
def index_a_rrf(prebuilt_rrf, work):
    """A private copy of the RRF index A at ``work/indexes/a-rrf`` (``--index a-rrf``)."""
    target = work / "indexes" / "a-rrf"
    shutil.copytree(prebuilt_rrf, target)
    return target


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    from _tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny") / "llm", max_positions=2048)


def pytest_sessionfinish(session, exitstatus):
    if _harness.RESULTS:
        _harness.write_results(RESULTS_JSON, time.perf_counter() - _T0)
