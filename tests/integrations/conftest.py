"""Fixtures of the framework adapter tests: a tiny random LLM saved to disk (adapters load it by
path, like a real model id) and a hybrid index over the packaged demo corpus."""

from __future__ import annotations

import pytest
from _tiny import save_tiny

QUERY = "What government position was held by the woman who portrayed Corliss Archer in the film Kiss and Tell?"


@pytest.fixture(scope="session")
def query() -> str:
    """A demo question (its supporting passages are in the demo corpus)."""
    return QUERY


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory) -> str:
    return str(save_tiny(tmp_path_factory.mktemp("llm") / "tiny", layers=2, max_positions=8192))


@pytest.fixture(scope="session")
def settings(tiny_path) -> dict:
    """AttentionReranker keyword arguments shared by the adapters under test (short passages keep
    the byte-level prompts of the tiny model small; nothing kept between queries, so that an
    adapter's scores can be compared exactly with a reranker's: reused passage states and vectors
    meet a query in other shapes and round differently, by up to ~1e-2 in bfloat16)."""
    return {"model": tiny_path, "max_doc_words": 40, "state_cache_mb": 0}


@pytest.fixture(scope="session")
def demo_index(tmp_path_factory):
    """The demo corpus indexed (BM25 + the packaged MiniLM embedder) and saved; returns the folder."""
    from attnrank.demo import demo_corpus_path
    from attnrank.index.retriever import HybridRetriever

    path = tmp_path_factory.mktemp("index") / "demo"
    HybridRetriever().index(demo_corpus_path(), show_progress=False).save(path)
    return path


@pytest.fixture(scope="session")
def demo_docs():
    from attnrank.corpus import load_corpus
    from attnrank.demo import demo_corpus_path

    return load_corpus(demo_corpus_path())[0]
