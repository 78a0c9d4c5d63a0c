"""Command-line input checks: outputs never replace a file attnrank did not write, and bad option
values fail before any index, Ray cluster or model is loaded (a stub that fails loudly stands in
for the model wherever a check could come too late)."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from _cli import cli_text
from typer.testing import CliRunner

from attnrank.cli import app
from attnrank.errors import AttnrankError

runner = CliRunner()
RUN = "q1 Q0 d1 1 2.000000 attnrank-bm25\nq1 Q0 d2 2 1.000000 attnrank-bm25\n"


_text = cli_text


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnrank.cli", *args], capture_output=True, text=True, cwd=cwd)


@pytest.fixture
def no_model(monkeypatch):
    """Loading any model (or starting Ray) fails the test: the checks must come first."""

    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    import attnrank.batch
    import attnrank.llm.models
    import attnrank.pipeline
    import attnrank.prune.pruner
    import attnrank.rerank.attention

    monkeypatch.setattr(attnrank.llm.models, "load_llm", loaded)
    monkeypatch.setattr(attnrank.rerank.attention, "AttentionReranker", loaded)
    monkeypatch.setattr(attnrank.prune.pruner, "ContextPruner", loaded)
    monkeypatch.setattr(attnrank.pipeline.Pipeline, "from_model", loaded)
    monkeypatch.setattr(attnrank.batch, "run_batch", loaded)


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory, scifact_docs) -> Path:
    from attnrank.index.retriever import HybridRetriever

    return HybridRetriever().index(scifact_docs[:5], show_progress=False).save(tmp_path_factory.mktemp("ix") / "ix")


# -- outputs -----------------------------------------------------------------------------------


def test_a_reranked_search_run_is_tagged_with_its_preset(tmp_path, index_dir):
    """Before: every line said attnrank-hybrid, as the first stage's run does."""
    out = tmp_path / "s.trec"
    args = ["search", "vitamin D bones", "--index-dir", str(index_dir), "-k", "3", "-q", "-o", str(out)]
    r = runner.invoke(app, [*args, "--rerank", "3", "--preset", "signals"])
    assert r.exit_code == 0, r.output
    assert {line.split()[5] for line in out.read_text().splitlines()} == {"attnrank-signals"}
    r = runner.invoke(app, args)
    assert r.exit_code == 0 and {line.split()[5] for line in out.read_text().splitlines()} == {"attnrank-hybrid"}


def test_search_output_replaces_only_runs_attnrank_wrote(tmp_path, index_dir, scifact_mini):
    queries = scifact_mini / "queries.jsonl"
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    base = ["search", "--index-dir", str(index_dir), "--queries", str(queries), "-k", "2", "-q", "-o"]
    r = runner.invoke(app, [*base, str(notes)])
    assert r.exit_code == 2 and "exists and is not a TREC run attnrank wrote" in _text(r)
    assert notes.read_text() == "my notes\n"
    other = tmp_path / "other.trec"  # a run another tool wrote is the user's too
    other.write_text("q1 Q0 d1 1 2.0 bm25\n")
    r = runner.invoke(app, [*base, str(other)])
    assert r.exit_code == 2 and other.read_text() == "q1 Q0 d1 1 2.0 bm25\n"
    r = runner.invoke(app, [*base, str(index_dir / "docs.jsonl")])
    assert r.exit_code == 2 and f"lies inside the attnrank index {index_dir}" in _text(r)
    r = runner.invoke(app, [*base, str(queries)])
    assert r.exit_code == 2 and "is also the --queries input" in _text(r)
    fifo = tmp_path / "pipe"  # like /dev/null: renaming the run over it would replace the device
    os.mkfifo(fifo)
    r = runner.invoke(app, [*base, str(fifo)])
    assert r.exit_code == 2 and "is not a regular file" in _text(r) and stat.S_ISFIFO(fifo.stat().st_mode)
    ours, empty = tmp_path / "ours.trec", tmp_path / "empty.trec"
    ours.write_text(RUN)
    empty.touch()
    for path in (ours, empty):
        r = runner.invoke(app, [*base, str(path)])
        assert r.exit_code == 0, _text(r)
        assert len(path.read_text().splitlines()) == 24 and "attnrank-" in path.read_text()


def test_rerank_output_is_not_an_input(tmp_path, dl19_mini, no_model):
    run = tmp_path / "run.trec"
    run.write_text((dl19_mini / "run.bm25.trec").read_text().replace(" bm25\n", " attnrank-bm25\n"))
    before = run.read_text()
    args = ["rerank", "--run", str(run), "--queries", str(dl19_mini / "topics.tsv")]
    r = runner.invoke(app, [*args, "--corpus", str(dl19_mini / "passages.jsonl"), "-o", str(run)])
    assert r.exit_code == 2 and "is also the --run input" in _text(r)
    assert run.read_text() == before
    topics = tmp_path / "topics.tsv"
    topics.write_text((dl19_mini / "topics.tsv").read_text())
    args = ["rerank", "--run", str(run), "--queries", str(topics)]  # the copy is the input, and the output
    r = runner.invoke(app, [*args, "--corpus", str(dl19_mini / "passages.jsonl"), "-o", str(topics)])
    assert r.exit_code == 2 and "is also the --queries input" in _text(r)
    assert topics.read_text() == (dl19_mini / "topics.tsv").read_text()


def test_batch_outputs_and_resources_checked_before_ray(tmp_path, scifact_mini, index_dir, no_model):
    queries = str(scifact_mini / "queries.jsonl")
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    base = ["batch", queries, "--index", str(index_dir)]
    cases = [
        (["-o", str(notes)], "exists and is not a TREC run attnrank wrote"),
        (["--parquet", str(notes)], "exists and is not a batch Parquet file"),
        (["-o", str(tmp_path / "r.trec"), "--num-cpus", "0"], "--num-cpus 0 must be at least 1"),
        (["-o", str(tmp_path / "r.trec"), "--num-cpus", "1", "--actor-cpus", "2"], "so no actor could start"),
        # options the run would have ignored, or NaN, which passed `<= 0`
        (["-o", str(tmp_path / "r.trec"), "--num-cpus", "2", "--ray-address", "auto"], "drop one of them"),
        (["-o", str(tmp_path / "r.trec"), "--actor-cpus", "nan"], "--actor-cpus nan must be a finite number > 0"),
        (["-o", str(tmp_path / "r.trec"), "--rerank-actors", "3"], "--rerank-actors"),
        (["-o", str(tmp_path / "r.trec"), "--rerank", "2", "--device", "gpu"], "--device 'gpu' is not cpu or cuda"),
        (["-o", str(tmp_path / "r.trec"), "--rerank", "2", "--heads", "x-y"], "--heads 'x-y'"),
    ]
    for extra, message in cases:
        r = runner.invoke(app, [*base, *extra])
        assert r.exit_code != 0 and message in _text(r), (extra, _text(r))
    assert notes.read_text() == "mine\n"
    r = runner.invoke(app, base)  # no output: a usage error (it exited 1)
    assert r.exit_code == 2 and "give an output: -o RUN.trec and/or --parquet FILE" in _text(r), _text(r)
    option_values = [  # the library's refusals of option values: exit 2 with the usage hint (were exit 1)
        (["-k", "0"], "--top-k 0 must be at least 1"),
        (["--mode", "fuzzy"], "--mode 'fuzzy' is not one of"),
        (["--rerank", "-1"], "--rerank -1 must be 0 (off) or a positive depth"),
    ]
    for extra, message in option_values:
        r = runner.invoke(app, [*base, "-o", str(tmp_path / "r.trec"), *extra])
        assert r.exit_code == 2 and message in _text(r), (extra, _text(r))
    r = runner.invoke(app, ["batch", queries, "--index", str(tmp_path / "none"), "-o", str(tmp_path / "r.trec")])
    assert r.exit_code == 2 and "is not a folder; build one with `attnrank index`" in _text(r)


