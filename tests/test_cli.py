from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from attnrank.cli import app

runner = CliRunner()


def test_index_search_eval(tmp_path, scifact_mini):
    ix = tmp_path / "ix"
    r = runner.invoke(app, ["index", str(scifact_mini), "--index-dir", str(ix), "-q"])
    assert r.exit_code == 0, r.output
    assert "indexed 55 documents" in r.output
    run = tmp_path / "run.trec"
    r = runner.invoke(
        app,
        [
            "search",
            "--index-dir",
            str(ix),
            "--queries",
            str(scifact_mini / "queries.jsonl"),
            "-k",
            "20",
            "--mode",
            "bm25",
            "-o",
            str(run),
            "-q",
        ],
    )
    assert r.exit_code == 0, r.output
    lines = [line.split() for line in run.read_text().splitlines()]
    per_query = {q: sum(1 for line in lines if line[0] == q) for q in {line[0] for line in lines}}
    # every query, up to 20 hits each: by BM25 only the documents holding a query term
    assert len(per_query) == 12 and max(per_query.values()) == 20 and min(per_query.values()) >= 1
    assert all(float(line[4]) > 0 for line in lines)
    r = runner.invoke(app, ["eval", str(run), str(scifact_mini / "qrels" / "train.tsv"), "--metrics", "nDCG@10,R@20"])
    assert r.exit_code == 0 and r.output.startswith("nDCG@10\t")
    r = runner.invoke(app, ["search", "vitamin D", "--index-dir", str(ix), "-k", "2", "-q"])
    assert r.exit_code == 0 and "  1. " in r.output


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "attnrank.cli", *args], capture_output=True, text=True)


def test_bad_input_is_one_line_and_nonzero(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n')
    r = _cli("index", str(p), "--index-dir", str(tmp_path / "ix"), "-q")
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and "c.jsonl:2: duplicate document id 'a'" in r.stderr
    assert not (tmp_path / "ix").exists()
    r = _cli("search", "x", "--index-dir", str(tmp_path / "missing"))
    assert r.returncode == 1 and "no index at" in r.stderr


def test_index_fusion_default_convex_and_rrf_on_request(tmp_path, scifact_mini, monkeypatch):
    """`index` stores convex z-score fusion (alpha 0.45) unless `--fusion rrf` is given; `search
    --fusion rrf` on the convex index gives what the RRF index gives by default. The old `--name`
    still works, with a deprecation warning."""
    import json

    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["index", str(scifact_mini), "--index", "conv", "-q"])
    assert r.exit_code == 0, r.output
    fusion = json.loads((tmp_path / "indexes" / "conv" / "manifest.json").read_text())["fusion"]
    assert (fusion["method"], fusion["alpha"], fusion["norm"]) == ("convex", 0.45, "zscore")
    r = _cli("index", str(scifact_mini), "--name", "rrf", "--fusion", "rrf", "-q")
    assert r.returncode == 0, r.stderr
    assert "--name is deprecated" in r.stderr and "use --index rrf" in r.stderr
    fusion = json.loads((tmp_path / "indexes" / "rrf" / "manifest.json").read_text())["fusion"]
    assert fusion["method"] == "rrf"

    def top(*args):
        out = runner.invoke(app, ["search", "vitamin D and bone fractures", "-k", "10", "-q", *args])
        assert out.exit_code == 0, out.output
        ids = [line.split()[1] for line in out.output.splitlines() if line[:4].strip().rstrip(".").isdigit()]
        assert len(ids) == 10, out.output
        return ids

    assert top("--index", "conv", "--fusion", "rrf") == top("--index", "rrf")
    assert top("--index", "conv") == top("--index", "rrf", "--fusion", "convex", "--alpha", "0.45", "--norm", "zscore")


