"""On-disk layout of a sharded index: shard folders plus a top-level manifest that ties them.

``<index>/``::

    manifest.json      format ``attnrank-sharded-index``: the shards (folder, first global id,
                       document count, SHA-256 of the shard's own manifest), the global BM25
                       statistics' totals, the settings (BM25, tokenizer, dense, fusion)
    stats/             global document frequencies (``terms.json`` + ``df.npy``) and totals
                       (listed, with sizes and SHA-256, under the manifest's ``files``)
    shard-00000/ …     each an ordinary index folder (:mod:`attnrank.index.store`): manifest.json,
                       docs.jsonl, bm25/ (weights with the global idf and average length; the
                       vocabulary of the shard's own terms), dense/index.faiss (vectors under
                       their global integer ids)

Global ids are positions in the corpus; shard ``i`` holds the contiguous range
``[start_i, start_i + num_docs_i)``, so ordering by (score, global id) is the same inside a shard
and across shards, which keeps the merge of per-shard top-k lists exact. Every folder is written
with :func:`attnrank.index.store.atomic_dir`; the top-level manifest is written last.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...errors import IndexFormatError
from ...files import INDEX_FORMAT, SHARDED_FORMAT, file_sha256
from ..settings import INDEX_FILES as SHARD_FILES
from ..settings import manifest_settings
from ..store import MANIFEST, check_files, file_entries, read_manifest

SHARDED_VERSION = 1


def shard_name(i: int) -> str:
    return f"shard-{i:05d}"


def shard_bounds(num_docs: int, shards: int) -> list[tuple[int, int]]:
    """Contiguous ``(start, stop)`` ranges of near-equal size (the first ones one larger)."""
    base, extra = divmod(num_docs, shards)
    out, start = [], 0
    for i in range(shards):
        stop = start + base + (1 if i < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def write_top_manifest(root: Path, info: dict[str, Any], shards: list[dict[str, Any]]) -> None:
    """Write the top-level manifest (last, after every shard folder is complete)."""
    for s in shards:
        s["manifest_sha256"] = file_sha256(root / s["name"] / MANIFEST)
    files = file_entries(root, skip=[s["name"] for s in shards])
    manifest = {"format": SHARDED_FORMAT, "format_version": SHARDED_VERSION, **info, "files": files, "shards": shards}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")


# A folder whose manifest is damaged (the sharded index's or a shard's) is no longer known for an index,
# so a rebuild there must be forced.
_REBUILD_DAMAGED = (
    "rebuild the sharded index with `attnrank index CORPUS --index-dir FOLDER --shards N --force` (force=True in "
    "Python): its damaged manifest no longer marks the folder as an attnrank index, which a rebuild replaces only "
    "when forced"
)


def is_sharded(root: Path) -> bool:
    """Whether ``root`` holds a sharded index (its manifest says so)."""
    try:
        return json.loads((Path(root) / MANIFEST).read_text(encoding="utf-8")).get("format") == SHARDED_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def read_top_manifest(root: Path, *, verify: bool = False) -> dict[str, Any]:
    """The top-level manifest, after every check of :func:`read_sharded`."""
    return read_sharded(root, verify=verify)[0]


def read_sharded(root: Path, *, verify: bool = False) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The top-level manifest and each shard's own manifest, checked: every shard present,
    unchanged since the build (its manifest's SHA-256), holding the id range the top-level
    manifest gives it, and the ranges contiguous from 0.

    Each shard's own manifest is checked by :func:`attnrank.index.store.read_manifest` (sizes
    always, SHA-256 with ``verify=True``), and so are the top-level ``files`` (the statistics).
    """
    root = Path(root)
    m = _top_manifest(root)
    entries = _shard_entries(root, m)
    if not isinstance(m.get("files"), dict):  # (without it the statistics were never checked)
        raise IndexFormatError(
            f"{root / MANIFEST} lacks its list of files (a sharded index built before 2026-12-01 has none); "
            "rebuild the sharded index"
        )
    check_files(root, m["files"], root / MANIFEST, verify=verify, rebuild=_REBUILD_DAMAGED)
    shard_manifests, expected = [], 0
    for i, s in enumerate(entries):
        folder = root / s["name"]
        sm = read_manifest(folder, verify=verify, required=SHARD_FILES, rebuild=_REBUILD_DAMAGED)
        if file_sha256(folder / MANIFEST) != s["manifest_sha256"]:
            raise IndexFormatError(f"shard {folder} was replaced after the sharded index was built; rebuild it")
        if s["start"] != expected:
            raise IndexFormatError(f"shard {folder} starts at global id {s['start']}, expected {expected}; rebuild")
        own = {"index": i, "start": s["start"], "num_docs": s["num_docs"]}
        if sm.get("shard") != own or sm.get("num_docs") != s["num_docs"]:
            raise IndexFormatError(
                f"{root / MANIFEST} gives shard {folder} the ids {s['start']}..{s['start'] + s['num_docs'] - 1} "
                f"(shard #{i}), its own manifest says {sm.get('shard')}; the index is corrupted, rebuild it"
            )
        shard_manifests.append(sm)
        expected += s["num_docs"]
    if expected != m["num_docs"]:
        raise IndexFormatError(f"{root}: the shards hold {expected} documents, the manifest says {m['num_docs']}")
    return m, shard_manifests


