from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import sys
from pathlib import Path

import pytest

from attnrank.index.sharded.executor import start_local_ray

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
    from attnrank.queries import load_queries

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
    start_local_ray(  # (not the cluster a RAY_ADDRESS of the environment names; on the loopback alone)
        ray,
        num_cpus=2,
        object_store_memory=200 << 20,
        include_dashboard=False,
        log_to_driver=False,
        logging_level="WARNING",
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


class OfflineHub:
    """A Hugging Face hub cache in a test's own folder; ``tried``: the connections attempted."""

    def __init__(self, root: Path):
        self.root, self.tried = root, []

    def snapshot(self, repo_id: str, commit: str, source: Path | None = None, files: tuple[Path, ...] = ()) -> Path:
        """Cache ``repo_id`` at ``commit`` (its main revision): a copy of the folder ``source``,
        or only ``files``; returns the snapshot folder."""
        folder = self.root / f"models--{repo_id.replace('/', '--')}" / "snapshots" / commit
        if source is not None:
            shutil.copytree(source, folder)
        folder.mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copy(f, folder)
        (folder.parents[1] / "refs").mkdir(exist_ok=True)
        (folder.parents[1] / "refs" / "main").write_text(commit)
        return folder


@pytest.fixture
def offline_hub(tmp_path, monkeypatch) -> OfflineHub:
    """An empty hub cache of the test's own (``HF_HUB_CACHE``, ``HF_HUB_OFFLINE`` unset) and no
    network: every connection attempt is recorded in ``tried`` and fails."""
    from huggingface_hub import constants

    hub = OfflineHub(tmp_path / "hub")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub.root))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def refuse(*address, **kwargs):
        hub.tried.append(address)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return hub


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


@pytest.fixture
def unwritable_dir(tmp_path) -> Path:
    """A folder no file can be created in: one without write permission, or as root (who writes
    through permission bits) a kernel folder that refuses new files."""
    if os.geteuid() == 0:
        locked = Path("/proc")
        if not locked.is_dir():
            pytest.skip("no folder that refuses root's writes")
        return locked
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    return locked
