"""``attnrank train`` on a tiny random model and the DL19 slice (3 topics, BM25 top-20 run)."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from attnrank.cli import app

runner = CliRunner()


def _args(dl, tiny_dir, *extra):
    return [
        "train",
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
        "--heads",
        "all",
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
