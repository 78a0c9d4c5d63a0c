"""``attnrank train`` (both presets) on a tiny random model and the DL19 slice (3 topics, BM25 top-20 run)."""

from __future__ import annotations

import re

import pytest
from _cli import cli_text
from typer.testing import CliRunner

from attnrank.cli import app

runner = CliRunner()


def _args(dl, tiny_dir, *extra, preset: str | None = "fused"):
    """train's arguments on the slice; preset None: train's default."""
    heads = ["--heads", "all"] if preset == "fused" else []
    return [
        "train",
        *(["--preset", preset] if preset else []),
        "--queries",
        str(dl / "topics.tsv"),
        "--qrels",
        str(dl / "qrels.txt"),
        "--corpus",
        str(dl / "passages.jsonl"),
        "--run",
        str(dl / "run.bm25.trec"),
        "--depth",
        "6",
        "--model",
        str(tiny_dir),
        *heads,
        "-q",
        *extra,
    ]


def test_train_reports_heldout_and_registers_fused_weights(home, dl19_mini, tiny_dir):
    from attnrank.llm.fingerprint import model_fingerprint
    from attnrank.rerank.attention import AttentionReranker
    from attnrank.rerank.config import RerankConfig
    from attnrank.rerank.fused import FusedWeights

    r = runner.invoke(app, _args(dl19_mini, tiny_dir, "--folds", "3", "--rel", "2"))
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert "held-out 3-fold over 3 queries" in r.output
    assert "Few labelled queries (3 < 80): the report is noisy" in r.output
    # fused has no register-unless-worse rule: the caveat no longer describes the likelihood preset's
    assert "Preset fused registers its trained weights whatever this report shows" in r.output
    assert "what the rule of preset likelihood registered" not in r.output
    rows = dict(
        re.findall(r"^\| (fused with attention|fused without attention|rank alone) \| ([0-9.]+) \|", r.output, re.M)
    )
    assert set(rows) == {"fused with attention", "fused without attention", "rank alone"}
    assert all(0 <= float(v) <= 1 for v in rows.values())
    assert "saved to" in r.output and str(home) in r.output
    equal = re.search(r"^\| equal weights, no attention \(untrained\) \| ([0-9.]+) \|", r.output, re.M)
    assert equal is not None  # the default the registered weights replace, scored on the same folds
    base, held = float(rows["fused without attention"]), float(equal.group(1))
    if base < held:  # preset signals keeps the rule of --preset signals: never below equal weights
        assert f"make preset signals use equal weights (held out {held:.4f}; " in r.output
        assert f"without attention scored {base:.4f}, below them" in r.output
    else:
        assert f"current equal weights (equal weights: held out {held:.4f})" in r.output
        assert f"without attention ({base:.4f})" in r.output
    w = FusedWeights.load(*model_fingerprint(str(tiny_dir)))
    assert w.features == ["attention", "bm25", "dense", "rank"] and len(w.weights) == 4
    assert w.heads == "all" and w.capture == "block:shared"  # the attention preset fused reads, as it captures it
    assert w.prompt == RerankConfig.preset("fused").prompt_settings()  # the prompt that attention was read from
    assert w.metrics["n_queries"] == 3 and w.metrics["seed"] == 0  # (the report can be matched and run again)
    assert w.metrics["heldout"]["fused with attention"]["nDCG@10"] == pytest.approx(
        float(rows["fused with attention"]), abs=1e-4
    )
    rr = AttentionReranker(str(tiny_dir), None, signals="auto")  # the registered weights are what it uses
    assert rr.fused is not None and rr.fused.weights == pytest.approx(w.weights)
    again = runner.invoke(app, _args(dl19_mini, tiny_dir, "--folds", "3", "--rel", "2", "--no-save"))
    assert again.exit_code == 0, again.output
    if base < held:
        from attnrank.rerank.fused import UNTRAINED
        from attnrank.rerank.fused_resolve import signals_only

        assert signals_only(*model_fingerprint(str(tiny_dir))).trained_on == UNTRAINED
    else:
        assert "current registered weights (trained on" in again.output  # not "equal" now


