"""Bad input to the real CLI: every case gets its exact exit code and message, and nothing stored changes.

Table-driven: a case is (id, what is given, setup, arguments, exit code, stderr fragments). The
setup writes the case's files into the working directory ``w`` (which holds a copy of index A at
``indexes/a``, and for a case with ``rrf_index`` a copy of A built with RRF fusion at
``indexes/a-rrf``) and the whole working directory must be unchanged afterwards. Options with a
model use ``/nonexistent/model``: a case that reports its input error proves the input was
checked before any model was loaded.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from _harness import cli, judge, snapshot

NOMODEL = "/nonexistent/model"


def _none(w: Path) -> None:
    pass


def _write(rel: str, data: str | bytes) -> Callable[[Path], None]:
    def setup(w: Path) -> None:
        p = w / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))

    return setup


def _all(*setups: Callable[[Path], None]) -> Callable[[Path], None]:
    def setup(w: Path) -> None:
        for s in setups:
            s(w)

    return setup


def _thesis(rel: str) -> Callable[[Path], None]:
    """A user's folder: a file and a sub-folder with a file."""
    return _all(_write(f"{rel}/thesis.txt", "Chapter 1. My thesis.\n"), _write(f"{rel}/figures/f1.csv", "x,y\n1,2\n"))


def _symlink(rel: str, to: str) -> Callable[[Path], None]:
    def setup(w: Path) -> None:
        (w / rel).parent.mkdir(parents=True, exist_ok=True)
        (w / rel).symlink_to(to)

    return setup


CORPUS = '{"id": "d1", "text": "alpha beta"}\n{"id": "d2", "text": "gamma delta"}\n'
QUERIES = '{"_id": "q1", "text": "alpha"}\n{"_id": "q2", "text": "gamma"}\n'
RUN = "q1 Q0 d1 1 2.0 t\nq1 Q0 d2 2 1.0 t\nq2 Q0 d2 1 2.0 t\n"
ATTNRANK_RUN = RUN.replace(" t\n", " attnrank-bm25\n")  # a run attnrank wrote: -o may replace it


@dataclass
class Case:
    id: str
    group: str
    given: str
    args: list[str]
    exit: int
    err: list[str]
    setup: Callable[[Path], None] = _none
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = "."
    rrf_index: bool = False  # also copy index A built with fusion="rrf" to indexes/a-rrf


