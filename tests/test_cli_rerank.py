from __future__ import annotations

import json

from typer.testing import CliRunner

from attnrank.cli import app
from attnrank.eval import read_run, trec_order

runner = CliRunner()


def _assert_head_is_the_librarys(written, dl19_mini, depth, **options):
    """The head of each query of the ``written`` run is what :class:`AttentionReranker`, built from
    the configuration the same flags give, ranks of the run's top ``depth`` corpus documents (in
    run order): the same ids in the same order, with its scores (written with 6 decimals)."""
    import pytest

    from attnrank.cli.rerank_config import build_rerank_config
    from attnrank.corpus import load_corpus
    from attnrank.queries import load_queries
    from attnrank.rerank.attention import AttentionReranker

    reranker = AttentionReranker(config=build_rerank_config(**options))
    queries = load_queries(dl19_mini / "topics.tsv")
    docs = {d.id: d for d in load_corpus(dl19_mini / "passages.jsonl")[0]}
    first = read_run(dl19_mini / "run.bm25.trec")
    assert written.keys() == first.keys()
    for qid, ranking in first.items():
        head = [docs[d] for d, _ in trec_order(ranking)[:depth]]
        res = reranker.rank(queries[qid], head, query_id=qid)
        got = trec_order(written[qid])[:depth]
        assert [d for d, _ in got] == res.ids, qid
        assert [s for _, s in got] == pytest.approx(res.scores, abs=1e-6), qid


def test_rerank_run_file(tmp_path, dl19_mini, tiny_dir):
    out = tmp_path / "reranked.trec"
    r = runner.invoke(
        app,
        [
            "rerank",
            "--run",
            str(dl19_mini / "run.bm25.trec"),
            "--queries",
            str(dl19_mini / "topics.tsv"),
            "--corpus",
            str(dl19_mini / "passages.jsonl"),
            "--depth",
            "3",
            "--model",
            str(tiny_dir),
            "--heads",
            "1-0,2-3",
            "-o",
            str(out),
            "-q",
        ],
    )
    assert r.exit_code == 0, r.output
    first, again = read_run(dl19_mini / "run.bm25.trec"), read_run(out)
    assert again.keys() == first.keys()
    for qid, docs in first.items():
        ranked = sorted(again[qid], key=lambda d: -again[qid][d])
        by_first = sorted(docs, key=lambda d: -docs[d])
        assert set(ranked[:3]) == set(by_first[:3])  # the head is reordered among itself
        assert ranked[3:] == by_first[3:]  # the tail keeps its first-stage order
    # ... as the library ranks it, with its scores (not the first stage's, nor under other ids)
    _assert_head_is_the_librarys(again, dl19_mini, 3, heads="1-0,2-3", model=str(tiny_dir))


def test_rerank_reports_missing_documents(tmp_path, dl19_mini, tiny_dir):
    (tmp_path / "c.jsonl").write_text('{"id": "x", "text": "unrelated"}\n')
    r = runner.invoke(
        app,
        [
            "rerank",
            "--run",
            str(dl19_mini / "run.bm25.trec"),
            "--queries",
            str(dl19_mini / "topics.tsv"),
            "--corpus",
            str(tmp_path / "c.jsonl"),
            "--model",
            str(tiny_dir),
            "-o",
            str(tmp_path / "o"),
            "-q",
        ],
    )
    assert r.exit_code != 0 and "is not in the corpus/index" in str(r.exception)


