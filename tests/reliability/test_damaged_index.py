"""A damaged index never gives silent garbage: every index file truncated, or changed in place at the
same size, is caught on load (cheap structural checks) or by ``--verify`` (SHA-256), and the CLI
says which file; the damaged files themselves are left as they were (nothing rewritten)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _harness import cli, judge, snapshot
from _manifest import past_the_sample

SEARCH = ["search", "cancer", "--index", "a", "--mode", "bm25", "-k", "3"]
FILES = [
    "manifest.json",
    "docs.jsonl",
    "bm25/data.npy",
    "bm25/indices.npy",
    "bm25/indptr.npy",
    "bm25/vocab.json",
    "bm25/params.json",
    "dense/index.faiss",
]


def _npy_offset(p: Path) -> int:
    with open(p, "rb") as f:
        fmt = np.lib.format
        version = fmt.read_magic(f)
        (fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0)(f)
        return f.tell()


def _set_byte(rel: str, where, value: int):
    def mutate(ix: Path) -> None:
        p = ix / rel
        raw = bytearray(p.read_bytes())
        off = where(p, raw)
        raw[off] = value if value >= 0 else raw[off] ^ (-value)
        p.write_bytes(bytes(raw))

    return mutate


def _replace(rel: str, old: bytes, new: bytes):
    assert len(old) == len(new)

    def mutate(ix: Path) -> None:
        p = ix / rel
        raw = p.read_bytes()
        assert old in raw, (rel, old)
        p.write_bytes(raw.replace(old, new, 1))

    return mutate


def _vocab_unsorted(ix: Path) -> None:
    p = ix / "bm25" / "vocab.json"
    terms = json.loads(p.read_text())
    i = next(i for i, t in enumerate(terms) if t.isascii() and t.isalpha() and len(t) > 3)
    raw = p.read_text()
    pos = raw.index(json.dumps(terms[i]))
    p.write_text(raw[: pos + 1] + "~" + raw[pos + 2 :])  # same size, now sorts after every later term


def _weight(i: int):  # the byte holding sign + high exponent bits of float32 weight #i
    return lambda p, raw: _npy_offset(p) + 4 * i + 3


def _mid(p: Path, raw: bytearray) -> int:
    return len(raw) // 2


FLIPS = [
    (
        "bm25/data.npy",
        "exponent byte of a weight overwritten (0x7F: weight ~1e38)",
        _set_byte("bm25/data.npy", _weight(5), 0x7F),
        "weights not finite or beyond the BM25 bound",
    ),
    (
        "bm25/data.npy",
        "a weight's sign and exponent set to NaN (0xFF)",
        _set_byte("bm25/data.npy", _weight(9), 0xFF),
        "weights not finite or beyond the BM25 bound",
    ),
    (
        "bm25/indices.npy",
        "high byte of a document position flipped",
        _set_byte("bm25/indices.npy", _weight(7), 0x7F),
        "document positions outside [0, 55)",
    ),
    (
        "bm25/indptr.npy",
        "a byte in the middle of the column pointers flipped",
        _set_byte("bm25/indptr.npy", lambda p, raw: _npy_offset(p) + 8 * 40 + 2, 0x7F),
        "indptr is not monotone",
    ),
    (
        "bm25/indptr.npy",
        "the .npy header's dtype changed ('<i8' -> '<f8')",
        _replace("bm25/indptr.npy", b"<i8", b"<f8"),
        "array types or shapes",
    ),
    (
        "bm25/vocab.json",
        "a term's first letter changed (same size)",
        _vocab_unsorted,
        "vocabulary not sorted and unique",
    ),
    (
        "bm25/vocab.json",
        "a quote removed (invalid JSON, same size)",
        _replace("bm25/vocab.json", b'", "', b'"  "'),
        "cannot be read",
    ),
    (
        "bm25/params.json",
        "k1 0.9 -> 0.8 (same size)",
        _replace("bm25/params.json", b'"k1": 0.9', b'"k1": 0.8'),
        "the BM25 settings in bm25/params.json disagree with the manifest",
    ),
    (
        "docs.jsonl",
        "a letter of a text changed (same size)",
        _replace("docs.jsonl", b"Nuclear receptors", b"Nuclear receptorz"),
        "docs.jsonl does not match the corpus checksum",
    ),
    (
        "docs.jsonl",
        "a quote replaced (invalid JSON, same size)",
        _replace("docs.jsonl", b'{"id"', b'{ id"'),
        "docs.jsonl:1: not a document record",
    ),
    (
        "dense/index.faiss",
        "the vector count (ntotal) in the header changed",
        _set_byte("dense/index.faiss", lambda p, r: 8, -1),
        "index.faiss",
    ),
    (
        "dense/index.faiss",
        "the dimension in the header changed",
        _set_byte("dense/index.faiss", lambda p, r: 4, -2),
        "index.faiss",
    ),
    (
        "manifest.json",
        "format_version 1 -> 7 (same size)",
        _replace("manifest.json", b'"format_version": 1', b'"format_version": 7'),
        "has index format version 7, this attnrank reads version 1",
    ),
    (
        "manifest.json",
        "a recorded file size changed (same size)",
        _replace("manifest.json", b'"bytes": ', b'"bytes":1'),
        "is missing or has the wrong size",
    ),
    (
        "manifest.json",
        "a brace replaced (invalid JSON)",
        _replace("manifest.json", b"{", b"["),
        "manifest.json is corrupted",
    ),
]


def _case(case_id: str, given: str, work: Path, args: list[str], exit: int, err, check=None):
    before = snapshot(work)
    run = cli(*args, cwd=work)
    out = judge(
        case_id,
        "damaged index",
        given,
        run,
        exit=exit,
        err=err,
        before=before,
        after=snapshot(work),
        kept="the index files exactly as they were (nothing rewritten)",
        check=check,
    )
    assert out.passed, out.problems
    return run


@pytest.mark.parametrize("rel", FILES)
def test_truncated_file(rel: str, work: Path, index_a: Path) -> None:
    p = index_a / rel
    p.write_bytes(p.read_bytes()[: max(1, p.stat().st_size - 24)])
    err = "manifest.json is corrupted" if rel == "manifest.json" else f"{rel} is missing or has the wrong size"
    # (a damaged manifest no longer marks the folder as an index: the advised rebuild must be forced)
    advice = "--force" if rel == "manifest.json" else "rebuild"
    _case(f"truncated-{rel}", f"{rel} truncated by 24 bytes", work, SEARCH, 1, [err, "rebuild", advice])


@pytest.mark.parametrize("rel,given,mutate,err", FLIPS, ids=[f"{f[0]}-{i}" for i, f in enumerate(FLIPS)])
def test_same_size_damage(rel, given, mutate, err, work: Path, index_a: Path) -> None:
    mutate(index_a)
    if rel != "manifest.json":
        past_the_sample(index_a, rel)
    _case(f"flip-{rel}-{FLIPS.index((rel, given, mutate, err))}", f"{rel}: {given}", work, SEARCH, 1, [err])


SAMPLED = [f for f in FLIPS if f[0] != "manifest.json"]  # (the manifest holds the digests)


@pytest.mark.parametrize("rel,given,mutate,err", SAMPLED, ids=[f"{f[0]}-{i}" for i, f in enumerate(SAMPLED)])
def test_same_size_damage_at_a_files_ends_is_caught_by_its_sample(rel, given, mutate, err, work, index_a) -> None:
    """Every load reads each file's ends against the manifest's sample digest: what the structural
    checks cannot tell (a FAISS index swapped in from another build of as many vectors, which
    searched with exit 0 unless --verify) is caught there."""
    mutate(index_a)
    said = f"{rel} is not the file this index was built with (its first and last 64 KiB differ"
    _case(f"sample-{rel}-{SAMPLED.index((rel, given, mutate, err))}", f"{rel}: {given}", work, SEARCH, 1, [said])


@pytest.mark.parametrize("rel", ["bm25/data.npy", "dense/index.faiss", "bm25/indices.npy"])
def test_low_bit_flip_needs_verify(rel: str, work: Path, index_a: Path) -> None:
    """A lowest-mantissa-bit flip is structurally plausible: --verify (SHA-256) catches it."""
    p = index_a / rel
    raw = bytearray(p.read_bytes())
    raw[-12] ^= 1
    p.write_bytes(bytes(raw))
    _case(
        f"verify-{rel}",
        f"{rel}: lowest bit of a value flipped, searched with --verify",
        work,
        [*SEARCH, "--verify"],
        1,
        [f"{rel} fails its SHA-256 check"],
    )


def test_verify_intact_index(work: Path, index_a: Path) -> None:
    def check(r):
        ranks = [ln.split(".")[0].strip() for ln in r.stdout.splitlines() if not ln.startswith("     ")]
        return None if ranks == ["1", "2", "3"] else f"bad output {r.stdout[:200]!r}"

    _case("verify-intact", "an intact index searched with --verify", work, [*SEARCH, "--verify"], 0, [], check)


def test_damaged_vectors_never_printed(work: Path, index_a: Path) -> None:
    """Defect 2: flipped bytes in the dense vectors gave cosine scores near -3e26, printed with exit 0."""
    p = index_a / "dense" / "index.faiss"
    raw = bytearray(p.read_bytes())
    for i in range(1, 40):  # the high byte of 39 vector components spread over the vectors
        raw[len(raw) - 4 * 384 * i + 3 - 4 * i] = 0x7F
    p.write_bytes(bytes(raw))
    past_the_sample(index_a, "dense/index.faiss")  # (past the sampled ends of a large index: its search's checks)
    _case(
        "flip-dense-vectors",
        "dense/index.faiss: exponent bytes of vector components overwritten; hybrid search",
        work,
        ["search", "cancer", "--index", "a", "-k", "3", "-q"],
        1,
        ["cosine scores outside [-1, 1]"],
    )