def test_train_reads_the_heads_the_registered_weights_were_fitted_to(home, dl19_mini, tiny_dir):
    """Under the default heads, train fits preset fused's attention: the heads its current weights
    for the model read; heads given win."""
    from attnrank.llm.fingerprint import model_fingerprint
    from attnrank.rerank.fused import FusedWeights

    key = model_fingerprint(str(tiny_dir))
    FusedWeights(["attention", "dense"], [1.0, 1.0], heads=["1-2", "0-1"], capture="block:shared").save(*key)
    args = [a for a in _args(dl19_mini, tiny_dir, "--folds", "3", "--rel", "2") if a not in ("--heads", "all")]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert "attention: 2 heads of" in r.output
    # heads chosen before the folds (perhaps on these queries): the report says what is held out
    assert "The heads (auto-or-all) were chosen before these folds" in " ".join(r.output.split())
    assert FusedWeights.load(*key).heads == ["0-1", "1-2"]
    r = runner.invoke(app, [*args, "--heads", "1-3"])
    assert r.exit_code == 0 and FusedWeights.load(*key).heads == ["1-3"]
    assert "were chosen before these folds" not in r.output  # given: nothing chose them on these queries


def test_train_refuses_bad_options_before_loading_a_model(home, dl19_mini, tiny_dir, monkeypatch):
    from attnrank.llm import models

    loads: list[object] = []
    monkeypatch.setattr(models, "_load_cached", lambda *a: loads.append(a))
    r = runner.invoke(app, _args(dl19_mini, tiny_dir, "--learner", "lambdamart"))
    assert r.exit_code != 0 and "--learner 'lambdamart'" in r.output
    r = runner.invoke(app, _args(dl19_mini, tiny_dir, "--folds", "9"))
    assert r.exit_code != 0 and "fewer than --folds 9" in r.output
    r = runner.invoke(app, _args(dl19_mini, tiny_dir, "--learner", "listwise", "--l2", "5"))  # was ignored
    assert r.exit_code == 2 and "--l2 5.0 is not read by --learner listwise" in " ".join(r.output.split())
    # preset signals runs no LLM, but its embedder runs where and as --device/--dtype say: checked too
    r = runner.invoke(app, _args(dl19_mini, tiny_dir, "--dtype", "float99", preset="signals"))
    assert r.exit_code == 2 and "float99" in cli_text(r), cli_text(r)
    assert not home.exists()
    args = [a for a in _args(dl19_mini, tiny_dir, "--folds", "3", "--rel", "2") if a not in ("--heads", "all")]
    r = runner.invoke(app, [*args, "--heads", "auto:contrastive"])  # none registered: was found after the load
    assert r.exit_code == 1 and "no 'contrastive' head set is registered" in str(r.exception)
    assert loads == []


def _likelihood_rows(output: str) -> tuple[float, float]:
    rows = dict(re.findall(r"^\| ([a-z0-9 ,()]+?) \| ([0-9.]+) \|", output, re.M))
    assert {"likelihood alone", "fused with likelihood", "equal weights with likelihood (untrained)"} <= set(rows)
    return float(rows["fused with likelihood"]), float(rows["equal weights with likelihood (untrained)"])