def test_rerank_reads_tied_scores_in_trec_eval_order(tmp_path, dl19_mini, tiny_dir):
    """trec_eval ranks tied scores by doc id descending, whatever the rank column says; the first
    stage that rerank reads (which documents make --depth, and the tail's order) must be that one."""
    first = read_run(dl19_mini / "run.bm25.trec")
    qid, docs = next(iter(first.items()))
    low, high = sorted(docs)[:2]
    run = tmp_path / "tied.trec"  # the two documents tie at the top; the smaller id is listed first
    lines = [f"{qid} Q0 {low} 1 9.0 bm25", f"{qid} Q0 {high} 2 9.0 bm25"]
    lines += [f"{qid} Q0 {d} {i} {1.0 / i} bm25" for i, d in enumerate(sorted(set(docs) - {low, high}), start=3)]
    run.write_text("\n".join(lines) + "\n")
    out = tmp_path / "reranked.trec"
    args = ["rerank", "--run", str(run), "--queries", str(dl19_mini / "topics.tsv")]
    args += ["--corpus", str(dl19_mini / "passages.jsonl"), "--depth", "1", "--model", str(tiny_dir)]
    r = runner.invoke(app, [*args, "--heads", "1-0", "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    written = [line.split() for line in out.read_text().splitlines()]
    assert [w[2] for w in written[:2]] == [high, low]  # the one trec_eval ranks first heads the list
    assert [w[3] for w in written[:2]] == ["1", "2"]


def test_written_ranks_follow_trec_eval_on_ties(tmp_path):
    from attnrank.eval import evaluate, write_run

    path = tmp_path / "r.trec"
    write_run({"q": {"a": 1.0, "b": 1.0, "c": 0.5}}, path)
    assert [line.split()[2:4] for line in path.read_text().splitlines()] == [["b", "1"], ["a", "2"], ["c", "3"]]
    assert evaluate(read_run(path), {"q": {"b": 1}}, ["P@1"])["P@1"] == 1.0  # trec_eval agrees: b first


def test_rerank_skips_invalid_corpus_records_only_when_asked(tmp_path, dl19_mini, tiny_dir):
    """A bad record the run does not name fails the corpus unless --skip-invalid, which the error
    names (it once named an option only `index` had); skipped records are reported."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text((dl19_mini / "passages.jsonl").read_text() + '{"id": "empty", "text": ""}\n')
    args = ["rerank", "--run", str(dl19_mini / "run.bm25.trec"), "--queries", str(dl19_mini / "topics.tsv")]
    args += ["--corpus", str(corpus), "--model", str(tiny_dir), "--heads", "1-0", "--depth", "2"]
    r = runner.invoke(app, [*args, "-o", str(tmp_path / "a.trec"), "-q"])
    assert r.exit_code == 1 and "--skip-invalid" in str(r.exception) and not (tmp_path / "a.trec").exists()
    r = runner.invoke(app, [*args, "--skip-invalid", "-o", str(tmp_path / "b.trec"), "-q"])
    assert r.exit_code == 0, r.output
    assert "skipped 1 invalid record(s)" in r.output and "'empty' has empty text" in r.output
    assert read_run(tmp_path / "b.trec").keys() == read_run(dl19_mini / "run.bm25.trec").keys()


def test_a_value_the_configuration_refuses_is_an_option_error(tmp_path, dl19_mini):
    """--preset, --signals and --dtype values the configuration refuses exit 2 with the parser's
    usage hint, as the README says of option errors (they exited 1)."""
    args = ["rerank", "--run", str(dl19_mini / "run.bm25.trec"), "--queries", str(dl19_mini / "topics.tsv")]
    args += ["--corpus", str(dl19_mini / "passages.jsonl"), "-o", str(tmp_path / "o.trec")]
    for bad, said in (
        (["--preset", "bogus"], "bogus"),
        (["--signals", "bogus"], "signals='bogus'"),
        (["--dtype", "float99"], "dtype='float99'"),
        (["--preset", "bogus", "--heads", "all"], "bogus"),  # exited 1 beside --heads
        (["--heads", "99-0"], "--heads '99-0'"),  # a head the model lacks
        (["--heads", "1-0,zz"], "--heads '1-0,zz'"),
        (["--verify"], "--verify applies to an index"),  # (it was ignored with --corpus)
        # a preset the signals setting replaces whole: ranked and tagged as the other, icr never computed
        (
            ["--preset", "icr", "--signals", "likelihood"],
            "--preset icr with --signals likelihood ranks as preset likelihood",
        ),
        (["--preset", "signals", "--signals", "auto"], "give --preset fused (without --signals)"),
        (["--preset", "likelihood", "--signals", "none"], "ranks as preset qrhead, and reads nothing of likelihood"),
    ):
        r = runner.invoke(app, [*args, *bad])
        assert r.exit_code == 2 and said in r.output, (bad, r.output)
    assert not (tmp_path / "o.trec").exists()


def test_preset_likelihood_reads_the_passage_cut_and_refuses_attention_flags(tmp_path, dl19_mini, tiny_dir):
    """--preset likelihood runs the model for the query likelihood: --max-doc-words applies to
    its prompts; an attention flag would be ignored, so it is refused before the model loads."""
    args = ["rerank", "--run", str(dl19_mini / "run.bm25.trec"), "--queries", str(dl19_mini / "topics.tsv")]
    args += ["--corpus", str(dl19_mini / "passages.jsonl"), "--model", str(tiny_dir), "--preset", "likelihood"]
    r = runner.invoke(app, [*args, "--max-doc-words", "40", "--depth", "3", "-o", str(tmp_path / "o.trec"), "-q"])
    assert r.exit_code == 0, r.output
    first, run = read_run(dl19_mini / "run.bm25.trec"), read_run(tmp_path / "o.trec")
    assert run.keys() == first.keys()
    for qid, docs in first.items():
        ranked, by_first = sorted(run[qid], key=lambda d: -run[qid][d]), sorted(docs, key=lambda d: -docs[d])
        assert set(ranked[:3]) == set(by_first[:3]) and ranked[3:] == by_first[3:]
    _assert_head_is_the_librarys(run, dl19_mini, 3, preset="likelihood", max_doc_words=40, model=str(tiny_dir))
    r = runner.invoke(app, [*args, "--heads", "1-0", "-o", str(tmp_path / "h.trec")])
    assert r.exit_code == 2 and "--heads configure(s) attention" in r.output and not (tmp_path / "h.trec").exists()


def test_likelihood_depth_reaches_the_reranker(tmp_path, dl19_mini, tiny_dir):
    """--likelihood-depth N: the query likelihood scores the N candidates BM25 and dense rank
    highest, as the library's reranker configured so does (the run written is its ranking)."""
    args = ["rerank", "--run", str(dl19_mini / "run.bm25.trec"), "--queries", str(dl19_mini / "topics.tsv")]
    args += ["--corpus", str(dl19_mini / "passages.jsonl"), "--model", str(tiny_dir), "--depth", "4"]
    r = runner.invoke(app, [*args, "--likelihood-depth", "2", "-o", str(tmp_path / "o.trec"), "-q"])
    assert r.exit_code == 0, r.output
    run = read_run(tmp_path / "o.trec")
    _assert_head_is_the_librarys(run, dl19_mini, 4, likelihood_depth=2, model=str(tiny_dir))


def test_attention_flags_the_configuration_does_not_read_are_refused():
    """Before any model loads: --max-doc-words alone stays with the default (it reads it); an
    attention flag under a preset without attention is refused naming that preset, and naming
    the flag as typed; so is one given at its default value, which selects no preset (it ran the
    default likelihood, computing no attention, with exit 0), unless the command's pruner reads it too."""
    import pytest
    import typer

    from attnrank.cli.rerank_config import check_attention_computed

    check_attention_computed(None, {"max_doc_words": 40})
    for given, flag in (({"token_filter": True}, "--token-filter"), ({"heads": "auto-or-all"}, "--heads")):
        with pytest.raises(typer.BadParameter, match=f"{flag} configure.*--preset likelihood does not compute"):
            check_attention_computed(None, given)
    # one a command's pruner reads too: refused where none prunes (search, rerank), not in ask or
    # serve (ask --no-rerank --attention full configures the pruner)
    with pytest.raises(typer.BadParameter, match="--attention configure.*--preset likelihood does not compute"):
        check_attention_computed(None, {"attention": "full"})
    with pytest.raises(typer.BadParameter, match="--block-positions configure.*--preset signals"):
        check_attention_computed("signals", {"block_positions": "rotated"})
    from attnrank.cli.rerank_config import build_rerank_config

    # where a pruner reads them (ask, serve), the configuration gives them to it alone: accepted
    assert build_rerank_config(None, attention="full", pruner_reads=True).name == "likelihood"
    assert build_rerank_config("signals", block_positions="rotated", pruner_reads=True).name == "signals"
    with pytest.raises(typer.BadParameter, match="--no-calibrate configure.*--preset signals"):
        check_attention_computed("signals", {"calibrate": False})
    with pytest.raises(typer.BadParameter, match="--calibrate configure.*--preset signals"):
        check_attention_computed("signals", {"calibrate": True})  # (its default: accepted before)
    check_attention_computed(None, {"heads": "all"})  # selects fused: attention is computed
    with pytest.raises(typer.BadParameter, match="--heads configure.*--preset likelihood does not compute"):
        check_attention_computed("likelihood", {"heads": "all", "max_doc_words": 40})
    with pytest.raises(typer.BadParameter, match="--max-doc-words configure.*--preset signals"):
        check_attention_computed("signals", {"max_doc_words": 40})


def test_preset_picked_by_options_is_logged_under_verbose(tmp_path, dl19_mini, caplog):
    # the choice is logged while the options are read, before the command body: --verbose must
    # already hold then (the attnrank logger starts at WARNING here, as in a fresh process)
    import logging

    attnrank_logger = logging.getLogger("attnrank")
    before = attnrank_logger.level
    try:
        with caplog.at_level(logging.NOTSET):
            attnrank_logger.setLevel(logging.WARNING)  # (at_level sets the root's level only)
            r = runner.invoke(
                app,
                [
                    "rerank",
                    "--run",
                    str(tmp_path / "missing.trec"),
                    "--queries",
                    str(dl19_mini / "topics.tsv"),
                    "--corpus",
                    str(dl19_mini / "passages.jsonl"),
                    "--no-calibrate",
                    "-o",
                    str(tmp_path / "o"),
                    "--verbose",
                ],
            )
    finally:
        attnrank_logger.setLevel(before)
    assert r.exit_code != 0  # the run file is missing: nothing loads
    assert any("without a preset" in rec.getMessage() for rec in caplog.records), caplog.text


def test_rerank_needs_the_text_of_the_reranked_head_only(tmp_path, dl19_mini, tiny_dir):
    """Documents below --depth keep their place by id and score: a corpus without them was refused
    (a run from a larger collection could not be reranked over the passages it reranks)."""
    first = read_run(dl19_mini / "run.bm25.trec")
    heads = {d for ranking in first.values() for d, _ in trec_order(ranking)[:3]}
    corpus = tmp_path / "head.jsonl"
    with (dl19_mini / "passages.jsonl").open(encoding="utf-8") as lines:
        kept = [line for line in lines if json.loads(line)["_id"] in heads]
    corpus.write_text("".join(kept), encoding="utf-8")
    assert 0 < len(kept) < sum(len(r) for r in first.values())
    args = ["rerank", "--run", str(dl19_mini / "run.bm25.trec"), "--queries", str(dl19_mini / "topics.tsv")]
    args += ["--corpus", str(corpus), "--model", str(tiny_dir), "--heads", "1-0,2-3", "-q"]
    out = tmp_path / "reranked.trec"
    r = runner.invoke(app, [*args, "--depth", "3", "-o", str(out)])
    assert r.exit_code == 0, r.output
    again = read_run(out)
    for qid, docs in first.items():  # every document written, the tail in its first-stage order
        assert set(again[qid]) == set(docs)
        ranked = [d for d, _ in trec_order(again[qid])]
        assert ranked[3:] == [d for d, _ in trec_order(docs)][3:]
    r = runner.invoke(app, [*args, "--depth", "4", "-o", str(tmp_path / "deeper.trec")])
    assert r.exit_code != 0 and "is not in the corpus/index" in str(r.exception)


def test_every_query_of_the_run_is_checked_before_the_first_is_reranked(tmp_path, tiny_dir):
    """A query the reranker refuses (here the calibration query, under calibrated attention) was
    found when its turn came, after the queries before it were reranked, and all of that work was
    lost (nothing is written): it is named, by its id, before any."""
    from _cli import cli_text

    (tmp_path / "c.jsonl").write_text('{"id": "d1", "text": "apples are red"}\n{"id": "d2", "text": "pears"}\n')
    (tmp_path / "q.tsv").write_text("q1\tred apples\nq2\tN/A\n")
    (tmp_path / "r.trec").write_text("".join(f"{q} Q0 d{i} {i} {3 - i}.0 t\n" for q in ("q1", "q2") for i in (1, 2)))
    args = ["rerank", "--run", str(tmp_path / "r.trec"), "--queries", str(tmp_path / "q.tsv")]
    args += ["--corpus", str(tmp_path / "c.jsonl"), "-o", str(tmp_path / "o.trec"), "--preset", "icr"]
    r = runner.invoke(app, [*args, "--model", str(tiny_dir), "-q"])
    said = cli_text(r)
    assert r.exit_code != 0 and "query 'q2': query 'N/A' is the calibration query" in said, said
    assert not (tmp_path / "o.trec").exists()


def test_every_reranker_setting_has_an_option_and_order_and_query_span_reach_it(tmp_path, dl19_mini, monkeypatch):
    """RerankConfig's order and query_span had no option in rerank, search --rerank, ask or demo:
    a setup with order='forward' made in Python could not be reproduced from the command line."""
    import dataclasses

    from attnrank.cli.options import _OPTIONS
    from attnrank.rerank.attention import AttentionReranker
    from attnrank.rerank.config import RerankConfig

    assert {f.name for f in dataclasses.fields(RerankConfig)} - {"name"} <= set(_OPTIONS)
    seen = []

    class Stop(Exception):
        pass

    def capture(self, *args, config=None, **kwargs):
        seen.append(config)
        raise Stop

    monkeypatch.setattr(AttentionReranker, "__init__", capture)
    args = ["rerank", "--run", str(dl19_mini / "run.bm25.trec"), "--queries", str(dl19_mini / "topics.tsv")]
    args += ["--corpus", str(dl19_mini / "passages.jsonl"), "-o", str(tmp_path / "o.trec"), "-q"]
    r = runner.invoke(app, [*args, "--preset", "icr", "--order", "forward", "--query-span", "last"])
    assert isinstance(r.exception, Stop), r.output
    assert (seen[0].name, seen[0].order, seen[0].query_span) == ("icr", "forward", "last")
    r = runner.invoke(app, [*args, "--preset", "icr", "--order", "sideways"])
    assert r.exit_code == 2 and "order='sideways' is not one of" in " ".join(r.output.split())


def test_a_family_without_sdpa_reranks_under_the_default_and_an_attention_preset(tmp_path, dl19_mini):
    """Gemma 2 (soft-capped attention logits, no SDPA in transformers) could not be loaded at all."""
    import pytest
    from _tiny import save_tiny

    model = str(
        save_tiny(tmp_path / "gemma2", "Gemma2", max_positions=4096, sliding_window=4096, query_pre_attn_scalar=8)
    )
    args = ["rerank", "--run", str(dl19_mini / "run.bm25.trec"), "--queries", str(dl19_mini / "topics.tsv")]
    args += ["--corpus", str(dl19_mini / "passages.jsonl"), "--depth", "3", "--model", model, "-q"]
    for preset in ("likelihood", "icr"):
        out = tmp_path / f"{preset}.trec"
        r = runner.invoke(app, [*args, "--preset", preset, "-o", str(out)])
        assert r.exit_code == 0, (preset, r.output)
        _assert_head_is_the_librarys(read_run(out), dl19_mini, 3, preset=preset, model=model)
    with pytest.raises(AssertionError):  # (the check can fail: another preset ranks otherwise)
        _assert_head_is_the_librarys(read_run(tmp_path / "icr.trec"), dl19_mini, 3, preset="likelihood", model=model)


def test_a_presets_own_signals_spelled_out_beside_other_options_is_not_refused():
    """--preset qrhead --signals none --heads all was refused as "ranks as preset icr ... drop
    --signals", though none is qrhead's own setting and the command without it is accepted."""
    from attnrank.cli.rerank_config import build_rerank_config

    for preset, extra, name in (
        ("qrhead", {"heads": "all"}, "icr"),
        ("qrhead", {"reweight": "sink"}, "qrhead-sink"),
        ("learned", {"scorer": "sum"}, "icr"),
    ):
        assert build_rerank_config(preset, signals="none", **extra).name == name
        assert build_rerank_config(preset, **extra).name == name