CASES = [
    # -- where an index is written (defect 1: data loss) -------------------------------------
    Case(
        "index-dir-user-folder",
        "index target",
        "`index --index-dir DIR`, DIR holds thesis.txt and a sub-folder",
        ["index", "c.jsonl", "--index-dir", "mine", "-q"],
        1,
        ["mine exists and is not an attnrank index", "--force"],
        _all(_write("c.jsonl", CORPUS), _thesis("mine")),
    ),
    Case(
        "index-holds-user-file",
        "index target",
        "`index --index a`, indexes/a is an index the user saved a run file into",
        ["index", "c.jsonl", "--index", "a", "-q"],
        1,
        ["indexes/a is an attnrank index but holds files its manifest does not list (run.trec)", "--force"],
        _all(_write("c.jsonl", CORPUS), _write("indexes/a/run.trec", "q1 Q0 d1 1 2.0 mine\n")),
    ),
    Case(
        "name-user-folder",
        "index target",
        "`index --index X`, indexes/X is a user folder",
        ["index", "c.jsonl", "--index", "x", "-q"],
        1,
        ["indexes/x exists and is not an attnrank index"],
        _all(_write("c.jsonl", CORPUS), _thesis("indexes/x")),
    ),
    Case(
        "demo-over-user-index",
        "index target",
        "`demo`, indexes/demo is the user's own index (another corpus) saved under that name",
        ["demo", "--no-rerank", "-q"],
        2,
        ["indexes/demo holds an index of another corpus", "ATTNRANK_INDEX_DIR"],
        lambda w: (w / "indexes" / "a").rename(w / "indexes" / "demo"),
    ),
    Case(
        "index-dir-is-corpus",
        "index target",
        "`index DOCS --index-dir DOCS` (a folder of .txt)",
        ["index", "docs", "--index-dir", "docs", "-q"],
        1,
        ["it is or contains the corpus"],
        _all(_write("docs/a.txt", "alpha"), _write("docs/b.txt", "beta")),
    ),
    Case(
        "index-dir-is-corpus-force",
        "index target",
        "same with --force",
        ["index", "docs", "--index-dir", "docs", "--force", "-q"],
        1,
        ["it is or contains the corpus", "does not override"],
        _all(_write("docs/a.txt", "alpha"), _write("docs/b.txt", "beta")),
    ),
    Case(
        "index-dir-holds-corpus",
        "index target",
        "`--index-dir DIR` where DIR holds the corpus file",
        ["index", "data/c.jsonl", "--index-dir", "data", "--force", "-q"],
        1,
        ["it is or contains the corpus"],
        _write("data/c.jsonl", CORPUS),
    ),
    Case(
        "index-dir-cwd",
        "index target",
        "`--index-dir .` (the working directory)",
        ["index", "c.jsonl", "--index-dir", ".", "-q"],
        1,
        ["it is or contains the working directory"],
        _all(_write("c.jsonl", CORPUS), _write("notes.md", "# mine")),
    ),
    Case(
        "index-dir-cwd-force",
        "index target",
        "`--index-dir . --force`",
        ["index", "c.jsonl", "--index-dir", ".", "--force", "-q"],
        1,
        ["the working directory", "does not override"],
        _write("c.jsonl", CORPUS),
    ),
    Case(
        "index-dir-parent-of-cwd",
        "index target",
        "`--index-dir ..` (holds the working directory)",
        ["index", "../c.jsonl", "--index-dir", "..", "--force", "-q"],
        1,
        ["it is or contains the working directory"],
        _all(_write("c.jsonl", CORPUS), _write("sub/keep.txt", "x")),
        cwd="sub",
    ),
    Case(
        "index-dir-file",
        "index target",
        "`--index-dir FILE` (a regular file)",
        ["index", "c.jsonl", "--index-dir", "report.pdf", "--force", "-q"],
        1,
        ["report.pdf is a file, not an index folder"],
        _all(_write("c.jsonl", CORPUS), _write("report.pdf", b"%PDF-1.4 \x00\x01")),
    ),
    Case(
        "index-dir-symlink",
        "index target",
        "`--index-dir LINK` (a symbolic link to a user folder)",
        ["index", "c.jsonl", "--index-dir", "link", "-q"],
        1,
        ["link is a symbolic link"],
        _all(_write("c.jsonl", CORPUS), _thesis("real"), _symlink("link", "real")),
    ),
    Case(
        "index-dir-bad-manifest",
        "index target",
        "`--index-dir DIR`, DIR/manifest.json is not JSON",
        ["index", "c.jsonl", "--index-dir", "old", "-q"],
        1,
        ["old exists and is not an attnrank index"],
        _all(_write("c.jsonl", CORPUS), _write("old/manifest.json", "{not json"), _write("old/docs.jsonl", "x")),
    ),
    Case(
        "name-with-slash",
        "index target",
        "`--index a/b`",
        ["index", "c.jsonl", "--index", "a/b", "-q"],
        2,
        ["index name 'a/b' must be a plain name"],
        _write("c.jsonl", CORPUS),
    ),
    Case(
        "name-dotdot",
        "index target",
        "`--index ..`",
        ["index", "c.jsonl", "--index", "..", "-q"],
        2,
        ["index name '..' must be a plain name"],
        _write("c.jsonl", CORPUS),
    ),
    Case(
        "name-blank",
        "index target",
        "`--index ' '` (or a name holding a line break)",
        ["index", "c.jsonl", "--index", " ", "-q"],
        2,
        ["index name ' ' is blank, has whitespace around it or holds a character that does not print"],
        _write("c.jsonl", CORPUS),
    ),
    # -- corpus input -------------------------------------------------------------------------
    Case(
        "corpus-invalid-json",
        "corpus",
        "a .jsonl line that is not JSON",
        ["index", "c.jsonl", "--index", "n", "-q"],
        1,
        ["c.jsonl:2: invalid JSON"],
        _write("c.jsonl", '{"id": "a", "text": "x"}\n{"id": "b", "text": \n'),
    ),
    Case(
        "corpus-duplicate-id",
        "corpus",
        "two documents with the same id",
        ["index", "c.jsonl", "--index", "n", "-q"],
        1,
        ["c.jsonl:2: duplicate document id 'a'"],
        _write("c.jsonl", '{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n'),
    ),
    Case(
        "corpus-not-utf8",
        "corpus",
        "a .jsonl with Latin-1 bytes",
        ["index", "c.jsonl", "--index", "n", "-q"],
        1,
        ["c.jsonl:2: bytes that are not valid UTF-8"],
        _write("c.jsonl", b'{"id": "a", "text": "x"}\n{"id": "b", "text": "caf\xe9"}\n'),
    ),
    Case(
        "corpus-empty",
        "corpus",
        "an empty .jsonl",
        ["index", "c.jsonl", "--index", "n", "-q"],
        1,
        ["c.jsonl: no documents found (0 valid records)"],
        _write("c.jsonl", ""),
    ),
    Case(
        "corpus-missing",
        "corpus",
        "a corpus path that does not exist",
        ["index", "nope.jsonl", "--index", "n", "-q"],
        1,
        ["corpus path 'nope.jsonl' does not exist"],
    ),
    Case(
        "corpus-unknown-format",
        "corpus",
        "a .pdf corpus",
        ["index", "c.pdf", "--index", "n", "-q"],
        1,
        ["unknown corpus format '.pdf'"],
        _write("c.pdf", "x"),
    ),
    Case(
        "corpus-only-symlink-loop",
        "corpus",
        "a folder holding only a symbolic link loop",
        ["index", "docs", "--index", "n", "-q"],
        1,
        ["no documents found"],
        _symlink("docs/loop", "."),
    ),
    Case(
        "corpus-text-field-missing",
        "corpus",
        "a record without 'text'",
        ["index", "c.jsonl", "--index", "n", "-q"],
        1,
        [
            "c.jsonl:1: missing an id ('id', '_id', 'doc_id' or 'docid') or a text ('text', 'contents', 'body' or 'passage')"
        ],
        _write("c.jsonl", '{"id": "a", "summary": "x"}\n'),
    ),
    # -- search options (defects 3, 4) ---------------------------------------------------------
    Case(
        "search-k-neg-rerank",
        "search",
        "`search -k -1 --rerank 3`",
        ["search", "x", "--index", "a", "-k", "-1", "--rerank", "3", "--model", NOMODEL],
        2,
        ["-k -1 must be at least 1"],
    ),
    Case(
        "search-k-neg3",
        "search",
        "`search -k -3`",
        ["search", "x", "--index", "a", "-k", "-3"],
        2,
        ["-k -3 must be at least 1"],
    ),
    Case(
        "search-k-zero",
        "search",
        "`search -k 0`",
        ["search", "x", "--index", "a", "-k", "0"],
        2,
        ["-k 0 must be at least 1"],
    ),
    Case(
        "search-rerank-neg",
        "search",
        "`search --rerank -2`",
        ["search", "x", "--index", "a", "--rerank", "-2"],
        2,
        ["--rerank -2 must be at least 0"],
    ),
    Case(
        "search-alpha-rrf-index",
        "search",
        '`--alpha 0.3` on an index built with `fusion="rrf"`',
        ["search", "x", "--index", "a-rrf", "--alpha", "0.3"],
        2,
        ["--alpha 0.3 applies to convex fusion only", "this search fuses with rrf", "--fusion convex"],
        rrf_index=True,
    ),
    Case(
        "search-alpha-fusion-rrf",
        "search",
        "`--fusion rrf --alpha 0.3`",
        ["search", "x", "--index", "a", "--fusion", "rrf", "--alpha", "0.3"],
        2,
        ["--alpha 0.3 applies to convex fusion only"],
    ),
    Case(
        "search-norm-rrf",
        "search",
        '`--norm zscore` on an index built with `fusion="rrf"`',
        ["search", "x", "--index", "a-rrf", "--norm", "zscore"],
        2,
        ["--norm zscore applies to convex fusion only"],
        rrf_index=True,
    ),
    Case(
        "index-alpha-fusion-rrf",
        "index target",
        "`index --fusion rrf --alpha 0.3`",
        ["index", "c.jsonl", "--index", "n", "--fusion", "rrf", "--alpha", "0.3", "-q"],
        2,
        ["--alpha 0.3 applies to convex fusion only, and this index fuses with rrf"],
        _write("c.jsonl", CORPUS),
    ),
    Case(
        "index-fusion-unknown",
        "index target",
        "`index --fusion max`",
        ["index", "c.jsonl", "--index", "n", "--fusion", "max", "-q"],
        2,
        ["--fusion 'max' is not one of rrf, convex"],
        _write("c.jsonl", CORPUS),
    ),
    Case(
        "search-alpha-range",
        "search",
        "`--fusion convex --alpha 1.5`",
        ["search", "x", "--index", "a", "--fusion", "convex", "--alpha", "1.5"],
        2,
        ["alpha=1.5 is outside [0, 1]"],
    ),
    Case(
        "search-alpha-bm25",
        "search",
        "`--mode bm25 --fusion convex --alpha 0.5`",
        ["search", "x", "--index", "a", "--mode", "bm25", "--fusion", "convex", "--alpha", "0.5"],
        2,
        ["apply to hybrid search only, not --mode bm25"],
    ),
    Case(
        "search-mode-bad",
        "search",
        "`--mode sparse`",
        ["search", "x", "--index", "a", "--mode", "sparse"],
        2,
        ["--mode 'sparse' is not one of bm25, dense, hybrid"],
    ),
    Case(
        "search-fusion-bad",
        "search",
        "`--fusion max`",
        ["search", "x", "--index", "a", "--fusion", "max"],
        2,
        ["--fusion 'max' is not one of rrf, convex"],
    ),
    Case(
        "search-query-and-file",
        "search",
        "a QUERY and --queries together",
        ["search", "x", "--index", "a", "--queries", "q.jsonl"],
        2,
        ["give either one QUERY or --queries FILE"],
        _write("q.jsonl", QUERIES),
    ),
    Case(
        "search-empty-query",
        "search",
        "an empty query `'   '`",
        ["search", "   ", "--index", "a", "--mode", "bm25"],
        2,
        ["query #0 is empty"],
    ),
    Case(
        "search-out-under-file",
        "search",
        "`-o FILE/run.trec` where FILE is a file",
        ["search", "--index", "a", "--queries", "q.jsonl", "-o", "notes.txt/run.trec"],
        2,
        ["notes.txt is a file, not a folder"],
        _all(_write("q.jsonl", QUERIES), _write("notes.txt", "keep me")),
    ),
    Case(
        "search-out-deep-under-file",
        "search",
        "`-o FILE/sub/run.trec` (NotADirectoryError)",
        ["search", "--index", "a", "--queries", "q.jsonl", "-o", "notes.txt/sub/run.trec"],
        2,
        ["notes.txt is a file, not a folder"],
        _all(_write("q.jsonl", QUERIES), _write("notes.txt", "keep me")),
    ),
    Case(
        "search-out-is-dir",
        "search",
        "`-o DIR` (an existing folder)",
        ["search", "--index", "a", "--queries", "q.jsonl", "-o", "runs"],
        2,
        ["--output runs is a folder"],
        _all(_write("q.jsonl", QUERIES), _write("runs/old.trec", RUN)),
    ),
    Case(
        "search-out-enospc",
        "search",
        "disk full while writing the run file (over an existing run)",
        ["search", "--index", "a", "--queries", "q.jsonl", "--mode", "bm25", "-o", "run.trec", "-q"],
        1,
        ["No space left on device: run.trec", "free some disk space"],
        _all(_write("q.jsonl", QUERIES), _write("run.trec", ATTNRANK_RUN)),
        {"ATTNRANK_FAULT": "run-write:enospc"},
    ),
    Case(
        "search-out-foreign-run",
        "search",
        "`-o run.trec` where run.trec is a run another tool wrote",
        ["search", "--index", "a", "--queries", "q.jsonl", "--mode", "bm25", "-o", "run.trec", "-q"],
        2,
        ["run.trec exists and is not a TREC run attnrank wrote"],
        _all(_write("q.jsonl", QUERIES), _write("run.trec", RUN)),
    ),
    Case(
        "search-queries-not-utf8",
        "search",
        "a queries file with Latin-1 bytes",
        ["search", "--index", "a", "--queries", "q.tsv"],
        1,
        ["q.tsv:2: bytes that are not valid UTF-8"],
        _write("q.tsv", b"q1\talpha\nq2\tcaf\xe9\n"),
    ),
    Case(
        "search-queries-dup",
        "search",
        "a queries file with a repeated id",
        ["search", "--index", "a", "--queries", "q.tsv"],
        1,
        ["q.tsv:2: duplicate query id 'q1'"],
        _write("q.tsv", "q1\talpha\nq1\tbeta\n"),
    ),
    Case(
        "search-queries-missing",
        "search",
        "`--queries` path that does not exist",
        ["search", "--index", "a", "--queries", "nope.jsonl"],
        1,
        ["queries file 'nope.jsonl' does not exist"],
    ),
    Case(
        "search-no-index",
        "search",
        "`--index` of an index that does not exist",
        ["search", "x", "--index", "nope"],
        1,
        ["no index at indexes/nope", "attnrank index CORPUS --index NAME"],
    ),
    Case(
        "search-index-dir-user-folder",
        "search",
        "`--index-dir` of a folder that is not an index",
        ["search", "x", "--index-dir", "mine"],
        1,
        ["mine has no manifest.json"],
        _thesis("mine"),
    ),
    Case(
        "search-manifest-loop",
        "search",
        "an index whose manifest.json is a symbolic link loop",
        ["search", "x", "--index-dir", "loopy"],
        1,
        ["Too many levels of symbolic links", "symbolic link loop"],
        _symlink("loopy/manifest.json", "manifest.json"),
    ),
    Case(
        "search-no-args",
        "search",
        "`search` with neither QUERY nor --queries",
        ["search", "--index", "a"],
        2,
        ["give either one QUERY or --queries FILE"],
    ),
    # -- rerank (defect 7: validate before the model loads) -----------------------------------
    Case(
        "rerank-late-query-id",
        "rerank",
        "a run whose LAST query is not in the queries file",
        [
            "rerank",
            "--run",
            "r.trec",
            "--queries",
            "q.jsonl",
            "--corpus",
            "c.jsonl",
            "-o",
            "o.trec",
            "--model",
            NOMODEL,
        ],
        1,
        ["query 'q9' of the run is not in q.jsonl"],
        _all(_write("c.jsonl", CORPUS), _write("q.jsonl", QUERIES), _write("r.trec", RUN + "q9 Q0 d1 1 1.0 t\n")),
    ),
    Case(
        "rerank-late-doc-id",
        "rerank",
        "a run whose last query lists a document not in the corpus",
        [
            "rerank",
            "--run",
            "r.trec",
            "--queries",
            "q.jsonl",
            "--corpus",
            "c.jsonl",
            "-o",
            "o.trec",
            "--model",
            NOMODEL,
        ],
        1,
        ["document 'd7' (query 'q2') of the run is not in the corpus/index"],
        _all(_write("c.jsonl", CORPUS), _write("q.jsonl", QUERIES), _write("r.trec", RUN + "q2 Q0 d7 2 1.0 t\n")),
    ),
    Case(
        "rerank-run-not-utf8",
        "rerank",
        "a run file with Latin-1 bytes",
        [
            "rerank",
            "--run",
            "r.trec",
            "--queries",
            "q.jsonl",
            "--corpus",
            "c.jsonl",
            "-o",
            "o.trec",
            "--model",
            NOMODEL,
        ],
        1,
        ["r.trec:2: bytes that are not valid UTF-8"],
        _all(
            _write("c.jsonl", CORPUS),
            _write("q.jsonl", QUERIES),
            _write("r.trec", b"q1 Q0 d1 1 2.0 t\nq1 Q0 d\xe9 2 1.0 t\n"),
        ),
    ),
    Case(
        "rerank-depth-zero",
        "rerank",
        "`rerank --depth 0`",
        ["rerank", "--run", "r.trec", "--queries", "q.jsonl", "--corpus", "c.jsonl", "-o", "o.trec", "--depth", "0"],
        2,
        ["--depth 0 must be at least 1"],
        _all(_write("c.jsonl", CORPUS), _write("q.jsonl", QUERIES), _write("r.trec", RUN)),
    ),
    Case(
        "rerank-out-under-file",
        "rerank",
        "`rerank -o FILE/x.trec`",
        [
            "rerank",
            "--run",
            "r.trec",
            "--queries",
            "q.jsonl",
            "--corpus",
            "c.jsonl",
            "-o",
            "r.trec/x.trec",
            "--model",
            NOMODEL,
        ],
        2,
        ["r.trec is a file, not a folder"],
        _all(_write("c.jsonl", CORPUS), _write("q.jsonl", QUERIES), _write("r.trec", RUN)),
    ),
    Case(
        "rerank-corpus-and-index",
        "rerank",
        "both --corpus and --index",
        ["rerank", "--run", "r.trec", "--queries", "q.jsonl", "--corpus", "c.jsonl", "--index", "a", "-o", "o.trec"],
        2,
        ["not both"],
        _all(_write("c.jsonl", CORPUS), _write("q.jsonl", QUERIES), _write("r.trec", RUN)),
    ),
    # -- prune / ask (defects 7, 9) ------------------------------------------------------------
    Case(
        "prune-budget-zero",
        "prune/ask",
        "`prune --budget-tokens 0` (model path invalid: never loaded)",
        ["prune", "q", "--corpus", "c.jsonl", "--budget-tokens", "0", "--model", NOMODEL],
        2,
        ["--budget-tokens 0 must be at least 1"],
        _write("c.jsonl", CORPUS),
    ),
    Case(
        "prune-budget-neg",
        "prune/ask",
        "`prune --budget-tokens -5`",
        ["prune", "q", "--corpus", "c.jsonl", "--budget-tokens", "-5", "--model", NOMODEL],
        2,
        ["--budget-tokens -5 must be at least 1"],
        _write("c.jsonl", CORPUS),
    ),
    Case(
        "prune-keep-ratio",
        "prune/ask",
        "`prune --keep-ratio 1.5`",
        ["prune", "q", "--corpus", "c.jsonl", "--keep-ratio", "1.5", "--model", NOMODEL],
        2,
        ["--keep-ratio 1.5 must be in (0, 1]"],
        _write("c.jsonl", CORPUS),
    ),
    Case(
        "prune-both-budgets",
        "prune/ask",
        "`--budget-tokens` and `--keep-ratio` together",
        ["prune", "q", "--corpus", "c.jsonl", "--budget-tokens", "5", "--keep-ratio", "0.5"],
        2,
        ["give --budget-tokens or --keep-ratio, not both"],
        _write("c.jsonl", CORPUS),
    ),
    Case(
        "prune-method-bad",
        "prune/ask",
        "`prune --method magic`",
        ["prune", "q", "--corpus", "c.jsonl", "--budget-tokens", "5", "--method", "magic", "--model", NOMODEL],
        2,
        ["--method 'magic' is not one of query, focus, probe"],
        _write("c.jsonl", CORPUS),
    ),
    Case(
        "prune-empty-corpus",
        "prune/ask",
        "`prune` with an empty corpus",
        ["prune", "q", "--corpus", "c.jsonl", "--budget-tokens", "5", "--model", NOMODEL],
        1,
        ["c.jsonl: no documents found (0 valid records)"],
        _write("c.jsonl", ""),
    ),
    Case(
        "prune-k-zero",
        "prune/ask",
        "`prune --index a -k 0`",
        ["prune", "q", "--index", "a", "-k", "0", "--budget-tokens", "5", "--model", NOMODEL],
        2,
        ["-k 0 must be at least 1"],
    ),
    Case(
        "ask-k-zero",
        "prune/ask",
        "`ask -k 0`",
        ["ask", "q", "--index", "a", "-k", "0", "--model", NOMODEL],
        2,
        ["-k 0 must be at least 1"],
    ),
    Case(
        "ask-depth-zero",
        "prune/ask",
        "`ask --depth 0`",
        ["ask", "q", "--index", "a", "--depth", "0", "--model", NOMODEL],
        2,
        ["--depth 0 must be at least 1"],
    ),
    Case(
        "ask-no-index",
        "prune/ask",
        "`ask` with an index that does not exist",
        ["ask", "q", "--index", "nope", "--model", NOMODEL],
        1,
        ["no index at indexes/nope"],
    ),
    # -- eval (defects 4, 5) ----------------------------------------------------------------
    Case(
        "eval-run-not-utf8",
        "eval",
        "a run file with Latin-1 bytes",
        ["eval", "r.trec", "qrels.tsv"],
        1,
        ["r.trec:2: bytes that are not valid UTF-8"],
        _all(_write("r.trec", b"q1 Q0 d1 1 2.0 t\nq1 Q0 d\xe9 2 1.0 t\n"), _write("qrels.tsv", "q1\td1\t1\n")),
    ),
    Case(
        "eval-qrels-not-utf8",
        "eval",
        "a qrels file with Latin-1 bytes",
        ["eval", "r.trec", "qrels.tsv"],
        1,
        ["qrels.tsv:2: bytes that are not valid UTF-8"],
        _all(_write("r.trec", RUN), _write("qrels.tsv", b"q1\td1\t1\nq2\td\xe9\t1\n")),
    ),
    Case(
        "eval-run-nan",
        "eval",
        "a run score `nan`",
        ["eval", "r.trec", "qrels.tsv"],
        1,
        ["r.trec:2: score 'nan' is not a finite number"],
        _all(_write("r.trec", "q1 Q0 d1 1 2.0 t\nq1 Q0 d2 2 nan t\n"), _write("qrels.tsv", "q1\td1\t1\n")),
    ),
    Case(
        "eval-run-columns",
        "eval",
        "a run line with 5 columns",
        ["eval", "r.trec", "qrels.tsv"],
        1,
        ["r.trec:1: expected 6 columns"],
        _all(_write("r.trec", "q1 Q0 d1 1 2.0\n"), _write("qrels.tsv", "q1\td1\t1\n")),
    ),
    Case(
        "eval-qrels-missing",
        "eval",
        "a qrels path that does not exist",
        ["eval", "r.trec", "nope.tsv"],
        1,
        ["qrels file 'nope.tsv' does not exist"],
        _write("r.trec", RUN),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, work: Path, index_a: Path, request: pytest.FixtureRequest) -> None:
    if case.rrf_index:
        request.getfixturevalue("index_a_rrf")
    case.setup(work)
    before = snapshot(work)
    run = cli(*case.args, cwd=work / case.cwd, extra_env=case.env)
    after = snapshot(work)
    out = judge(
        case.id,
        case.group,
        case.given,
        run,
        exit=case.exit,
        err=case.err,
        before=before,
        after=after,
        kept="every file in the working folder (the index, the user's files)",
    )
    assert out.passed, out.problems


def _dup_run(w: Path) -> None:
    _write("r.trec", "q1 Q0 d1 1 2.0 t\nq1 Q0 d2 2 1.0 t\nq1 Q0 d1 3 0.5 t\n")(w)
    _write("qrels.tsv", "q1\td1\t1\n")(w)


def test_eval_duplicate_run_lines_warn_and_keep_first(work: Path) -> None:
    _dup_run(work)
    before = snapshot(work)
    run = cli("eval", "r.trec", "qrels.tsv", "--metrics", "RR@10", cwd=work)

    def check(r):  # the first line of d1 (score 2.0, rank 1) counts: RR = 1
        return None if r.stdout.strip() == "RR@10\t1.0000" else f"unexpected metrics {r.stdout!r}"

    out = judge(
        "eval-run-duplicate-lines",
        "eval",
        "a run listing (q1, d1) twice",
        run,
        exit=0,
        err=["1 duplicate (query, document) line(s), first at r.trec:3; kept the first line"],
        check=check,
        before=before,
        after=snapshot(work),
        kept="all files",
        sees=run.stderr.strip().splitlines()[0][:160],
    )
    assert out.passed, out.problems


def test_manifest_paths_are_confined(work: Path, index_a: Path) -> None:
    """Defect 6: manifest entries outside the index folder (absolute, `..`, a link out) are errors,
    whatever their size: no file's existence or size leaks."""
    m = json.loads((index_a / "manifest.json").read_text())
    secret = work / "secret.txt"
    secret.write_text("top secret\n")
    size = secret.stat().st_size
    outside = [("../../secret.txt", size), (str(secret), size), ("../../secret.txt", 999), ("../../no-such-file", 5)]
    for i, (name, size) in enumerate(outside):
        mm = json.loads(json.dumps(m))
        mm["files"][name] = {"bytes": size, "sha256": "0" * 64}
        (index_a / "manifest.json").write_text(json.dumps(mm))
        before = snapshot(work)
        run = cli("search", "x", "--index", "a", "--mode", "bm25", cwd=work)
        out = judge(
            f"manifest-outside-{i}",
            "manifest",
            f"manifest lists {name!r} ({size} bytes)",
            run,
            exit=1,
            err=["which is outside the index folder"],
            before=before,
            after=snapshot(work),
            kept="all files",
        )
        assert out.passed and "bytes" not in run.stderr, out.problems
    (index_a / "manifest.json").write_text(json.dumps(m))
    link = index_a / "bm25" / "vocab.json"
    real = work / "vocab-copy.json"
    real.write_bytes(link.read_bytes())
    link.unlink()
    link.symlink_to(real)
    before = snapshot(work)
    run = cli("search", "x", "--index", "a", "--mode", "bm25", cwd=work)
    out = judge(
        "manifest-symlink-out",
        "manifest",
        "bm25/vocab.json is a link to a file outside the index",
        run,
        exit=1,
        err=["which is outside the index folder"],
        before=before,
        after=snapshot(work),
        kept="all files",
    )
    assert out.passed, out.problems
    del m["files"]["dense/index.faiss"]
    (index_a / "manifest.json").write_text(json.dumps(m))
    run = cli("search", "x", "--index", "a", "--mode", "bm25", cwd=work)
    out = judge(
        "manifest-unlisted-file",
        "manifest",
        "the manifest no longer lists dense/index.faiss",
        run,
        exit=1,
        err=["does not list ['dense/index.faiss']"],
    )
    assert out.passed, out.problems