def test_train_likelihood_registers_weights_the_default_preset_reads(home, dl19_mini, tiny_dir, caplog):
    """Without --preset, train fits the default preset's weights (BM25, dense, rank, likelihood);
    on these queries they beat the untrained equal weights held out, so they are registered and
    the default reranker scores by them."""
    from attnrank.llm.fingerprint import model_fingerprint
    from attnrank.rerank.attention import AttentionReranker
    from attnrank.rerank.fused import LikelihoodWeights

    key = model_fingerprint(str(tiny_dir))
    args = _args(dl19_mini, tiny_dir, "--folds", "3", "--rel", "2", preset=None)
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert "held-out 3-fold over 3 queries" in r.output and "query likelihood of" in r.output
    trained, untrained = _likelihood_rows(r.output)
    assert trained >= untrained and "saved to" in r.output
    assert f"current equal weights of preset likelihood (equal weights: held out {untrained:.4f})" in r.output
    w = LikelihoodWeights.load(*key)
    assert w.features == ["bm25", "dense", "rank", "likelihood"] and w.heads is None
    assert w.metrics["heldout"]["fused with likelihood"]["nDCG@10"] == pytest.approx(trained, abs=1e-4)
    rr = AttentionReranker(str(tiny_dir))  # the default preset now reads them
    assert rr.config.name == "likelihood" and rr.fused is not None and rr.fused.weights == pytest.approx(w.weights)
    assert w.max_doc_words == 300 and "fitted to passages cut to" not in caplog.text
    AttentionReranker(rr.llm, max_doc_words=150)  # read from other cuts than fitted to: still scores, warned
    assert "fitted to passages cut to 300 words; this reranker cuts them to 150" in caplog.text
    # a token cut changes the likelihood too: it was not recorded, and weights applied under one were not warned of
    caplog.clear()
    AttentionReranker(rr.llm, max_doc_tokens=8)
    assert "fitted to passages cut to 300 words; this reranker cuts them to 300 words and 8 tokens" in caplog.text
    again = runner.invoke(app, [*args, "--no-save"])
    assert again.exit_code == 0 and "current registered weights (trained on topics.tsv" in again.output


def test_train_likelihood_registers_nothing_that_scored_below_the_equal_weights(home, dl19_mini, tiny_dir):
    """--learner equal puts weight 1 on the first-stage rank too; on these queries that scores below
    the untrained equal weights held out, so nothing is registered and the default is unchanged."""
    from attnrank.llm.fingerprint import model_fingerprint
    from attnrank.registry import load_artifact
    from attnrank.rerank.fused import LikelihoodWeights

    r = runner.invoke(
        app, _args(dl19_mini, tiny_dir, "--folds", "3", "--rel", "2", "--learner", "equal", preset="likelihood")
    )
    assert r.exit_code == 0, r.output + repr(r.exception)
    trained, untrained = _likelihood_rows(r.output)
    assert trained < untrained and "Not registered" in r.output and "saved to" not in r.output
    assert "Few labelled queries (3 < 80): the report is noisy." in r.output
    # (the rule read these same held-out figures to choose: the report says so, whatever the query count)
    assert "The choice between trained and equal weights was made on these same held-out figures" in r.output
    assert load_artifact(LikelihoodWeights.KIND, *model_fingerprint(str(tiny_dir))) is None


def test_train_names_registered_weights_that_do_not_load_and_replaces_them(home, dl19_mini, tiny_dir):
    """Registered likelihood weights that no longer load (here: edited to read attention) are named
    in the report, not raised after the scoring, and training replaces them."""
    import json

    from attnrank.llm.fingerprint import model_fingerprint
    from attnrank.rerank.fused import LikelihoodWeights

    key = model_fingerprint(str(tiny_dir))
    path = LikelihoodWeights(["bm25", "likelihood"], [1.0, 1.0]).save(*key)
    doc = json.loads(path.read_text())
    doc["artifacts"][LikelihoodWeights.KIND]["payload"]["features"] = ["attention", "likelihood"]
    path.write_text(json.dumps(doc))
    r = runner.invoke(app, _args(dl19_mini, tiny_dir, "--folds", "3", "--rel", "2", preset="likelihood"))
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert "current registered weights, which do not load (query-likelihood weights over" in r.output
    assert LikelihoodWeights.load(*key).features == ["bm25", "dense", "rank", "likelihood"]