def _top_manifest(root: Path) -> dict[str, Any]:
    """The parsed top-level manifest, of the sharded format and version this attnrank reads."""
    path = root / MANIFEST
    if root.is_file():  # ("run.trec/manifest.json cannot be read (Not a directory); rebuild" misled)
        raise IndexFormatError(f"{root} is a file, not a sharded index folder; give the folder of the sharded index")
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise IndexFormatError(f"{root} has no {MANIFEST}: not an index or an incomplete build; rebuild it") from None
    except (OSError, ValueError) as e:
        raise IndexFormatError(f"{path} cannot be read ({e}); {_REBUILD_DAMAGED}") from None
    if isinstance(m, dict) and m.get("format") == INDEX_FORMAT:  # (merge-shards named no fix)
        raise IndexFormatError(
            f"{root} is an ordinary (single) attnrank index, not a sharded one: it needs no merging; "
            "load or search it as it is"
        )
    if not isinstance(m, dict) or m.get("format") != SHARDED_FORMAT:
        raise IndexFormatError(f"{path} is not a sharded attnrank index manifest; {_REBUILD_DAMAGED}")
    if m.get("format_version") != SHARDED_VERSION:
        raise IndexFormatError(
            f"{root} has sharded format version {m.get('format_version')}, this attnrank reads "
            f"version {SHARDED_VERSION}; rebuild it with `attnrank index --shards N`"
        )
    return m


def _shard_entries(root: Path, m: dict[str, Any]) -> list[dict[str, Any]]:
    """``m["shards"]``, each entry with a plain folder name, integer ids and a checksum."""
    shards = m.get("shards")

    def ok(s: object) -> bool:
        return (
            isinstance(s, dict)
            and isinstance(s.get("name"), str)
            and s["name"] == Path(s["name"]).name
            and s["name"] not in ("", ".", "..")
            and all(isinstance(s.get(k), int) and s[k] >= 0 for k in ("start", "num_docs"))
            and isinstance(s.get("manifest_sha256"), str)
        )

    if not isinstance(shards, list) or not shards or not all(map(ok, shards)) or not isinstance(m.get("num_docs"), int):
        raise IndexFormatError(
            f"{root / MANIFEST} lacks or mangles its list of shards or document count; rebuild the sharded index"
        )
    return shards


def retriever_settings(m: dict[str, Any]) -> dict[str, Any]:
    """:class:`~attnrank.index.retriever.HybridRetriever` constructor arguments recorded in a
    top-level manifest ``m`` (embedder, dense index kind, BM25 parameters, fusion settings)."""
    try:
        return manifest_settings(m)
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise IndexFormatError(
            f"the sharded index manifest lacks or mangles a setting ({type(e).__name__}: {e}); rebuild the index"
        ) from None