def test_explain_output_checked_before_the_model(tmp_path, index_dir, no_model):
    args = ["explain", "q", "--index-dir", str(index_dir), "--no-png", "-o"]
    a_file = tmp_path / "f.txt"
    a_file.write_text("x")
    r = runner.invoke(app, [*args, str(a_file)])
    assert r.exit_code == 2 and "is a file; give a folder" in _text(r)
    r = runner.invoke(app, [*args, str(tmp_path / "page.html")])  # (became a folder page.html/, exit 0)
    assert r.exit_code == 2 and "names a file, but explain writes a folder" in _text(r)
    page = tmp_path / "out" / "explain.html"
    page.parent.mkdir()
    page.write_text("<html>my page</html>")
    r = runner.invoke(app, [*args, str(page.parent)])
    assert r.exit_code == 2 and "exists and is not an explain page attnrank wrote" in _text(r)
    taken = tmp_path / "taken"
    (taken / "explain.html").mkdir(parents=True)  # a folder where the page goes: failed at the rename, after the work
    r = runner.invoke(app, [*args, str(taken)])
    assert r.exit_code == 2 and "is a folder; give a file path" in _text(r)
    assert page.read_text() == "<html>my page</html>"


def test_heads_show_png_replaces_only_its_own_heat_map(tmp_path, monkeypatch, tiny_dir):
    pytest.importorskip("matplotlib")
    from attnrank.files import has_png_mark
    from attnrank.llm.fingerprint import model_fingerprint
    from attnrank.registry_save import save_head_set

    monkeypatch.setenv("ATTNRANK_HOME", str(tmp_path / "home"))
    model_id, fp = model_fingerprint(str(tiny_dir))
    save_head_set(model_id, fp, "qr-score", ["1-2"], scores=[[0.1, 0.2, 0.3, 0.4]] * 3)
    png = tmp_path / "heat.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\nmy own picture")
    args = ["heads", "show", "--model", str(tiny_dir), "--png", str(png)]
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "exists and is not a heat map attnrank wrote" in _text(r)
    assert png.read_bytes() == b"\x89PNG\r\n\x1a\nmy own picture"
    png.unlink()
    for _ in range(2):  # written, then recognised and replaced
        r = runner.invoke(app, args)
        assert r.exit_code == 0, _text(r)
        assert has_png_mark(png)
    # a write that fails half-way leaves the image there as it was (it was written in place: a cut
    # image that still passed for attnrank's, its mark coming first)
    import matplotlib.figure

    before = png.read_bytes()

    def cut_short(self, fname, **kw):
        Path(fname).write_bytes(before[:40])
        raise OSError("disk full")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", cut_short)
    r = runner.invoke(app, args)
    assert r.exit_code != 0 and png.read_bytes() == before and not list(tmp_path.glob(".heat.png.tmp-*"))


# -- eval ----------------------------------------------------------------------------------------


def test_eval_checks_metrics_rel_and_query_overlap(tmp_path):
    (tmp_path / "r.trec").write_text(RUN)
    (tmp_path / "qrels.tsv").write_text("q1\td1\t1\n")
    (tmp_path / "other.tsv").write_text("q7\td1\t1\n")
    for metrics, message in [
        ("bogus", "'bogus' is not a metric ir-measures computes here"),
        ("alpha_nDCG@10", "'alpha_nDCG@10' is not a metric"),
        ("nDCG@0", "'nDCG@0' is not a metric"),  # trec_eval would abort the process
        (",", "names no metric"),
        ("R(rel=3)@5,R@5", "sets rel itself; give the metric without it and the threshold as --rel 3"),
    ]:
        r = _cli("eval", "r.trec", "qrels.tsv", "--metrics", metrics, cwd=tmp_path)
        assert r.returncode == 2 and message in re.sub(r"[\s│╭╮╰╯─]+", " ", r.stderr), (metrics, r.stderr)
        assert "Traceback" not in r.stderr
    r = runner.invoke(app, ["eval", str(tmp_path / "r.trec"), str(tmp_path / "qrels.tsv"), "--rel", "0"])
    assert r.exit_code == 2 and "--rel 0 must be at least 1" in _text(r)
    r = runner.invoke(app, ["eval", str(tmp_path / "r.trec"), str(tmp_path / "other.tsv")])
    assert r.exit_code == 1 and "none of the 1 queries of" in _text(r)
    # binary qrels at --rel 2: every recall and RR read 0, exit 0, unsaid
    r = runner.invoke(app, ["eval", str(tmp_path / "r.trec"), str(tmp_path / "qrels.tsv"), "--rel", "2"])
    assert r.exit_code == 1 and "--rel 2 is above every label of the qrels (the highest is 1)" in _text(r), _text(r)
    r = runner.invoke(
        app, ["eval", str(tmp_path / "r.trec"), str(tmp_path / "qrels.tsv"), "--rel", "2", "--metrics", "nDCG@10"]
    )
    assert r.exit_code == 0 and r.output.startswith("nDCG@10\t"), _text(r)  # (graded: --rel reaches no metric)
    r = runner.invoke(
        app, ["eval", str(tmp_path / "r.trec"), str(tmp_path / "qrels.tsv"), "--rel", "2", "--metrics", "NumRelRet"]
    )
    assert r.exit_code == 1 and "--rel 2 is above every label" in _text(r), _text(r)  # (NumRelRet takes --rel)
    r = runner.invoke(app, ["eval", str(tmp_path / "r.trec"), str(tmp_path / "qrels.tsv"), "--metrics", "RR@10"])
    assert r.exit_code == 0 and r.output == "RR@10\t1.0000\n"
    # NumRelRet (trec_eval's num_rel_ret) reads in ir-measures as NumRet(rel=1): refused as "sets rel itself"
    r = runner.invoke(app, ["eval", str(tmp_path / "r.trec"), str(tmp_path / "qrels.tsv"), "--metrics", "NumRelRet"])
    assert r.exit_code == 0 and r.output == "NumRelRet\t1.0000\n", _text(r)
    (tmp_path / "more.tsv").write_text("q1\td1\t1\nq7\td1\t1\n")  # q7 judged, not ranked: it scores 0
    r = runner.invoke(app, ["eval", str(tmp_path / "r.trec"), str(tmp_path / "more.tsv"), "--metrics", "RR@10"])
    assert r.exit_code == 0 and r.stdout == "RR@10\t0.5000\n"
    assert "1 of the 2 judged queries (first: 'q7') have no ranking" in r.stderr
    # a run of another corpus (or ids spelled otherwise): every metric read 0, unsaid (said now; not
    # refused: a run that found no judged document scores 0 as well)
    (tmp_path / "elsewhere.tsv").write_text("q1\tdoc-d1\t1\n")
    r = runner.invoke(app, ["eval", str(tmp_path / "r.trec"), str(tmp_path / "elsewhere.tsv"), "--metrics", "RR@10"])
    assert r.exit_code == 0 and r.stdout == "RR@10\t0.0000\n"
    assert "no document" in r.stderr and "the qrels judge 'doc-d1' for 'q1'" in r.stderr
    # the run's queries the qrels do not judge: left out of every mean, unsaid
    extra = tmp_path / "extra.trec"
    extra.write_text((tmp_path / "r.trec").read_text() + "zz Q0 d1 1 9.0 x\n")
    r = runner.invoke(app, ["eval", str(extra), str(tmp_path / "qrels.tsv"), "--metrics", "RR@10"])
    assert r.exit_code == 0 and r.stdout == "RR@10\t1.0000\n"
    assert "1 of the run's 2 queries (first: 'zz') have no judgments in the qrels; they are left out" in r.stderr
    # a folder with no qrels in it: it "did not exist"
    r = runner.invoke(app, ["eval", str(tmp_path / "r.trec"), str(tmp_path)])
    assert r.exit_code == 1 and "is a folder with no qrels/test.tsv, dev.tsv or train.tsv" in _text(r)