def test_train_signals_fits_the_fast_presets_weights_without_the_model(home, scifact_mini, tiny_dir, monkeypatch):
    """--preset signals trains BM25, dense and rank and never loads the LLM (the model only names
    the registry entry); the preset signals then reads those weights, before the model without
    attention of fused weights registered later."""
    import attnrank.llm.models
    import attnrank.rerank.attention
    from attnrank.llm.fingerprint import model_fingerprint
    from attnrank.rerank.fused import FusedWeights, SignalsWeights
    from attnrank.rerank.fused_resolve import signals_only

    def loaded(*args, **kwargs):
        raise AssertionError("the LLM was loaded")

    sf = scifact_mini
    args = ["train", "--preset", "signals", "--queries", str(sf / "queries.jsonl")]
    args += ["--qrels", str(sf / "qrels/train.tsv"), "--corpus", str(sf / "corpus.jsonl")]
    args += ["--depth", "6", "--folds", "3", "--model", str(tiny_dir), "-q"]
    with monkeypatch.context() as no_llm:  # only here: the home fixture's setting stays
        no_llm.setattr(attnrank.llm.models, "load_llm", loaded)
        no_llm.setattr(attnrank.rerank.attention, "load_llm", loaded)
        r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert "first-stage signals only (no LLM run" in r.output and "likelihood alone" not in r.output
    assert "saved to" in r.output, r.output  # on these 12 queries the trained weights are not below equal ones
    key = model_fingerprint(str(tiny_dir))
    w = SignalsWeights.load(*key)
    assert w.features == ["bm25", "dense", "rank"] and w.max_doc_words is None
    FusedWeights(["attention", "bm25", "dense"], [1.0, 2.0, 3.0], base_weights=[2.0, 3.0]).save(*key)
    assert signals_only(*key).weights == w.weights
    # fused training reads attention; its report says preset signals keeps its own weights, even
    # ones that no longer load (they are another kind: fused weights never replace them)
    import json

    from attnrank.errors import InputError

    path = SignalsWeights(["bm25"], [1.0]).save(*key)
    doc = json.loads(path.read_text())
    doc["artifacts"][SignalsWeights.KIND]["payload"]["features"] = ["attention"]  # edited: no longer loads
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError):
        SignalsWeights.load(*key)
    fused = [*args[:2], "fused", "--heads", "all", *args[3:], "--no-save"]
    r = runner.invoke(app, fused)
    assert r.exit_code == 0 and "leave preset signals its own registered weights" in r.output, r.output


def test_train_takes_the_candidates_from_an_index_as_search_reranks_them(home, scifact_mini, tiny_dir, tmp_path):
    """--index-dir: the index's own search gives the candidates and their documents, the same
    report as a run of that search with the corpus; beside a --run, the run gives the candidates
    and the index their texts (as rerank reads them; it was refused); a corpus beside it is refused."""
    from attnrank import load_corpus
    from attnrank.eval import write_run
    from attnrank.index.retriever import HybridRetriever

    sf = scifact_mini
    index = HybridRetriever().index(load_corpus(sf)[0], show_progress=False).save(tmp_path / "ix")
    labelled = ["train", "--preset", "signals", "--queries", str(sf / "queries.jsonl")]
    labelled += ["--qrels", str(sf / "qrels/train.tsv"), "--depth", "6", "--folds", "3", "--model", str(tiny_dir)]
    labelled += ["--dtype", "float32"]  # (its embedder's precision: refused as an LLM option before)
    r = runner.invoke(app, [*labelled, "--index-dir", str(index), "--no-save", "-q"])
    assert r.exit_code == 0, r.output + repr(r.exception)
    from attnrank import load_queries

    run = tmp_path / "hits.trec"
    write_run(HybridRetriever.load(index).search_batch(load_queries(sf / "queries.jsonl"), 6), run)
    same = runner.invoke(app, [*labelled, "--run", str(run), "--corpus", str(sf / "corpus.jsonl"), "--no-save", "-q"])
    assert same.exit_code == 0 and same.output.split("\n")[1:] == r.output.split("\n")[1:], same.output
    both = runner.invoke(app, [*labelled, "--index-dir", str(index), "--run", str(run), "--no-save", "-q"])
    assert both.exit_code == 0 and both.output.split("\n")[1:] == same.output.split("\n")[1:], both.output
    bad = runner.invoke(app, [*labelled, "--index-dir", str(index), "--corpus", str(sf / "corpus.jsonl")])
    said = " ".join(re.sub("[│╭╮╰╯─]", " ", bad.output).split())  # the error box, unwrapped
    assert bad.exit_code == 2 and "so --corpus would be ignored" in said, said


