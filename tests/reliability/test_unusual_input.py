"""Unusual but valid input: CJK, emoji and right-to-left text, a 5 MB document, a 10,000-word query,
a symbolic link loop inside the corpus, a non-UTF-8 file skipped with --skip-invalid, all indexed
with --force over a user's folder (the one build of this file)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _harness import cli, judge, snapshot

FILES = {
    "cjk.txt": "東京 大学 の 研究 者 が 新しい 材料 を 開発 した",
    "emoji.md": "# Party 🎉\nWe celebrate with 🎉 emoji and 🍕 pizza tonight.",
    "rtl.txt": "שלום עולם זה מסמך בעברית. مرحبا بالعالم",
    "plain.txt": "Volcanoes erupt lava and ash.",
}


@pytest.fixture(scope="module")
def mixed_index(tmp_path_factory):
    w = tmp_path_factory.mktemp("unusual")
    corpus = w / "mixed"
    corpus.mkdir()
    for name, text in FILES.items():
        (corpus / name).write_text(text, encoding="utf-8")
    with open(corpus / "big.txt", "w", encoding="utf-8") as f:  # 5 MB, one rare word at the very end
        f.write("lorem ipsum dolor sit amet " * (5_000_000 // 27) + "zyzzyva\n")
    (corpus / "bad.txt").write_bytes(b"caf\xe9 au lait")
    (corpus / "loop").symlink_to(".")
    (w / "user").mkdir()
    (w / "user" / "thesis.txt").write_text("my thesis")
    before = snapshot(corpus)
    run = cli("index", "mixed", "--index-dir", "user", "--force", "--skip-invalid", "-q", cwd=w, timeout=300)
    return w, run, before, snapshot(corpus)


def test_build_with_force_and_skip_invalid(mixed_index) -> None:
    w, run, before, after = mixed_index

    def check(r):
        if "indexed 5 documents into user" not in r.stdout:
            return f"unexpected output {r.stdout!r}"
        if r.stderr.count("skipped 1 invalid record(s)") != 1 or r.stderr.count("bad.txt") != 1:
            return f"the skip report is not printed exactly once: {r.stderr!r}"
        if r.stderr.count("because of --force") != 1:  # (it was printed by every check of the target: 2-3 times)
            return f"the replaced folder is not named exactly once: {r.stderr!r}"
        return None

    out = judge(
        "unicode-5mb-loop-force-build",
        "unusual input",
        "`index DIR --force --skip-invalid` over a user folder; DIR: CJK, emoji, RTL, a 5 MB file, a "
        "non-UTF-8 file, a symlink loop",
        run,
        exit=0,
        check=check,
        before=before,
        after=after,
        err=["replaced user because of --force: user exists and is not an attnrank index"],
        sees="indexed 5 documents; the skipped file reported once; a warning names the replaced folder",
        kept="the corpus folder unchanged (the user folder replaced, as --force asked)",
    )
    assert out.passed, out.problems


QUERIES = [
    ("unicode-cjk-query", "a CJK query `東京 大学`", "東京 大学", "cjk.txt"),
    ("unicode-emoji-query", "an emoji query `🎉 pizza`", "🎉 pizza", "emoji.md"),
    ("unicode-rtl-query", "a Hebrew (RTL) query `שלום עולם`", "שלום עולם", "rtl.txt"),
    ("big-doc-rare-word", "a word found only at the end of the 5 MB document", "zyzzyva", "big.txt"),
    ("query-10000-words", "a 10,000-word query", "lorem " * 9_999 + "volcanoes", "big.txt"),
]


@pytest.mark.parametrize("case_id,given,query,top", QUERIES, ids=[q[0] for q in QUERIES])
def test_unusual_queries(case_id, given, query, top, mixed_index) -> None:
    w = mixed_index[0]
    assert mixed_index[1].rc == 0
    before = snapshot(w / "user")
    run = cli("search", query, "--index-dir", "user", "--mode", "bm25", "-k", "2", "-q", cwd=w)

    def check(r):
        lines = r.stdout.splitlines()
        return None if lines and lines[0].split()[1] == top else f"top hit is not {top}: {r.stdout[:200]!r}"

    out = judge(
        case_id,
        "unusual input",
        given,
        run,
        exit=0,
        check=check,
        before=before,
        after=snapshot(w / "user"),
        kept="the index unchanged",
    )
    assert out.passed, out.problems


def test_symlink_loop_corpus_file(tmp_path: Path) -> None:
    (tmp_path / "c.jsonl").symlink_to("c.jsonl")
    run = cli("index", "c.jsonl", "--index", "n", "-q", cwd=tmp_path)
    out = judge(
        "corpus-file-symlink-loop",
        "unusual input",
        "a corpus file that is a symbolic link to itself",
        run,
        exit=1,
        err=["corpus path 'c.jsonl' is a symbolic link that leads nowhere (broken, or a loop)"],
        kept="-",
    )
    assert out.passed, out.problems