# -- options checked before the model ------------------------------------------------------------


def test_heads_detect_reads_its_inputs_before_the_model(tmp_path, dl19_mini, no_model):
    half = tmp_path / "half.jsonl"
    lines = (dl19_mini / "passages.jsonl").read_text().splitlines()
    half.write_text("\n".join(lines[::2]) + "\n")
    base = ["heads", "detect", "--model", "tiny", "--qrels", str(dl19_mini / "qrels.txt"), "--no-save", "-q"]
    base += ["--queries", str(dl19_mini / "topics.tsv")]
    full = ["--corpus", str(dl19_mini / "passages.jsonl")]
    cases = [
        ([*full, "--max-queries", "-1"], "--max-queries -1 must be at least 0"),
        ([*full, "--rel", "0"], "--rel 0 must be at least 1"),
        (["--corpus", str(half), "--run", str(dl19_mini / "run.bm25.trec")], "of the run"),
        (["--corpus", str(tmp_path / "nope.jsonl")], "corpus path"),
        (["--method", "copy", "--lengths", "0"], "--lengths '0' must be token counts >= 1"),
        (["--method", "copy", "--data", str(tmp_path)], "holds no retrieval_head/needles.jsonl"),
        (["--top", "0"], "--top 0 must be at least 1"),
    ]
    for extra, message in cases:
        r = runner.invoke(app, [*base, *extra])
        assert r.exit_code in (1, 2) and message in _text(r), (extra, _text(r))


def test_ask_and_prune_options_checked_before_the_model(tmp_path, index_dir, dl19_mini, tiny_dir, no_model):
    ask = ["ask", "q", "--index-dir", str(index_dir)]
    prune = ["prune", "q", "--corpus", str(dl19_mini / "passages.jsonl"), "--budget-tokens", "9"]
    cases = [
        ([*ask, "--depth", "3", "-k", "10"], "-k 10 is more than --depth 3"),
        ([*ask, "--no-prune", "--budget-tokens", "50"], "--no-prune turns pruning off, but --budget-tokens"),
        ([*ask, "--no-prune", "--method", "focus"], "but --method configure(s) it"),
        ([*ask, "--no-rerank", "--preset", "icr", "--signals", "none"], "but --preset, --signals configure(s) it"),
        ([*ask, "--no-rerank", "--depth", "30"], "--no-rerank turns reranking off, but --depth configure(s) it"),
        # a switch named as typed (it was named --calibrate, which the user did not give)
        (
            [*ask, "--no-rerank", "--no-calibrate"],
            "--no-rerank turns reranking off, but --no-calibrate configure(s) it",
        ),
        ([*ask, "--prune-heads", "1"], "--prune-heads '1'"),
        ([*ask, "--heads", "1-x"], "--heads '1-x'"),
        # over the generator's context: failed at the answer, after retrieval, reranking and pruning
        ([*ask, "--max-new-tokens", "9000"], "--max-new-tokens 9000 leaves no room for the prompt in the 8192-token"),
        (["prune", "q", "--corpus", str(dl19_mini / "passages.jsonl"), "--budget-tokens", "9", "--heads", "x"], "'x'"),
        ([*prune, "--heads", "autox"], "'autox'"),  # was refused only once the model had loaded (exit 1)
        ([*ask, "--prune-heads", "auto-x"], "'auto-x'"),
        (["search", "q", "--index-dir", str(tmp_path / "none"), "--rerank", "2", "--heads", "a.json"], "a.json"),
        (
            [*ask, "--preset", "qrhead", "--reweight", "sink,slot"],
            "(--reweight slot) needs slot_profile= (--slot-profile)",
        ),
        (
            [*ask, "--preset", "icr", "--reweight", "slot", "--slot-profile", "p.json"],
            "slot_profile 'p.json' (--slot-profile) is not a file",
        ),
        # options no stage that runs reads (they were ignored, exit 0)
        ([*ask, "--slot-profile", "auto"], "(--slot-profile) is read only by slot correction, which is off"),
        # looked up after the model (and the index) had loaded
        (
            ["search", "q", "--index-dir", str(index_dir), "--rerank", "2", "--preset", "fused"]
            + ["--passage-states", str(tmp_path / "nope")],
            "holds no passage-state store",
        ),
        (
            [*ask, "--model", str(tiny_dir), "--preset", "icr", "--reweight", "slot", "--slot-profile", "auto"],
            "no calibrated-score slot profile is registered for model",
        ),
        ([*ask, "--preset", "icr", "--slot-profile", "auto"], "add reweight=Reweighting(slot_correction=True)"),
        ([*ask, "--preset", "icr", "--block-positions", "shared"], "--block-positions configure(s) block attention"),
        (
            [
                "search",
                "q",
                "--index-dir",
                str(index_dir),
                "--rerank",
                "2",
                "--preset",
                "qrhead",
                "--state-cache-mb",
                "8",
            ],
            "--state-cache-mb configure(s) block attention's passage states, which --preset qrhead",
        ),
        ([*prune, "--focus-hint", "So"], "--focus-hint is the answer hint of --method focus, not query"),
        ([*prune, "--block-positions", "shared"], "--block-positions configure(s) block attention's passage states"),
        ([*prune, "--method", "probe", "--token-filter"], "so --token-filter True would be ignored"),
        # signals only computes no attention: attention options would be ignored
        ([*ask, "--preset", "fused", "--signals", "only", "--heads", "all"], "--heads configure(s) attention, which "),
        ([*ask, "--signals", "likelihood", "--heads", "all"], "--heads configure(s) attention, which "),
        # the likelihood's shortlist where no likelihood is fused without attention
        ([*ask, "--preset", "signals", "--likelihood-depth", "5"], "likelihood_depth=5 shortlists candidates"),
        ([*ask, "--preset", "fused", "--likelihood-depth", "5"], "likelihood_depth=5 shortlists candidates"),
        ([*ask, "--likelihood-depth", "0"], "Invalid value for '--likelihood-depth'"),
        # a question that is not valid Unicode (undecodable bytes): a tokenizer's traceback after the model loaded
        (["ask", "capital \udcff", "--index-dir", str(index_dir), "--no-rerank"], "question #0"),
        (
            ["prune", "capital \udcff", "--corpus", str(dl19_mini / "passages.jsonl"), "--budget-tokens", "9"],
            "query #0",
        ),
    ]
    for args, message in cases:
        r = runner.invoke(app, args)
        assert r.exit_code in (1, 2) and message in _text(r), (args, _text(r))