def test_train_likelihood_refuses_attention_options_before_loading_a_model(home, dl19_mini, tiny_dir):
    for extra, named in ((["--heads", "all"], "--heads"), (["--no-gate"], "--gate/--no-gate")):
        r = runner.invoke(app, _args(dl19_mini, tiny_dir, *extra, preset="likelihood"))
        assert r.exit_code == 2 and f"{named} configure(s) attention" in r.output, r.output
    r = runner.invoke(app, _args(dl19_mini, tiny_dir, "--max-doc-words", "150", preset="signals"))
    said = " ".join(re.sub("[│╭╮╰╯─]", " ", r.output).split())  # the error box, unwrapped
    assert r.exit_code == 2 and "which --preset signals does not run" in said, said
    r = runner.invoke(app, _args(dl19_mini, tiny_dir, preset="qrhead"))
    assert r.exit_code == 2 and "--preset 'qrhead' is not one of likelihood, signals, fused" in r.output
    assert not home.exists()


def test_train_refuses_candidates_that_cannot_tell_weights_apart(home, dl19_mini, tiny_dir, tmp_path):
    """A run that never retrieves a relevant document scores every method 0 in every fold: the tie
    would register whatever was fitted. Refused before any model is loaded, naming the fix."""
    from attnrank.eval import read_qrels

    qrels = read_qrels(dl19_mini / "qrels.txt")
    lines = (dl19_mini / "run.bm25.trec").read_text().splitlines()
    kept = [line for line in lines if qrels.get(line.split()[0], {}).get(line.split()[2], 0) < 2]
    run = tmp_path / "no-relevant.trec"
    run.write_text("\n".join(kept) + "\n")
    args = _args(dl19_mini, tiny_dir, "--folds", "3", "--rel", "2", preset="signals")
    args[args.index("--run") + 1] = str(run)
    r = runner.invoke(app, args)
    out = " ".join(re.sub("[│╭╮╰╯─]", " ", r.output).split())
    assert r.exit_code != 0, out
    assert "0 of 3 labelled queries have both a relevant and a non-relevant document among their top-6" in out
    assert "raise --depth" in out and not home.exists()


