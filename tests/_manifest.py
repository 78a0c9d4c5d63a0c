"""Test helper: damage an index file where the load's sample digest cannot see it."""

from __future__ import annotations

import json
from pathlib import Path

from attnrank.files import file_sample_sha256


def past_the_sample(index: Path, rel: str) -> None:
    """Make the manifest of the index folder ``index`` record the sample digest of ``rel`` as it is
    now: damage in the middle of a large file, past the first and last 64 KiB every load reads
    (test indexes' files are shorter than both), which the structural checks must still catch."""
    manifest = Path(index) / "manifest.json"
    m = json.loads(manifest.read_text())
    m["files"][rel]["sample_sha256"] = file_sample_sha256(Path(index) / rel)
    manifest.write_text(json.dumps(m, indent=1))


def past_the_sample_of_shard(root: Path, shard: str, rel: str) -> None:
    """:func:`past_the_sample` of ``rel`` in the shard folder ``shard`` of the sharded index
    ``root``, whose top manifest then records the shard's rewritten manifest (as if built so)."""
    from attnrank.files import file_sha256

    past_the_sample(Path(root) / shard, rel)
    top = Path(root) / "manifest.json"
    m = json.loads(top.read_text())
    entry = next(s for s in m["shards"] if s["name"] == shard)
    entry["manifest_sha256"] = file_sha256(Path(root) / shard / "manifest.json")
    top.write_text(json.dumps(m, indent=1))