def test_ask_without_reranking_sizes_its_first_stage_by_k(index_dir, monkeypatch):
    """--depth is refused with --no-rerank (above), so -k above its default 20 needs no --depth."""
    import attnrank.pipeline

    seen = {}

    def from_model(*args, **kwargs):
        seen.update(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr(attnrank.pipeline.Pipeline, "from_model", from_model)
    r = runner.invoke(app, ["ask", "q", "--index-dir", str(index_dir), "--no-rerank", "-k", "30", "-q"])
    assert r.exit_code == 0 and (seen["depth"], seen["top_k"]) == (30, 30), _text(r)
    r = runner.invoke(app, ["ask", "q", "--index-dir", str(index_dir), "-q"])
    assert r.exit_code == 0 and (seen["depth"], seen["top_k"]) == (20, 5), _text(r)


def test_heads_outside_the_model_are_refused_before_it_loads(tmp_path, index_dir, dl19_mini, tiny_dir, no_model):
    """The tiny model has 3 layers of 4 heads: 3-0 and 0-4 are outside it, read from its config."""
    model = ["--model", str(tiny_dir)]
    ask = ["ask", "q", "--index-dir", str(index_dir), *model]
    queries = tmp_path / "q.tsv"
    queries.write_text("q1\tvitamin\n", encoding="utf-8")
    cases = [
        [*ask, "--heads", "0-0,3-0"],
        [*ask, "--prune-heads", "0-4"],
        ["search", "q", "--index-dir", str(index_dir), "--rerank", "2", *model, "--heads", "3-0"],
        [
            "explain",
            "q",
            "--index-dir",
            str(index_dir),
            "--no-png",
            "-o",
            str(tmp_path / "x"),
            *model,
            "--heads",
            "3-0",
        ],
        [
            "batch",
            str(queries),
            "--index",
            str(index_dir),
            "-o",
            str(tmp_path / "b.trec"),
            "--rerank",
            "2",
            *model,
            "--heads",
            "3-0",
        ],
        ["serve", "--index-dir", str(index_dir), *model, "--heads", "3-0"],
    ]
    for args in cases:
        r = runner.invoke(app, args)
        # an option error, exit 2, from every command (prune, ask --prune-heads, explain, batch: exit 1 before)
        assert r.exit_code == 2 and "out of range: this model has 3 layers and 4 heads" in _text(r), (args, _text(r))
    r = runner.invoke(
        app,
        ["prune", "q", "--corpus", str(dl19_mini / "passages.jsonl"), "--budget-tokens", "9", *model, "--heads", "3-0"],
    )
    assert r.exit_code == 2 and "--heads '3-0'" in _text(r), _text(r)
    head_file = tmp_path / "heads.json"
    head_file.write_text('{"heads": ["2-3", "9-9"]}', encoding="utf-8")
    r = runner.invoke(app, [*ask, "--heads", str(head_file)])
    assert r.exit_code == 2 and "9-9" in _text(r) and str(head_file) in _text(r)  # an option error, as the others


def test_conflicting_index_options_are_refused(tmp_path, index_dir, scifact_mini):
    r = runner.invoke(app, ["search", "vitamin", "--index", "other", "--index-dir", str(index_dir), "-q"])
    assert r.exit_code == 2 and "not both" in _text(r)
    target = tmp_path / "ix"
    r = runner.invoke(app, ["index", str(scifact_mini), "--index-dir", str(target), "--ray-address", "local", "-q"])
    assert r.exit_code == 2 and "--ray-address runs a sharded build; add --shards N" in _text(r)
    assert not target.exists()
    for option, value, said in (
        ("--dense-index", "lsh", "'lsh'"),
        ("--stopwords", "french", "'french'"),
        ("--alpha", "1.5", "alpha=1.5 is outside [0, 1]"),
        ("--norm", "max", "'max'"),
    ):  # values the retriever checks: option errors too (exit 2, as the parser's own)
        r = runner.invoke(app, ["index", str(scifact_mini), "--index-dir", str(target), option, value, "-q"])
        assert r.exit_code == 2 and said in _text(r), (option, _text(r))
        assert not target.exists()


@pytest.mark.parametrize("model", ["/no/such/model", "no-such-org/no-such-model-in-the-cache"])
def test_heads_show_names_a_model_that_cannot_load(model, monkeypatch):
    """Before: a missing path reached the hub client as a repo id (a traceback), and an uncached
    hub id was fingerprinted by its name and listed as a model with no head sets."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = runner.invoke(app, ["heads", "show", "--model", model])
    assert r.exit_code == 1 and isinstance(r.exception, AttnrankError), r.output
    assert model in _text(r) and "Traceback" not in r.output


def test_a_missing_embedder_folder_is_named_not_taken_for_a_hub_id(tmp_path, scifact_mini):
    missing = tmp_path / "no-such-embedder"
    target = tmp_path / "ix"
    r = runner.invoke(app, ["index", str(scifact_mini), "--index-dir", str(target), "--embedder", str(missing), "-q"])
    assert r.exit_code == 1 and f"embedder {str(missing)!r}: no such local model folder" in _text(r)
    assert "repo id" not in _text(r).lower() and not (target / "dense").exists()


def test_demo_checks_its_options_before_indexing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["demo", "--no-rerank", "-q", "-k", "0"])
    assert r.exit_code == 2 and "-k 0 must be at least 1" in _text(r)
    r = runner.invoke(app, ["demo", "-q", "--depth", "0"])
    assert r.exit_code == 2 and "--depth 0 must be at least 1" in _text(r)
    r = runner.invoke(app, ["demo", "--no-rerank", "-q", "--depth", "30"])  # (ignored: the first stage's top -k)
    assert r.exit_code == 2 and "--no-rerank turns reranking off, but --depth configure(s) it" in _text(r)
    r = runner.invoke(app, ["demo", "--no-rerank", "-q", "--answers", "-1"])
    assert r.exit_code == 2 and "--answers -1 must be at least 0" in _text(r)
    # before: accepted and ignored (nothing answered, exit 0), or silently capped at the 8 questions
    r = runner.invoke(app, ["demo", "--no-rerank", "-q", "--answers", "3"])
    assert r.exit_code == 2 and "--answers 3 answers from reranked passages" in _text(r)
    r = runner.invoke(app, ["demo", "-q", "--answers", "9"])
    assert r.exit_code == 2 and "--answers 9: the demo has 8 questions" in _text(r)
    # a mistyped --model: named before the demo index is built (after it, before)
    for preset in ("likelihood", "signals"):  # (signals reranks without the model; its answers load it)
        r = runner.invoke(app, ["demo", "-q", "--preset", preset, "--model", str(tmp_path / "typo")])
        assert r.exit_code != 0 and "typo" in _text(r), _text(r)
    assert not (tmp_path / "indexes").exists()


def test_demo_never_replaces_another_index_saved_as_demo(tmp_path, monkeypatch):
    """The demo rebuilds indexes/demo on every run: a user's index of another corpus (or other files)
    saved there is refused before anything is built, and left as it was."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "indexes" / "demo"
    folder.mkdir(parents=True)
    manifest = folder / "manifest.json"
    manifest.write_text(json.dumps({"format": "attnrank-index", "corpus_sha256": "0" * 64}), encoding="utf-8")
    r = runner.invoke(app, ["demo", "--no-rerank", "-q"])
    assert r.exit_code == 2 and "holds an index of another corpus" in _text(r) and "ATTNRANK_INDEX_DIR" in _text(r)
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json"]
    manifest.unlink()
    (folder / "notes.txt").write_text("mine", encoding="utf-8")
    r = runner.invoke(app, ["demo", "--no-rerank", "-q"])
    assert r.exit_code == 2 and "files that are not the demo's index" in _text(r)
    assert (folder / "notes.txt").read_text(encoding="utf-8") == "mine"


def test_demo_replaces_its_own_index(tmp_path, monkeypatch):
    from attnrank.corpus import load_corpus
    from attnrank.demo import demo_corpus_path
    from attnrank.index.store import corpus_checksum

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "indexes" / "demo"
    folder.mkdir(parents=True)
    docs, _ = load_corpus(demo_corpus_path())
    old = {"format": "attnrank-index", "corpus_sha256": corpus_checksum(docs), "files": {}}
    (folder / "manifest.json").write_text(json.dumps(old), encoding="utf-8")
    r = runner.invoke(app, ["demo", "--no-rerank", "-q"])
    assert r.exit_code == 0, _text(r)
    assert json.loads((folder / "manifest.json").read_text(encoding="utf-8"))["num_docs"] == len(docs)


def test_sharded_index_build_honours_force_and_protects_the_corpus(tmp_path, scifact_mini):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.txt").write_text("Chapter 1.\n")
    args = ["index", str(scifact_mini), "--index-dir", str(mine), "--shards", "2", "-q"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 1 and "is not an attnrank index" in _text(r)
    assert (mine / "thesis.txt").exists()
    r = CliRunner().invoke(app, [*args, "--force"])
    assert r.exit_code == 0, _text(r)
    assert (mine / "manifest.json").exists() and not (mine / "thesis.txt").exists()
    r = CliRunner().invoke(
        app, ["index", str(scifact_mini), "--index-dir", str(scifact_mini), "--shards", "2", "--force"]
    )
    assert r.exit_code == 1 and "it is or contains the corpus" in _text(r)


def test_sharded_index_options_are_refused_before_the_corpus_is_read(tmp_path, monkeypatch):
    """--shards -1 and --shards with an HNSW index were refused by the sharded builder, after the
    whole corpus was read, with exit 1 and without naming the option."""
    import attnrank.cli.retrieval as retrieval

    def unread(*_):
        raise AssertionError("the corpus was read")

    monkeypatch.setattr(retrieval, "_read_corpus", unread)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"_id": "d1", "text": "apple"}\n')
    args = ["index", str(corpus), "--index-dir", str(tmp_path / "idx"), "-q"]
    r = CliRunner().invoke(app, [*args, "--shards", "-1"])
    assert r.exit_code == 2 and "--shards -1 must be at least 0" in _text(r), _text(r)
    r = CliRunner().invoke(app, [*args, "--shards", "2", "--dense-index", "hnsw"])
    assert r.exit_code == 2 and "--dense-index hnsw is not one a sharded build takes (flat, ivf)" in _text(r), _text(r)
    # the local Ray's CPUs (it took every CPU, one embedder per running task); a cluster's are its own
    r = CliRunner().invoke(app, [*args, "--shards", "2", "--ray-address", "auto", "--num-cpus", "2"])
    assert r.exit_code == 2 and "--num-cpus sizes the local Ray of --ray-address local" in _text(r), _text(r)
    r = CliRunner().invoke(app, [*args, "--shards", "2", "--ray-address", "local", "--num-cpus", "0"])
    assert r.exit_code == 2 and "--num-cpus 0 must be at least 1" in _text(r), _text(r)


# -- options that would be ignored ---------------------------------------------------------------


def test_a_model_that_cannot_load_is_named_before_the_index_loads_with_preset_signals(
    tmp_path, index_dir, dl19_mini, monkeypatch, no_model
):
    """Preset signals reads the model's registered weights (by its id and fingerprint), so a
    mistyped --model failed it too, but only after the index had loaded and searched (rerank: after
    the run and documents were read; preset likelihood there as well)."""
    from attnrank.index.retriever import HybridRetriever

    def loaded(*args, **kwargs):
        raise AssertionError("the index was loaded before the model was checked")

    monkeypatch.setattr(HybridRetriever, "load", loaded)
    bad = ["--model", "/no/such/model"]
    for args in (
        ["search", "cells", "--index-dir", str(index_dir), "--rerank", "3", "--preset", "signals", *bad],
        ["ask", "cells", "--index-dir", str(index_dir), "--preset", "signals", "--no-prune", *bad],
        *(
            ["rerank", "--run", str(dl19_mini / "run.bm25.trec"), "--queries", str(dl19_mini / "topics.tsv")]
            + ["--index-dir", str(index_dir), "-o", str(tmp_path / "o.trec"), *preset, *bad]
            for preset in (["--preset", "signals"], [])
        ),
    ):
        r = runner.invoke(app, args)
        assert r.exit_code != 0 and "model '/no/such/model': no such local model folder" in cli_text(r), (
            args,
            cli_text(r),
        )


def test_a_window_no_reranking_prompt_fits_is_an_option_error_before_the_index_loads(
    index_dir, tiny_dir, monkeypatch, no_model
):
    """search refused it (exit 1) only once the reranker was built, after the index had loaded and
    searched; prune refused its own such window as an option error first."""
    from attnrank.index.retriever import HybridRetriever

    def loaded(*args, **kwargs):
        raise AssertionError("the index was loaded before the window was checked")

    monkeypatch.setattr(HybridRetriever, "load", loaded)
    args = ["search", "cells", "--index-dir", str(index_dir), "--rerank", "3", "--preset", "icr"]
    r = runner.invoke(app, [*args, "--model", str(tiny_dir), "--max-prompt-tokens", "20"])
    assert r.exit_code == 2 and "--max-prompt-tokens 20 leaves no room for a passage" in cli_text(r), cli_text(r)


def test_reranker_options_without_reranking_are_refused(tmp_path, index_dir, scifact_mini, monkeypatch, no_model):
    """search and batch rerank only with --rerank K, demo only without --no-rerank: reranking options
    given without it were ignored (a first-stage run written, exit 0)."""
    out = tmp_path / "run.trec"
    args = ["search", "vitamin", "--index-dir", str(index_dir), "--preset", "icr", "--heads", "0-0", "-o", str(out)]
    r = runner.invoke(app, [*args, "-q"])
    assert r.exit_code == 2 and "--heads, --preset configure(s) the attention reranker" in _text(r)
    assert not out.exists()
    r = runner.invoke(
        app, ["batch", str(scifact_mini / "queries.jsonl"), "--index", str(index_dir), "-o", str(out), "--heads", "0-0"]
    )
    assert r.exit_code == 2 and "--heads configure(s) the attention reranker" in _text(r)
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["demo", "--no-rerank", "--preset", "icr", "-q"])
    assert r.exit_code == 2 and "--no-rerank turns reranking off, but --preset configure(s) it" in _text(r)
    r = runner.invoke(app, ["demo", "-k", "5", "--depth", "3", "-q"])
    assert r.exit_code == 2 and "-k 5 is more than --depth 3" in _text(r)
    assert not (tmp_path / "indexes").exists()