def test_train_refuses_an_unreadable_registry_file_before_the_scoring(home, dl19_mini, tiny_dir):
    """Saving would refuse the file after the whole scoring; train checks it first (--no-save runs)."""
    from attnrank import registry
    from attnrank.llm.fingerprint import model_fingerprint

    path = registry.user_file(*model_fingerprint(str(tiny_dir)), None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    r = runner.invoke(app, _args(dl19_mini, tiny_dir, "--folds", "3", "--rel", "2", preset="signals"))
    out = " ".join(re.sub("[│╭╮╰╯─]", " ", cli_text(r)).split())
    assert r.exit_code == 1 and "move it away" in out and "--no-save" in out, out  # (a file's fault: it was 2)
    assert "held-out" not in out and path.read_text() == "{not json"
    r = runner.invoke(app, _args(dl19_mini, tiny_dir, "--folds", "3", "--rel", "2", "--no-save", preset="signals"))
    assert r.exit_code == 0 and "held-out 3-fold" in r.output, r.output


def test_train_fused_replaces_registered_weights_that_do_not_load(home, dl19_mini, tiny_dir):
    """Their error says to retrain with --preset fused, so that command must get past them."""
    import json

    from attnrank.llm.fingerprint import model_fingerprint
    from attnrank.rerank.fused import FusedWeights

    key = model_fingerprint(str(tiny_dir))
    path = FusedWeights(["attention", "dense"], [1.0, 1.0], heads=["0-1"], capture="block:shared").save(*key)
    doc = json.loads(path.read_text())
    doc["artifacts"][FusedWeights.KIND]["payload"]["features"] = ["attention", "colbert"]
    path.write_text(json.dumps(doc))
    args = [a for a in _args(dl19_mini, tiny_dir, "--folds", "3", "--rel", "2") if a not in ("--heads", "all")]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert "The fused weights registered for the model do not load" in r.output
    assert FusedWeights.load(*key).features == ["attention", "bm25", "dense", "rank"]


def test_the_fused_report_says_preset_signals_keeps_equal_weights_without_a_model_to_read():
    """Fused weights whose model without attention came out all 0 keep none, and preset signals
    then reads equal weights: the report said their model without attention replaced them, at the
    score of an all-tied ranking."""
    from attnrank.cli.train import _what_registering_changes
    from attnrank.rerank.fusion_eval import EQUAL, NO_ATTENTION, WITH_ATTENTION

    ndcg = {EQUAL: 0.61, NO_ATTENTION: 0.5131, WITH_ATTENTION: 0.64}
    kept = _what_registering_changes(ndcg, "equal weights", False, no_base=False)
    assert "with their model without attention (0.5131)" in kept
    none = _what_registering_changes(ndcg, "equal weights", False, no_base=True)
    assert "preset signals uses equal weights (held out 0.6100)" in none and "0.5131" not in none


def test_a_datasets_candidates_come_in_the_benchmarks_bm25_order(shared_mini):
    """HotpotQA's paragraphs and LoCoMo's turns are stored in source order: `attnrank train
    --dataset locomo` trained on a conversation's first turns, and HotpotQA's "first stage" was the
    file's paragraph order. They are ranked by BM25 now, as the benchmark sets rank them."""
    from attnrank.benchmarks.sets import bm25_order
    from attnrank.cli.labelled import LabelledSource, labelled_set
    from attnrank.eval.datasets import load_dataset

    for name in ("hotpotqa", "locomo"):
        qs, cands, _, _, desc = labelled_set(LabelledSource(name, shared_mini, None, None, None, None, 4, 0, None))
        ds = load_dataset(name, shared_mini)
        order = bm25_order(ds)
        assert qs and all([d.id for d in cands[q]] == order[q][:4] for q in qs), name
        assert any(order[q][:4] != list(dict.fromkeys(ds.candidates[q]))[:4] for q in qs), name  # (not the file's)
        assert "top-4 candidates" in desc


def test_labelled_queries_the_run_lacks_are_named_not_dropped_silently(scifact_mini, tmp_path, capsys):
    """A run that spells a query's id otherwise ("001" for "1"), or covers other queries, shrank
    the report without a word."""
    from attnrank.cli.labelled import LabelledSource, labelled_set
    from attnrank.eval import read_qrels

    qrels = read_qrels(scifact_mini / "qrels" / "train.tsv")
    qids = sorted(q for q, judged in qrels.items() if any(v >= 1 for v in judged.values()))
    run = tmp_path / "run.trec"
    run.write_text("".join(f"{q} Q0 {next(iter(qrels[q]))} 1 1.0 r\n" for q in qids[1:]))
    args = (None, None, scifact_mini / "queries.jsonl", scifact_mini / "qrels" / "train.tsv", scifact_mini, run)
    kept, *_ = labelled_set(LabelledSource(*args, 5, 0, None))
    assert qids[0] not in kept and len(kept) == len(qids) - 1
    err = capsys.readouterr().err
    assert f"1 of the {len(qids)} labelled queries have no candidates in the run (e.g. {qids[0]!r})" in err


def test_qrels_of_other_query_ids_are_named_not_blamed_on_the_folds(scifact_mini, tmp_path):
    """Qrels whose query ids match none of the queries' ("ZZ1" for "1") were refused as "0 labelled
    queries with candidates are fewer than --folds 5; ... lower --folds", a fix that could not work."""
    from attnrank.cli.labelled import LabelledSource, labelled_set
    from attnrank.errors import AttnrankError

    qrels = tmp_path / "qrels.tsv"
    lines = (scifact_mini / "qrels" / "train.tsv").read_text().splitlines()
    qrels.write_text("\n".join([lines[0], *(f"ZZ{line}" for line in lines[1:])]) + "\n")
    args = (None, None, scifact_mini / "queries.jsonl", qrels, scifact_mini / "corpus.jsonl", None)
    with pytest.raises(
        AttnrankError, match=r"none of the \d+ queries \(e.g. '\d+'\) is judged in the qrels, which judge"
    ):
        labelled_set(LabelledSource(*args, 5, 0, None))


def test_judged_documents_the_corpus_lacks_are_named_not_trained_as_never_retrieved(scifact_mini, tmp_path, capsys):
    """Qrels that zero-pad the corpus's ids trained and reported their queries as if nothing relevant
    had been retrieved (a user's report 0.46 for 0.81, weights registered), or, where no id matched,
    blamed --depth, which no depth could fix."""
    from attnrank.cli.labelled import LabelledSource, labelled_set
    from attnrank.errors import AttnrankError

    lines = (scifact_mini / "qrels" / "train.tsv").read_text().splitlines()
    rows = [line.split("\t") for line in lines[1:]]
    qrels = tmp_path / "qrels.tsv"

    def write(padded: int) -> None:
        qrels.write_text(
            "\n".join(
                [lines[0], *("\t".join([q, ("0" + d) if i < padded else d, v]) for i, (q, d, v) in enumerate(rows))]
            )
            + "\n"
        )

    args = (None, None, scifact_mini / "queries.jsonl", qrels, scifact_mini / "corpus.jsonl", None)
    write(len(rows))
    with pytest.raises(AttnrankError, match=r"none of the \d+ relevant documents the qrels judge .* is in the corpus"):
        labelled_set(LabelledSource(*args, 5, 0, None))
    write(1)
    labelled_set(LabelledSource(*args, 5, 0, None))
    err = capsys.readouterr().err
    assert f"warning: 1 of the {len({d for _, d, _ in rows})} relevant documents the qrels judge" in err
    assert f"(e.g. '0{rows[0][1]}'; the corpus holds e.g." in err
    write(0)
    labelled_set(LabelledSource(*args, 5, 0, None))
    assert "warning" not in capsys.readouterr().err


def test_training_embeds_the_candidates_as_the_trained_preset_will(tiny_dir):
    """train computed the dense signal with a float32 embedder, while the reranker that reads the
    weights embeds in bfloat16 where its model runs so: weights fitted to other signals."""
    from attnrank.cli.train import _llm_scorers
    from attnrank.rerank.attention import AttentionReranker

    for dtype in ("bfloat16", "float32"):
        signals = _llm_scorers("signals", str(tiny_dir), 300, "cpu", dtype)[3]
        rr = AttentionReranker(str(tiny_dir), config="signals", dtype=dtype)
        assert (signals.device, signals.backend) == (rr.signals.device, rr.signals.backend)
    likelihood = _llm_scorers("likelihood", str(tiny_dir), 300, "cpu", "bfloat16")[3]
    assert likelihood.backend == "torch-bf16"


def test_weights_that_came_out_all_zero_are_said_not_registered_before_the_report_claims_them(
    home, dl19_mini, tiny_dir, monkeypatch
):
    """A fit that comes out all 0 printed a report ending "Registered, these weights ...", then
    the save refused them with exit 1."""
    from attnrank.cli import train as train_cli
    from attnrank.rerank.fused import LikelihoodWeights

    zero = LikelihoodWeights(["bm25", "dense", "rank", "likelihood"], [0.0, 0.0, 0.0, 0.0])
    monkeypatch.setattr(train_cli, "_fit_unless_worse", lambda *a, **k: ("REPORT", zero))
    r = runner.invoke(app, _args(dl19_mini, tiny_dir, "--folds", "3", "--rel", "2", preset="likelihood"))
    assert r.exit_code != 0 and "not registered: " in str(r.exception) and "are all 0" in str(r.exception)
    assert "REPORT" in r.output and "saved to" not in r.output


@pytest.mark.parametrize("command", ["train", "heads train"])
def test_a_model_that_cannot_load_is_named_before_the_labelled_set_is_read(
    home, dl19_mini, tmp_path, monkeypatch, command
):
    """With --no-save the model was first read at its load, after the corpus and the candidates
    (BM25 over the corpus for a dataset) had been read."""
    from attnrank.cli import heads_train, train

    read = []
    for module in (train, heads_train):
        monkeypatch.setattr(module, "labelled_set", lambda *a, **k: read.append(a))
    args = _args(dl19_mini, tmp_path / "typo", "--no-save")
    if command == "heads train":
        args = ["heads", "train", *[a for a in args[1:] if a not in ("--preset", "fused")]]
    r = runner.invoke(app, args)
    assert r.exit_code != 0 and "typo" in cli_text(r) + str(r.exception), cli_text(r)
    assert read == []


def test_a_broken_registry_is_named_before_the_index_is_searched(home, scifact_mini, tiny_dir, monkeypatch, tmp_path):
    """With --index the labelled set loads its embedder and searches every query; the registry
    checks, which need neither, ran after that."""
    from attnrank import registry
    from attnrank.cli import train
    from attnrank.llm.fingerprint import model_fingerprint

    path = registry.user_file(*model_fingerprint(str(tiny_dir)), None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    read = []
    monkeypatch.setattr(train, "labelled_set", lambda *a, **k: read.append(a))
    args = ["train", "--preset", "signals", "--queries", str(scifact_mini / "queries.jsonl"), "--qrels"]
    args += [str(scifact_mini / "qrels/train.tsv"), "--index-dir", str(tmp_path), "--model", str(tiny_dir), "-q"]
    r = runner.invoke(app, args)
    assert r.exit_code != 0 and "move it away" in cli_text(r), cli_text(r)
    assert read == []


def test_a_beir_qrels_folder_of_several_splits_is_refused_for_training(home, scifact_mini, tiny_dir, tmp_path):
    """read_qrels takes its test.tsv (said at INFO only): the weights were trained on the queries
    an `attnrank eval` of that folder then scores."""
    import shutil

    beir = tmp_path / "beir"
    shutil.copytree(scifact_mini, beir)
    shutil.copy(beir / "qrels/train.tsv", beir / "qrels/test.tsv")
    args = ["train", "--preset", "signals", "--queries", str(beir / "queries.jsonl"), "--qrels", str(beir)]
    args += ["--corpus", str(beir / "corpus.jsonl"), "--model", str(tiny_dir), "-q"]
    r = runner.invoke(app, args)
    said = cli_text(r)
    assert r.exit_code == 2 and "holds the qrels of 2 splits (test.tsv, train.tsv)" in said, said
    assert str(beir / "qrels" / "train.tsv") in said.replace(" ", "") and not home.exists()


def test_the_fused_report_says_when_attention_lost_held_out_whatever_the_query_count():
    """Preset fused registers its weights whatever the report shows; with 80 or more queries
    nothing said so, where the fusion with attention scored below the one without."""
    from attnrank.cli.train import FEW_QUERIES, _fused_scored_below
    from attnrank.rerank.fusion_eval import EQUAL, NO_ATTENTION, WITH_ATTENTION

    lost = {EQUAL: 0.61, NO_ATTENTION: 0.63, WITH_ATTENTION: 0.60}
    said = " ".join(_fused_scored_below(lost, FEW_QUERIES))
    assert "(0.6000) scored below fused without attention (0.6300)" in said and "--no-save" in said
    assert _fused_scored_below({**lost, WITH_ATTENTION: 0.64}, FEW_QUERIES) == []
    assert _fused_scored_below(lost, FEW_QUERIES - 1) == []  # (_few_queries says it there)


def test_bm25_candidates_of_a_corpus_are_hits_only(tmp_path):
    """Documents that share no query term filled a short candidate list in corpus order, and were
    trained and reported on as BM25's candidates."""
    from attnrank.cli.labelled import LabelledSource, labelled_set

    (tmp_path / "c.jsonl").write_text(
        "".join(f'{{"id": "d{i}", "text": "{t}"}}\n' for i, t in enumerate(["zebra stripes", "a cat", "a dog"]))
    )
    (tmp_path / "q.tsv").write_text("q1\tzebra\n")
    (tmp_path / "qrels.txt").write_text("q1 0 d0 1\nq1 0 d1 0\n")
    qs, cands, *_ = labelled_set(
        LabelledSource(None, None, tmp_path / "q.tsv", tmp_path / "qrels.txt", tmp_path / "c.jsonl", None, 3, 0, None)
    )
    assert list(qs) == ["q1"] and [d.id for d in cands["q1"]] == ["d0"]