def test_the_cli_starts_without_torch():
    """`attnrank --help`, and every check made before a model or index is loaded, must not pay
    for importing torch and transformers (seconds on a CPU)."""
    code = "import sys, attnrank.cli; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_index_names_a_missing_embedder_folder_before_reading_the_corpus(tmp_path):
    """A typo in --embedder was found inside the dense build: after the corpus was read and BM25
    built (with --passage-states, after the LLM had loaded)."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("{not json\n")  # read first, this would be the error
    r = runner.invoke(
        app, ["index", str(corpus), "--index-dir", str(tmp_path / "ix"), "--embedder", "./typo-model", "-q"]
    )
    assert r.exit_code != 0 and "no such local model folder" in (r.output + str(r.exception))
    assert not (tmp_path / "ix").exists()


def test_a_search_without_hits_says_so_and_writes_no_empty_run(tmp_path, scifact_mini):
    """Nothing was printed (exit 0), and -o wrote a 0-byte run that eval and rerank then refused."""
    ix = tmp_path / "ix"
    assert runner.invoke(app, ["index", str(scifact_mini), "--index-dir", str(ix), "-q"]).exit_code == 0
    r = runner.invoke(app, ["search", "zzzz qqqq", "--index-dir", str(ix), "--mode", "bm25", "-q"])
    assert r.exit_code == 0 and "no hits" in r.output, r.output
    run = tmp_path / "empty.trec"
    r = runner.invoke(app, ["search", "zzzz qqqq", "--index-dir", str(ix), "--mode", "bm25", "-o", str(run), "-q"])
    assert r.exit_code == 1 and "no query had a hit, so nothing was written" in r.output + str(r.exception)
    assert not run.exists()
    # some queries without a hit: "wrote ... for 2 queries" counted them, though the run has no line of theirs
    queries = tmp_path / "q.tsv"
    queries.write_text("a\tvitamin D\nb\tzzzz qqqq\n")
    r = runner.invoke(
        app, ["search", "--queries", str(queries), "--index-dir", str(ix), "--mode", "bm25", "-o", str(run)]
    )
    assert r.exit_code == 0 and f"results for 1 queries to {run}" in r.output, r.output
    assert "warning: 1 of 2 queries had no hit (no line in a TREC run), e.g. 'b'" in r.output
    assert {line.split()[0] for line in run.read_text().splitlines()} == {"a"}


def test_a_model_that_cannot_load_is_named_before_the_index_loads(tmp_path, scifact_mini, monkeypatch):
    """A mistyped --model was read only after the index, the embedder and the first stage had run."""
    from attnrank.index.retriever import HybridRetriever

    loads = []
    monkeypatch.setattr(HybridRetriever, "load", classmethod(lambda cls, *a, **k: loads.append(a)))
    r = runner.invoke(
        app, ["search", "vitamin", "--index-dir", str(tmp_path), "--rerank", "2", "--model", str(tmp_path / "nope")]
    )
    assert r.exit_code != 0 and "nope" in r.output + str(r.exception) and loads == []


def test_a_query_that_is_not_utf8_is_an_option_error_before_the_index_loads(tmp_path, monkeypatch):
    """Undecodable bytes in QUERY (a lone surrogate) were refused only after the index had loaded, exit 1."""
    from attnrank.index.retriever import HybridRetriever

    loads = []
    monkeypatch.setattr(HybridRetriever, "load", classmethod(lambda cls, *a, **k: loads.append(a)))
    r = runner.invoke(app, ["search", "caf\udcff", "--index-dir", str(tmp_path)])
    assert r.exit_code == 2 and loads == [], r.output


def test_every_option_of_one_name_has_the_same_short_form():
    """One name per concept: `train --index` had no -n, which every other command's --index has."""
    import typer.main

    short: dict[str, set[tuple[str, ...]]] = {}

    def walk(command) -> None:  # (Typer's own click: a group holds .commands, an option is an "option")
        for sub in getattr(command, "commands", {}).values():
            walk(sub)
        for p in command.params:
            if p.param_type_name == "option":
                for name in [o for o in p.opts if o.startswith("--")]:
                    short.setdefault(name, set()).add(tuple(sorted(o for o in p.opts if not o.startswith("--"))))

    walk(typer.main.get_command(app))
    assert len(short) > 50 and short["--index"] == {("-n",)}
    mixed = {name: forms for name, forms in short.items() if len(forms) > 1}
    assert mixed == {"--index-dir": {(), ("-o",)}}, mixed  # (merge-shards: -o, as every command's output)


def test_the_demos_answers_say_where_they_were_cut_and_no_warning_breaks_their_line(llm, capsys, caplog):
    """The answer cut at the demo's 24-token limit logged a warning in the middle of its printed
    line ("... Corliss ArcherWARNING attnrank.generate: the answer reached ...")."""
    from attnrank.cli.demo import _demo_answers
    from attnrank.types import RankedResults, ScoredDocument

    hits = RankedResults("q", [ScoredDocument("a", 1.0, 1, "Paris is the capital of France. It is large.")])
    with caplog.at_level("WARNING", logger="attnrank"):
        _demo_answers(llm, [({"text": "What is the capital of France?", "answers": ["Paris"]}, hits)], k=1)
    out = capsys.readouterr().out
    assert "cut at the 24-token limit" in out  # (the tiny random model ends no turn in 24 tokens)
    assert "reached max_new_tokens" not in caplog.text