def test_learned_scorer_refuses_calibration_options_it_would_ignore(tmp_path, dl19_mini, no_model):
    base = ["rerank", "--run", str(dl19_mini / "run.bm25.trec"), "--queries", str(dl19_mini / "topics.tsv")]
    base += ["--corpus", str(dl19_mini / "passages.jsonl"), "-o", str(tmp_path / "o.trec"), "-q"]
    for extra, given in [
        (["--preset", "learned", "--no-calibrate"], "--no-calibrate"),
        (["--preset", "learned", "--token-filter"], "--token-filter"),
    ]:
        r = runner.invoke(app, [*base, *extra])
        assert r.exit_code == 2 and f"weights were trained with, so {given} would be ignored" in _text(r), _text(r)
    # the learned score took the place of the summed attention the fused weights were fitted to
    r = runner.invoke(app, [*base, "--preset", "fused", "--scorer", "learned"])
    assert r.exit_code == 2 and "scorer='learned' scores attention alone (preset learned)" in _text(r), _text(r)


def test_prompt_token_limits_are_rerank_options(tmp_path, dl19_mini, tiny_dir):
    base = ["rerank", "--run", str(dl19_mini / "run.bm25.trec"), "--queries", str(dl19_mini / "topics.tsv")]
    base += ["--corpus", str(dl19_mini / "passages.jsonl"), "-o", str(tmp_path / "o.trec"), "-q"]
    base += ["--preset", "qrhead", "--model", str(tiny_dir), "--depth", "4"]
    r = runner.invoke(app, [*base, "--max-doc-tokens", "0"])
    assert r.exit_code == 2 and "--max-doc-tokens" in _text(r)
    r = runner.invoke(app, [*base, "--max-prompt-tokens", "1000000"])  # an option error, before the corpus is read
    assert r.exit_code == 2 and "--max-prompt-tokens 1000000 exceeds the" in _text(r)
    prune = [
        "prune",
        "q?",
        "--corpus",
        str(tmp_path / "missing.jsonl"),
        "--budget-tokens",
        "5",
        "--model",
        str(tiny_dir),
    ]
    r = runner.invoke(app, [*prune, "--max-prompt-tokens", "1000000"])  # (exit 1 after the corpus was read)
    assert r.exit_code == 2 and "--max-prompt-tokens 1000000 exceeds the" in _text(r) and "missing" not in _text(r)
    r = runner.invoke(app, [*base, "--max-doc-tokens", "6", "--max-prompt-tokens", "240"])
    assert r.exit_code == 0, _text(r)
    assert (tmp_path / "o.trec").read_text().strip()


