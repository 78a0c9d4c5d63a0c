"""Passage-state store sizes for the block-attention benchmark: bytes per passage token and the
size of a store from block token counts, and a real store built and measured (used by
``scripts/bench_rerank.py --blocks``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..config import STATE_STORAGES
from ..eval.datasets import dl19, scifact
from ..llm.blocks import encode_blocks_text
from ..llm.statestore_write import remove_store
from ..rerank.attention import AttentionReranker
from ..types import Document


def store_sizes(root: Path, max_doc_words: int = 300) -> list[dict[str, Any]]:
    """Bytes per passage token and the size of a passage-state store for the SciFact corpus and
    the DL19 BM25 top-20/top-100 candidates, from their block token counts (preset ``qrhead``: the
    layers up to its deepest head; the model's dtype in memory, float16 or int8 on disk)."""
    reranker = AttentionReranker(attention="block", signals=None)
    cfg = reranker.capturer.decoder.config
    layers = reranker.capturer.deepest_layer + 1
    kv, dim = (
        int(cfg.num_key_value_heads),
        int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads),
    )
    dtype = next(reranker.llm.model.parameters()).dtype  # what the in-memory cache holds
    per_token = {f"{str(dtype).removeprefix('torch.')} (memory)": 2 * layers * kv * dim * dtype.itemsize}
    for storage in STATE_STORAGES:
        values = 2 * layers * kv * dim * (2 if storage == "float16" else 1)
        per_token[storage] = values + (2 * layers * kv * 2 if storage == "int8" else 0)  # + float16 scales
    sets: dict[str, list[Document]] = {"SciFact corpus": scifact(root).docs}
    ds = dl19(root)
    docs = {d.id: d for d in ds.docs}
    for depth in (20, 100):
        ids = dict.fromkeys(i for q in ds.queries for i in ds.candidates[q][:depth])
        sets[f"DL19 BM25 top-{depth} candidates"] = [docs[i] for i in ids]
    rows = []
    for name, passages in sets.items():
        blocks = encode_blocks_text(reranker.llm.tokenizer, passages, max_doc_words, None)[0]
        tokens = sum(len(b) for b in blocks)
        row: dict[str, Any] = {"passages": name, "count": len(passages), "tokens": tokens}
        row |= {f"{k} GiB": tokens * v / 2**30 for k, v in per_token.items()}
        rows.append(row)
    return [{"bytes/token": per_token}, *rows]


def build_store(root: Path, folder: Path, storage: str = "float16", depth: int = 20) -> dict[str, Any]:
    """Build a real passage-state store for the DL19 BM25 top-``depth`` candidates (preset
    ``qrhead``); its seconds, bytes on disk and bytes per token."""
    if folder.exists() and any(folder.iterdir()):
        remove_store(folder)  # the previous run's store, and only a store (refused otherwise)
    elif folder.exists():
        folder.rmdir()
    reranker = AttentionReranker(attention="block", signals=None)
    ds = dl19(root)
    docs = {d.id: d for d in ds.docs}
    passages = [docs[i] for i in dict.fromkeys(i for q in ds.queries for i in ds.candidates[q][:depth])]
    t = time.perf_counter()
    header = reranker.write_passage_states(folder, passages, storage=storage)
    secs = time.perf_counter() - t
    size = sum(p.stat().st_size for p in folder.iterdir())
    return {
        "passages": f"DL19 BM25 top-{depth} candidates",
        "storage": storage,
        "count": len(passages),
        "tokens": header["tokens"],
        "build s": secs,
        "MiB on disk": size / 2**20,
        "bytes/token": size / header["tokens"],
    }
