"""Faults during index builds and reads: kill -9 at each point of a save, a full disk, stale
temporary folders, readers racing a writer's swap. The previous index must always load and give
the same results; a reader sees the old or the new index, never a mix.

Faults are injected with ``ATTNRANK_FAULT`` (:func:`attnrank.config.fault_point`, inert when
unset). Builds through the CLI load the embedder (the slow cases); the other kill points are
driven by a writer process that saves a prebuilt index through the same code path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _harness import Run, cli, env, judge, snapshot

SEARCH = ["search", "cancer", "--index", "a", "--mode", "bm25", "-k", "3", "-q"]
CORPUS_B = "".join(
    json.dumps({"id": f"n{i}", "text": t}) + "\n"
    for i, t in enumerate(["Volcanoes erupt lava.", "Cancer cells divide quickly.", "Rivers flow to the sea."])
)


def _same_as(expected: str):
    return lambda r: None if r.stdout == expected else f"output differs from the index's own: {r.stdout[:200]!r}"


def _leftovers(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


def test_cli_build_faults_keep_previous_index(work: Path, index_a: Path) -> None:
    """ENOSPC and kill -9 during `attnrank index` over an existing index, then a clean rebuild."""
    (work / "new.jsonl").write_text(CORPUS_B)
    reference = cli(*SEARCH, cwd=work)
    assert reference.rc == 0 and reference.stdout.count("  1. ") == 1
    kept = snapshot(index_a)
    build = ["index", "new.jsonl", "--index", "a", "-q"]

    run = cli(*build, cwd=work, extra_env={"ATTNRANK_FAULT": "save-in-tmp:enospc"})
    out = judge(
        "build-enospc",
        "build faults",
        "disk full while `attnrank index` writes the new index",
        run,
        exit=1,
        err=["No space left on device", "free some disk space", "existing indexes and files were kept"],
        before=kept,
        after=snapshot(index_a),
        kept="the previous index, byte for byte; no temporary folder",
    )
    assert out.passed and _leftovers(index_a.parent, "a") == [], (out.problems, _leftovers(index_a.parent, "a"))

    left = []
    for point in ("save-in-tmp", "save-before-swap"):
        killed = cli(*build, cwd=work, extra_env={"ATTNRANK_FAULT": point})
        assert killed.rc == -9, killed.stderr[-500:]
        # each build first removes what the previous killed build left
        assert all(f"removed indexes/{s}," in killed.stderr for s in left), killed.stderr
        left = _leftovers(index_a.parent, "a")
        run = cli(*SEARCH, cwd=work)
        out = judge(
            f"build-kill-{point}",
            "build faults",
            f"kill -9 of `attnrank index` at {point}, then search",
            run,
            exit=0,
            check=_same_as(reference.stdout),
            before=kept,
            after=snapshot(index_a),
            kept="the previous index, byte for byte (the temporary folder is left for the next build)",
        )
        assert out.passed, out.problems
    stale = _leftovers(index_a.parent, "a")
    assert len(stale) == 1 and all(re.fullmatch(r"\.a\.tmp-\d+-[0-9a-f]{8}", s) for s in stale), stale

    run = cli(*build, cwd=work)
    out = judge(
        "build-after-kills",
        "build faults",
        "the next `attnrank index` after a killed build",
        run,
        exit=0,
        err=[f"removed indexes/{s}, left by an index build that was killed" for s in stale],
        check=lambda r: None if "indexed 3 documents" in r.stdout else r.stdout,
        sees="indexed 3 documents; a warning names each stale temporary folder removed",
        kept="the new index; stale temporary folders removed",
    )
    assert out.passed and _leftovers(index_a.parent, "a") == [], out.problems
    run = cli("search", "cancer", "--index", "a", "--mode", "bm25", "-k", "1", cwd=work)
    assert run.rc == 0 and " n1 " in run.stdout, run.stdout


WRITER = """
import sys
from attnrank.index.retriever import HybridRetriever
HybridRetriever.load(sys.argv[1]).save(sys.argv[2])
"""


def _writer(src: Path, target: Path, cwd: Path, fault: str | None) -> Run:
    e = env(**({"ATTNRANK_FAULT": fault} if fault else {}))
    p = subprocess.run(
        [sys.executable, "-c", WRITER, str(src), str(target)],
        cwd=cwd,
        env=e,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return Run(p.returncode, p.stdout, p.stderr, 0.0)


def test_writer_killed_at_each_point(work: Path, index_a: Path, prebuilt) -> None:
    reference = cli(*SEARCH, cwd=work).stdout
    kept = snapshot(index_a)
    for point in ("save-before-tmp", "save-in-tmp", "save-before-swap"):
        w = _writer(prebuilt[1], index_a, work, point)
        assert w.rc == -9, w.stderr[-300:]
        run = cli(*SEARCH, cwd=work)
        out = judge(
            f"writer-kill-{point}",
            "build faults",
            f"kill -9 of a save at {point}, then search",
            run,
            exit=0,
            check=_same_as(reference),
            before=kept,
            after=snapshot(index_a),
            kept="the previous index, byte for byte",
        )
        assert out.passed, out.problems
    w = _writer(prebuilt[1], index_a, work, "save-after-swap")
    assert w.rc == -9
    run = cli("search", "glaciers", "--index", "a", "--mode", "bm25", "-k", "1", "--verify", cwd=work)
    out = judge(
        "writer-kill-save-after-swap",
        "build faults",
        "kill -9 right after the swap, then search --verify",
        run,
        exit=0,
        check=lambda r: None if " b2 " in r.stdout else r.stdout,
        kept="the new index, complete (verified); the old one is a stale folder",
    )
    assert out.passed, out.problems


def test_first_build_killed_leaves_no_index(work: Path, prebuilt) -> None:
    target = work / "indexes" / "fresh"
    w = _writer(prebuilt[0], target, work, "save-before-swap")
    assert w.rc == -9
    run = cli("search", "x", "--index", "fresh", cwd=work)
    out = judge(
        "first-build-killed",
        "build faults",
        "the first build of an index killed before its swap, then search",
        run,
        exit=1,
        err=["no index at indexes/fresh"],
        kept="nothing half-written is loadable",
    )
    assert out.passed, out.problems


def test_stale_folders_of_live_builds_are_kept(work: Path, prebuilt) -> None:
    parent = work / "indexes"
    parent.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone, live = int(dead.stdout), os.getpid()
    for pid, tag in ((gone, "0badc0de"), (live, "feedbeef")):
        d = parent / f".a.tmp-{pid}-{tag}"
        d.mkdir()
        (d / "docs.jsonl").write_text("partial")
    (parent / ".other.tmp-1-00000000").mkdir()  # another index's folder: not ours to touch
    w = _writer(prebuilt[0], parent / "a", work, None)
    left = _leftovers(parent, "a")
    sees = w.stderr.strip().splitlines()[0] if w.stderr.strip() else ""
    ok = (
        w.rc == 0
        and left == [f".a.tmp-{live}-feedbeef"]
        and (parent / ".other.tmp-1-00000000").is_dir()
        and f"process {gone} is gone" in sees
    )
    out = judge(
        "stale-live-kept",
        "build faults",
        "a save next to a dead build's and a live build's temporary folders",
        Run(0 if ok else 1, "", w.stderr, 0),
        exit=0,
        sees=sees,
        kept="the live build's folder and other indexes' folders",
    )
    assert out.passed and ok, (left, w.stderr)


READER = """
import json, sys
from attnrank.index.retriever import HybridRetriever
ids_a, ids_b = set(json.loads(sys.argv[2])), set(json.loads(sys.argv[3]))
seen = {"A": 0, "B": 0, "mix": 0}
for _ in range(int(sys.argv[4])):
    r = HybridRetriever.load(sys.argv[1])
    ids = {d.id for d in r.docs}
    same = r.bm25.num_docs == r.dense.num_docs == len(r.docs)
    side = "A" if ids == ids_a and same else "B" if ids == ids_b and same else "mix"
    hits = r.search("the cancer glaciers", 3, mode="bm25").ids
    if not set(hits) <= ids:
        side = "mix"
    seen[side] += 1