def test_pruning_options_that_would_be_ignored_are_refused(tmp_path, index_dir, dl19_mini, no_model):
    corpus = ["prune", "q", "--corpus", str(dl19_mini / "passages.jsonl"), "--budget-tokens", "9"]
    cases = [
        ([*corpus, "-k", "2"], "-k applies to --index hits; --corpus prunes all of its passages"),
        ([*corpus, "--verify"], "--verify applies to --index hits"),
        (
            ["prune", "q", "--index-dir", str(index_dir), "--budget-tokens", "9", "--skip-invalid"],
            "--skip-invalid applies to --corpus",
        ),
        ([*corpus, "--method", "probe", "--heads", "1-0"], "its probe was trained with, so --heads '1-0' would be"),
        (
            ["ask", "q", "--index-dir", str(index_dir), "--method", "probe", "--prune-heads", "all"],
            "so --prune-heads 'all' would be ignored",
        ),
    ]
    for args, message in cases:
        r = runner.invoke(app, args)
        assert r.exit_code == 2 and message in _text(r), (args, _text(r))


def test_head_and_fusion_training_refuse_inputs_they_would_ignore(tmp_path, index_dir, dl19_mini, no_model):
    """--dataset brings its own queries, qrels and corpus; --method copy reads none of the qr inputs;
    --skip-invalid reads a corpus file, which --dataset and an index replace."""
    needles = tmp_path / "niah" / "retrieval_head" / "needles.jsonl"
    needles.parent.mkdir(parents=True)
    needles.write_text('{"needle": "n", "question": "q?", "real_needle": "n"}\n')
    topics, corpus = str(dl19_mini / "topics.tsv"), str(dl19_mini / "passages.jsonl")
    qrels = str(dl19_mini / "qrels.txt")
    cases = [
        (
            ["heads", "detect", "--dataset", "dl19", "--data", str(tmp_path), "--queries", topics],
            "--dataset dl19 brings its own queries, qrels and corpus, so --queries would be ignored",
        ),
        (["train", "--dataset", "dl19", "--data", str(tmp_path), "--corpus", corpus], "so --corpus would be ignored"),
        (
            ["heads", "detect", "--method", "copy", "--data", str(tmp_path), "--queries", topics, "--rel", "2"],
            "--queries, --rel configure(s) --method qr, not copy",
        ),
        # no corpus file is read, so --skip-invalid would be ignored (exit 0)
        *(
            ([*cmd, "--dataset", "dl19", "--data", str(tmp_path), "--skip-invalid"], "--dataset dl19 brings its own")
            for cmd in (["train"], ["heads", "detect"], ["heads", "train"])
        ),
        (
            ["train", "--index-dir", str(index_dir), "--queries", topics, "--qrels", qrels, "--skip-invalid"],
            "--skip-invalid applies to --corpus; an index holds only valid records; drop it",
        ),
    ]
    for args, message in cases:
        r = runner.invoke(app, [*args, "-q"])
        assert r.exit_code == 2 and message in _text(r), (args, _text(r))


