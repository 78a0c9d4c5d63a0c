"""The embedded demo corpus (80 HotpotQA/Wikipedia paragraphs, CC BY-SA 4.0; see data/README.md)."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path


def demo_dir() -> Path:
    return Path(str(files("attnrank") / "data"))


def demo_corpus_path() -> Path:
    return demo_dir() / "demo_corpus.jsonl"


def demo_queries() -> list[dict]:
    """The 8 demo questions: ``_id``, ``text``, ``answers``, ``supporting`` (gold doc ids)."""
    with open(demo_dir() / "demo_queries.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]
