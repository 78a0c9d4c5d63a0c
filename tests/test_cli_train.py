"""``attnrank train`` (both presets) on a tiny random model and the DL19 slice (3 topics, BM25 top-20 run)."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from attnrank.cli import app

runner = CliRunner()


def _args(dl, tiny_dir, *extra, preset="fused"):
    heads = ["--heads", "all"] if preset == "fused" else []
    return [
        "train",
        "--preset",
        preset,
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
    from attnrank.rerank.fused import FusedWeights

    r = runner.invoke(app, _args(dl19_mini, tiny_dir, "--folds", "3", "--rel", "2"))
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert "held-out 3-fold over 3 queries" in r.output
    rows = dict(
        re.findall(r"^\| (fused with attention|fused without attention|rank alone) \| ([0-9.]+) \|", r.output, re.M)
    )
    assert set(rows) == {"fused with attention", "fused without attention", "rank alone"}
    assert all(0 <= float(v) <= 1 for v in rows.values())
    assert "saved to" in r.output and str(home) in r.output
    equal = re.search(r"^\| equal weights, no attention \(untrained\) \| ([0-9.]+) \|", r.output, re.M)
    assert equal is not None  # the default the registered weights replace, scored on the same folds
    assert f"current equal weights (equal weights: held out {float(equal.group(1)):.4f})" in r.output
    assert f"without attention ({float(rows['fused without attention']):.4f})" in r.output
    w = FusedWeights.load(*model_fingerprint(str(tiny_dir)))
    assert w.features == ["attention", "bm25", "dense", "rank"] and len(w.weights) == 4
    assert w.heads == "all" and w.capture == "block:shared"  # the attention preset fused reads, as it captures it
    assert w.metrics["heldout"]["fused with attention"]["nDCG@10"] == pytest.approx(
        float(rows["fused with attention"]), abs=1e-4
    )
    rr = AttentionReranker(str(tiny_dir), None, signals="auto")  # the registered weights are what it uses
    assert rr.fused is not None and rr.fused.weights == pytest.approx(w.weights)
    again = runner.invoke(app, _args(dl19_mini, tiny_dir, "--folds", "3", "--rel", "2", "--no-save"))
    assert again.exit_code == 0 and "current registered weights (trained on" in again.output  # not "equal" now


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
    assert FusedWeights.load(*key).heads == ["0-1", "1-2"]
    r = runner.invoke(app, [*args, "--heads", "1-3"])
    assert r.exit_code == 0 and FusedWeights.load(*key).heads == ["1-3"]


def test_train_refuses_bad_options_before_loading_a_model(home, dl19_mini, tiny_dir):
    r = runner.invoke(app, _args(dl19_mini, tiny_dir, "--kind", "lambdamart"))
    assert r.exit_code != 0 and "--kind 'lambdamart'" in r.output
    r = runner.invoke(app, _args(dl19_mini, tiny_dir, "--folds", "9"))
    assert r.exit_code != 0 and "fewer than --folds 9" in r.output
    assert not home.exists()


def test_train_likelihood_registers_weights_the_default_preset_reads_only_if_they_do_no_harm(home, dl19_mini, tiny_dir):
    """The default preset trains the query likelihood's fusion; held out, the trained weights are
    registered only if they score at least as well as the untrained equal weights they replace,
    and the default reranker then scores by them."""
    from attnrank.llm.fingerprint import model_fingerprint
    from attnrank.rerank.attention import AttentionReranker
    from attnrank.rerank.fused import LikelihoodWeights

    key = model_fingerprint(str(tiny_dir))
    r = runner.invoke(app, _args(dl19_mini, tiny_dir, "--folds", "3", "--rel", "2", preset="likelihood"))
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert "held-out 3-fold over 3 queries" in r.output and "query likelihood of" in r.output
    rows = dict(re.findall(r"^\| ([a-z0-9 ,()]+?) \| ([0-9.]+) \|", r.output, re.M))
    assert {"likelihood alone", "fused with likelihood", "equal weights with likelihood (untrained)"} <= set(rows)
    trained, untrained = float(rows["fused with likelihood"]), float(rows["equal weights with likelihood (untrained)"])
    if trained < untrained:
        assert "Not registered" in r.output and "saved to" not in r.output
        assert not home.exists() or "likelihood-weights" not in "".join(p.read_text() for p in home.rglob("*.json"))
        return
    assert "saved to" in r.output and f"current equal weights (equal weights: held out {untrained:.4f})" in r.output
    w = LikelihoodWeights.load(*key)
    assert w.features == ["bm25", "dense", "rank", "likelihood"] and w.heads is None
    assert w.metrics["heldout"]["fused with likelihood"]["nDCG@10"] == pytest.approx(trained, abs=1e-4)
    rr = AttentionReranker(str(tiny_dir))  # the default preset now reads them
    assert rr.config.name == "likelihood" and rr.fused is not None and rr.fused.weights == pytest.approx(w.weights)
    again = runner.invoke(
        app, _args(dl19_mini, tiny_dir, "--folds", "3", "--rel", "2", "--no-save", preset="likelihood")
    )
    assert again.exit_code == 0 and "current registered weights (trained on" in again.output


def test_train_likelihood_refuses_attention_options_before_loading_a_model(home, dl19_mini, tiny_dir):
    for extra, named in ((["--heads", "all"], "--heads"), (["--no-gate"], "--gate/--no-gate")):
        r = runner.invoke(app, _args(dl19_mini, tiny_dir, *extra, preset="likelihood"))
        assert r.exit_code == 2 and f"{named} configure(s) attention" in r.output, r.output
    r = runner.invoke(app, _args(dl19_mini, tiny_dir, preset="signals"))
    assert r.exit_code == 2 and "--preset 'signals' is not one of likelihood, fused" in r.output
    assert not home.exists()