def test_search_refuses_ids_a_run_cannot_hold_before_reranking(tmp_path, no_model):
    """write_run refused them only after the search and the reranking had run."""
    from attnrank.index.retriever import HybridRetriever
    from attnrank.types import Document

    docs = [Document("my notes.md", "vitamin D and bones"), Document("b", "cats sleep")]
    ix = HybridRetriever().index(docs, show_progress=False).save(tmp_path / "ix")
    queries, out = tmp_path / "q.tsv", tmp_path / "run.trec"
    queries.write_text("q0\tbones\nq 1\tvitamin D\n")
    r = runner.invoke(app, ["search", "--queries", str(queries), "--index-dir", str(tmp_path / "no"), "-o", str(out)])
    assert r.exit_code == 1 and f"{queries}:2: query id 'q 1' holds whitespace" in _text(r)  # (named at its line)
    r = runner.invoke(app, ["search", "--queries", str(queries), "--index-dir", str(ix), "-q"])
    assert r.exit_code == 0, _text(r)  # (without -o no run holds the id: searched as given)
    queries.write_text("q1\tvitamin D\n")
    r = runner.invoke(
        app, ["search", "--queries", str(queries), "--index-dir", str(ix), "--rerank", "2", "-o", str(out), "-q"]
    )
    assert r.exit_code == 1 and "document id 'my notes.md' is empty or holds whitespace" in _text(r)
    assert "rename the document" in _text(r) and not out.exists()  # checked before the search, naming the fix
    # and `attnrank index` says so when it indexes them (a run could never name them)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "my notes.md").write_text("vitamin D and bones\n")
    (tmp_path / "notes" / "b.md").write_text("cats sleep\n")
    r = runner.invoke(app, ["index", str(tmp_path / "notes"), "--index-dir", str(tmp_path / "ix2"), "-q"])
    assert r.exit_code == 0 and "warning: 1 document id(s) hold whitespace (e.g. 'my notes.md')" in _text(r), _text(r)


def test_attention_options_on_a_preset_without_attention_are_refused_before_the_model(
    tmp_path, index_dir, scifact_mini, no_model
):
    """--preset signals computes no attention: --heads with it would be ignored. Refused, naming the
    option and the presets that read it, before any model or Ray starts."""
    out = tmp_path / "run.trec"
    search = ["search", "vitamin", "--index-dir", str(index_dir), "--rerank", "2", "--heads", "0-0", "-o", str(out)]
    r = runner.invoke(app, [*search, "--preset", "signals", "-q"])
    assert r.exit_code == 2 and "--heads configure(s) attention, which --preset signals" in _text(r), _text(r)
    assert "--preset fused" in _text(r)
    queries = str(scifact_mini / "queries.jsonl")
    batch = ["batch", queries, "--index", str(index_dir), "-o", str(out), "--rerank", "2", "--heads", "0-0"]
    r = runner.invoke(app, [*batch, "--preset", "signals"])
    assert r.exit_code == 2 and "--heads configure(s) attention, which --preset signals" in _text(r), _text(r)
    r = runner.invoke(app, [*search, "--signals", "only", "-q"])
    assert r.exit_code == 2 and "--heads configure(s) attention, which --signals only" in _text(r), _text(r)
    assert not out.exists()


def test_an_empty_search_query_is_refused_before_the_index_loads(tmp_path):
    r = runner.invoke(app, ["search", "  ", "--index-dir", str(tmp_path / "no-index"), "-q"])
    # a usage error (exit 2), as an empty QUERY of prune, ask and explain is (it exited 1)
    assert r.exit_code == 2 and "query #0 is empty" in _text(r) and "no-index" not in _text(r)


def test_prune_names_a_bad_attention_mode_before_the_corpus_loads(tmp_path):
    args = ["prune", "q?", "--corpus", str(tmp_path / "missing.jsonl"), "--keep-ratio", "0.5"]
    r = runner.invoke(app, [*args, "--attention", "foo", "-q"])
    assert r.exit_code != 0 and "attention='foo' is not one of" in _text(r) and "missing.jsonl" not in _text(r)


@pytest.mark.parametrize(
    "command",
    [
        ["train", "--dataset", "dl19"],
        ["heads", "train", "--dataset", "dl19"],
        ["heads", "detect", "--method", "qr", "--dataset", "dl19"],
    ],
)
@pytest.mark.parametrize(
    "precision, said",
    [(["--dtype", "fp16"], "dtype='fp16' is not one of"), (["--device", "cuda:x"], "device='cuda:x' is not one of")],
)
def test_training_and_detection_check_the_precision_before_reading_the_data(tmp_path, command, precision, said):
    """They were found by load_llm, after the labelled set had been read (and searched)."""
    r = runner.invoke(app, [*command, "--data", str(tmp_path / "no-such-data"), *precision])
    assert r.exit_code == 2 and said in cli_text(r), cli_text(r)


