from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # shared test helpers (tests/_tiny.py)

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def scifact_mini() -> Path:
    return DATA / "scifact_mini"


@pytest.fixture(scope="session")
def dl19_mini() -> Path:
    return DATA / "dl19_mini"


@pytest.fixture(scope="session")
def scifact_docs(scifact_mini):
    from attnrank.corpus import load_corpus

    return load_corpus(scifact_mini)[0]


@pytest.fixture(scope="session")
def built_retriever(scifact_docs):
    """One hybrid index over the SciFact slice, shared by the read-only tests."""
    from attnrank.index.retriever import HybridRetriever

    return HybridRetriever().index(scifact_docs, show_progress=False)
