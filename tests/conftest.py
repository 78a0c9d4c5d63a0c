from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # shared test helpers (tests/_tiny.py)

# The framework packages under test report usage from background threads (Haystack through
# posthog): off, so that no test reaches the network, and their retries never land in another
# test's captured logs (a CI run failed on one).
for _name, _value in (
    ("HAYSTACK_TELEMETRY_ENABLED", "False"),
    ("DO_NOT_TRACK", "1"),
    ("ANONYMIZED_TELEMETRY", "False"),
):
    os.environ.setdefault(_name, _value)

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
def scifact_queries(scifact_mini):
    from attnrank.corpus import load_queries

    return load_queries(scifact_mini / "queries.jsonl")


@pytest.fixture(scope="session")
def built_retriever(scifact_docs):
    """One hybrid index over the SciFact slice, shared by the read-only tests."""
    from attnrank.index.retriever import HybridRetriever

    return HybridRetriever().index(scifact_docs, show_progress=False)


@pytest.fixture(scope="session")
def llm():
    """One tiny random Llama (4 layers x 4 heads, GQA over 2 kv heads) shared by the model-level tests."""
    from _tiny import tiny_model, tiny_tokenizer

    from attnrank.llm.models import LLM

    model = tiny_model("llama", layers=4, heads=4, kv_heads=2, max_positions=16384)
    return LLM(model=model, tokenizer=tiny_tokenizer(), model_id="tiny-llama", fingerprint="f" * 64)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """The same kind of tiny model saved as a local model folder (for ``--model PATH`` and load_llm)."""
    from _tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("m") / "tiny", layers=3, max_positions=16384)


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray (2 logical CPUs, 200 MiB object store, no dashboard), shut down after the session."""
    ray = pytest.importorskip("ray")
    ray.init(
        num_cpus=2, object_store_memory=200 << 20, include_dashboard=False, log_to_driver=False, logging_level="WARNING"
    )
    yield ray
    ray.shutdown()


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """An empty attnrank home (ATTNRANK_HOME: caches and the user registry) for one test."""
    monkeypatch.setenv("ATTNRANK_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def embedded(monkeypatch) -> list[int]:
    """How many texts each call of the rerankers' embedder encode is given (the real one runs)."""
    from attnrank.rerank import signals

    sizes: list[int] = []
    real = signals.encode

    def counted(model, texts, **kw):
        sizes.append(len(texts))
        return real(model, texts, **kw)

    monkeypatch.setattr(signals, "encode", counted)
    return sizes