@pytest.mark.parametrize(
    "option, said",
    [
        (["--mode", "hybird"], "--mode 'hybird' is not one of"),
        (["--fusion", "sum"], "--fusion 'sum' is not one of"),
        (["--alpha", "1.5"], "alpha=1.5 is outside [0, 1]"),
        (["--norm", "max"], "norm 'max' is not one of"),
    ],
)
def test_search_checks_its_fusion_options_before_loading_the_index(tmp_path, option, said):
    """They were refused after the index had loaded (and, with --verify, been hashed whole)."""
    r = runner.invoke(app, ["search", "q", "--index-dir", str(tmp_path / "no-index"), *option])
    assert r.exit_code == 2 and said in cli_text(r), cli_text(r)


def test_the_probe_s_own_settings_spelt_out_are_accepted_as_the_config_accepts_them():
    """--method probe --no-token-filter was refused as an option the probe would ignore, though the
    probe scores unfiltered and PruneConfig(method="probe", token_filter=False) is accepted. Heads
    and a length normalisation, even the defaults, are still refused: the probe's own replace them."""
    import typer

    from attnrank.cli.prune_options import build_prune_config

    assert build_prune_config(method="probe", token_filter=False).token_filter is False
    for option in ({"token_filter": True}, {"heads": "all"}, {"length_norm": "sqrt"}):  # its heads, its norm
        with pytest.raises(typer.BadParameter, match="would be ignored"):
            build_prune_config(method="probe", **option)


def test_an_empty_model_or_embedder_name_is_refused_not_read_as_the_default(tmp_path, scifact_mini):
    """--model "" (an unset $MODEL) ran the packaged default, so train and heads detect saved under
    its name; --embedder "" was the working directory (Path("") is ".")."""
    for blank in ("", " "):
        r = runner.invoke(app, ["heads", "show", "--model", blank])
        assert r.exit_code == 1 and f"model {blank!r} is empty" in _text(r), r.output
        target = tmp_path / "ix"
        r = runner.invoke(app, ["index", str(scifact_mini), "--index-dir", str(target), "--embedder", blank, "-q"])
        assert r.exit_code == 1 and f"embedder {blank!r} is empty" in _text(r) and not target.exists()


def test_a_rerank_without_documents_names_corpus_too(tmp_path, dl19_mini):
    """rerank given neither --corpus nor an index was told to give an index, never --corpus."""
    base = ["rerank", "--run", str(dl19_mini / "run.bm25.trec"), "--queries", str(dl19_mini / "topics.tsv")]
    r = runner.invoke(app, [*base, "-o", str(tmp_path / "o.trec"), "-q"])
    assert r.exit_code == 2 and "--corpus PATH, or --index NAME / --index-dir DIR" in _text(r), _text(r)


@pytest.mark.parametrize(
    "command",
    [
        ["search", "q", "--index-dir", "ix"],
        ["rerank", "--queries", "q.tsv", "--run", "r.trec"],
        ["index", "c.jsonl", "--passage-states", "float16"],
        ["batch", "q.tsv", "--index-dir", "ix", "--rerank", "20"],
        ["serve", "--index-dir", "no-such-index"],  # (unfixed: refused for the index, not served)
    ],
)
def test_an_empty_preset_is_refused_not_read_as_the_default(command):
    """--preset "" (a shell variable left empty) ran the default preset with exit 0: the library
    reads "" as no preset."""
    r = runner.invoke(app, [*command, "--preset", " "])
    assert r.exit_code == 2 and "--preset is empty; give a preset's name" in _text(r), _text(r)


def test_a_folder_for_a_run_and_a_file_for_an_index_are_named_as_such(tmp_path):
    """`eval FOLDER qrels` said the run file did not exist; `serve --index-dir FILE` said the index
    folder did not exist."""
    (tmp_path / "qrels.tsv").write_text("q1\td1\t1\n")
    r = runner.invoke(app, ["eval", str(tmp_path), str(tmp_path / "qrels.tsv")])
    assert r.exit_code == 1 and "is a folder; give the run's file" in _text(r), _text(r)
    r = runner.invoke(app, ["serve", "--index-dir", str(tmp_path / "qrels.tsv")])
    assert r.exit_code == 2 and "qrels.tsv is a file; give the folder" in _text(r), _text(r)


def test_a_query_too_long_for_the_likelihood_is_refused_before_the_model_loads(
    tmp_path, dl19_mini, index_dir, no_model
):
    """The query likelihood's "the query is N tokens, too long" came after the model had loaded
    (rerank over a run, search --rerank): the tokenizer alone tells."""
    from _tiny import save_tiny

    small = save_tiny(tmp_path / "small", layers=2, max_positions=256)
    long = "word " * 300
    topics = tmp_path / "topics.tsv"
    lines = (dl19_mini / "topics.tsv").read_text().splitlines()
    first = lines[0].split("\t")[0]
    topics.write_text("\n".join([f"{first}\t{long}", *lines[1:]]) + "\n")
    args = ["--run", str(dl19_mini / "run.bm25.trec"), "--corpus", str(dl19_mini / "passages.jsonl")]
    r = runner.invoke(
        app, ["rerank", "--queries", str(topics), *args, "--model", str(small), "-o", str(tmp_path / "o")]
    )
    assert r.exit_code == 1 and f"query {first!r}: the query is" in _text(r) and "too long" in _text(r), _text(r)
    r = runner.invoke(app, ["search", long, "--index-dir", str(index_dir), "--rerank", "3", "--model", str(small)])
    assert r.exit_code == 1 and "query 'q1': the query is" in _text(r), _text(r)


def test_a_bad_record_names_the_option_to_skip_it_not_the_keyword(tmp_path):
    """The corpus reader's advice named the Python keyword first ("pass skip_invalid=True (CLI:
    --skip-invalid)"); on the command line it names the option alone."""
    (tmp_path / "c.jsonl").write_text('{"_id": "a", "text": "x"}\n{"_id": "b"}\n')
    (tmp_path / "c.csv").write_text("id,text\na,x,y\n")
    for corpus in ("c.jsonl", "c.csv"):
        done = _cli("index", corpus, "--index-dir", "ix", "-q", cwd=tmp_path)
        assert done.returncode == 1, done.stderr
        assert "pass --skip-invalid to skip such records" in done.stderr
        assert "skip_invalid=" not in done.stderr and "CLI:" not in done.stderr
    assert not (tmp_path / "ix").exists()