print(json.dumps(seen))
"""
SWAPPER = """
import sys
from attnrank.index.retriever import HybridRetriever
import time
a, b = HybridRetriever.load(sys.argv[1]), HybridRetriever.load(sys.argv[2])
print("ready", flush=True)
for i in range(int(sys.argv[4])):
    (b if i % 2 == 0 else a).save(sys.argv[3])
    time.sleep(0.05)
print("swaps done")
"""


def test_concurrent_readers_see_old_or_new(work: Path, index_a: Path, prebuilt) -> None:
    """Readers (the CLI and the library, paused between manifest and files to widen the race)
    while a writer swaps index A and index B into place 40 times."""
    from attnrank.index.retriever import HybridRetriever

    ids_a = json.dumps([d.id for d in HybridRetriever.load(prebuilt[0]).docs])
    ids_b = json.dumps([d.id for d in HybridRetriever.load(prebuilt[1]).docs])
    outs = {}
    for side, src in (("A", prebuilt[0]), ("B", prebuilt[1])):
        shutil.rmtree(index_a)
        shutil.copytree(src, index_a)
        outs[side] = cli(
            "search", "the cancer glaciers", "--index", "a", "--mode", "bm25", "-k", "3", "-q", cwd=work
        ).stdout
    slow = env(ATTNRANK_FAULT="load-after-manifest:sleep0.05")
    writer = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(prebuilt[0]), str(prebuilt[1]), str(index_a), "40"],
        cwd=work,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout.readline().strip() == "ready"  # readers start once the swaps do
    api = subprocess.Popen(
        [sys.executable, "-c", READER, str(index_a), ids_a, ids_b, "25"],
        cwd=work,
        env=slow,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    readers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "attnrank.cli",
                "search",
                "the cancer glaciers",
                "--index",
                "a",
                "--mode",
                "bm25",
                "-k",
                "3",
                "-q",
            ],
            cwd=work,
            env=slow,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for i, p in enumerate(readers):
        so, se = p.communicate(timeout=120)
        run = Run(p.returncode, so, se, 0)
        out = judge(
            f"concurrent-cli-reader-{i}",
            "concurrency",
            "`attnrank search` while a writer swaps A/B in place",
            run,
            exit=0,
            check=lambda r: None if r.stdout in outs.values() else f"mixed output {r.stdout!r}",
            kept="each reader printed exactly index A's or index B's results",
        )
        assert out.passed, (out.problems, se[-600:])
    so, se = api.communicate(timeout=180)
    _, we = writer.communicate(timeout=180)
    assert writer.returncode == 0, we[-500:]
    seen = json.loads(so) if api.returncode == 0 else {}
    run = Run(api.returncode if seen.get("mix", 1) == 0 else 1, so, se, 0)
    out = judge(
        "concurrent-api-reader",
        "concurrency",
        "25 library loads while a writer swaps A/B 40 times",
        run,
        exit=0,
        sees=f"{seen.get('A')} loads saw A, {seen.get('B')} saw B, {seen.get('mix')} a mix",
        kept="every load consistent (documents, BM25, FAISS and results of one index)",
    )
    assert out.passed, (out.problems, se[-800:])
    assert _leftovers(index_a.parent, "a") == []


def test_python_api_validation(work: Path, built_api_cases) -> None:
    for case_id, given, run, err in built_api_cases:
        out = judge(case_id, "python API", given, run, exit=1, err=[err])
        assert out.passed, out.problems


API_CASES = """
import json, sys
from attnrank import AttnrankError
from attnrank.index.retriever import HybridRetriever
from attnrank.rerank.attention import AttentionReranker
from attnrank.types import Document

r = HybridRetriever.load(sys.argv[1])
rr = AttentionReranker(sys.argv[2])
docs = [Document("a", "Paris is in France."), Document("b", "Bananas are yellow."), Document("c", "Rome is in Italy.")]
cases = {
    "api-search-batch-ids": lambda: r.search_batch(["a", "b"], 3, query_ids=["x"], mode="bm25"),
    "api-search-k-neg": lambda: r.search("cancer", -1, mode="bm25"),
    "api-rank-k-neg": lambda: rr.rank("capital of France?", docs, k=-1),
    "api-rank-k-zero": lambda: rr.rank("capital of France?", docs, k=0),
    "api-rank-dup-ids": lambda: rr.rank("capital of France?", docs + [Document("a", "Paris again.")]),
    "api-rank-batch-ids": lambda: rr.rank_batch(["q1", "q2"], [docs, docs], query_ids=["x"]),
}
for name, fn in cases.items():
    try:
        fn()
        print(json.dumps([name, 0, ""]))
    except AttnrankError as e:
        print(json.dumps([name, 1, f"error: {e}"]))
    except Exception as e:
        print(json.dumps([name, 1, f"Traceback (most recent call last): {type(e).__name__}: {e}"]))
"""
API_EXPECT = {
    "api-search-batch-ids": ('search_batch(["a","b"], query_ids=["x"])', "2 queries but 1 query_ids"),
    "api-search-k-neg": ("search(q, k=-1)", "k=-1 must be a positive integer"),
    "api-rank-k-neg": (
        "AttentionReranker.rank(q, docs, k=-1)",
        "k=-1 must be None (all documents) or a positive integer",
    ),
    "api-rank-k-zero": (
        "AttentionReranker.rank(q, docs, k=0)",
        "k=0 must be None (all documents) or a positive integer",
    ),
    "api-rank-dup-ids": ("rank() with two documents of id 'a'", "document #3 repeats the id 'a'"),
    "api-rank-batch-ids": ("rank_batch(2 queries, query_ids=['x'])", "2 queries but 1 query_ids"),
}


@pytest.fixture
def built_api_cases(prebuilt, tiny_model_path, work):
    """Run every library-API case in one process (the tiny LLM loads once); one row each."""
    index, model, cwd = prebuilt[0], tiny_model_path, work
    p = subprocess.run(
        [sys.executable, "-c", API_CASES, str(index), str(model)],
        cwd=cwd,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-1000:]
    out = []
    for line in p.stdout.splitlines():
        name, rc, err = json.loads(line)
        given, expect = API_EXPECT[name]
        out.append((name, given, Run(rc, "", err, 0), expect))
    assert len(out) == len(API_EXPECT)
    return out
