"""``attnrank heads train`` on a tiny random model and the DL19 slice (3 topics, BM25 top-20 run)."""

from __future__ import annotations

import re

import pytest
from _cli import cli_text
from _tiny import save_tiny
from typer.testing import CliRunner

from attnrank.cli import app
from attnrank.errors import InputError

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("m") / "tiny", layers=3, max_positions=8192)


def _args(dl, tiny_dir, *extra):
    return [
        "heads",
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
        "5",
        "--model",
        str(tiny_dir),
        "-q",
        *extra,
    ]


_text = cli_text


@pytest.fixture
def informative(monkeypatch):
    """Head 0-0's feature made each candidate's relevance label, the other heads' left as the tiny
    random model's attention gives them: weights learned from them can beat the untrained sum of
    every head, which the random heads alone never do (below it, nothing is registered)."""
    from attnrank.cli import heads_train

    real = heads_train._capture

    def capture(*args, **kwargs):
        feats, llm, prompt = real(*args, **kwargs)
        for q in feats:
            q.features[:, 0] = q.labels
        return feats, llm, prompt

    monkeypatch.setattr(heads_train, "_capture", capture)


def test_heads_train_does_not_register_weights_below_the_untrained_sum(home, dl19_mini, tiny_dir):
    """They were registered whatever the report said, and put before the shipped weights: a user's
    weights that lost held out became what preset learned reads."""
    from attnrank.llm.fingerprint import model_fingerprint
    from attnrank.rerank.learned import LearnedHeadWeights

    r = runner.invoke(app, _args(dl19_mini, tiny_dir, "--folds", "3", "--top", "4", "--l2", "1", "--rel", "2"))
    assert r.exit_code == 0, r.output + repr(r.exception)
    learned, summed = (
        float(re.search(rf"^\s+{who}\b.*?nDCG@10 ([0-9.]+)", r.output, re.MULTILINE).group(1))
        for who in ("learned", "sum of per-head scores")
    )
    assert learned < summed and "saved to" not in r.output
    assert f"Not registered: held out, the learned weights ({learned:.4f}) score below the untrained sum" in r.output
    assert "warning: 3 labelled queries are fewer than 80" in r.output
    with pytest.raises(InputError, match="no learned head weights in the head registry"):
        LearnedHeadWeights.load(*model_fingerprint(str(tiny_dir)))


def test_heads_train_reports_heldout_and_registers_weights(home, dl19_mini, tiny_dir, informative):
    from attnrank.llm.fingerprint import model_fingerprint
    from attnrank.rerank.attention import AttentionReranker
    from attnrank.rerank.config import RerankConfig
    from attnrank.rerank.learned import LearnedHeadWeights

    r = runner.invoke(app, _args(dl19_mini, tiny_dir, "--folds", "3", "--top", "4", "--l2", "1", "--rel", "2"))
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert "held-out 3-fold over 3 queries" in r.output
    scores = {
        who: float(v)
        for who, v in re.findall(
            r"^\s+(first stage|sum of per-head scores|learned)\b.*?nDCG@10 ([0-9.]+)", r.output, re.MULTILINE
        )
    }
    assert set(scores) == {"first stage", "sum of per-head scores", "learned"} and all(
        0 <= v <= 1 for v in scores.values()
    )
    assert "saved to" in r.output and str(home) in r.output
    w = LearnedHeadWeights.load(*model_fingerprint(str(tiny_dir)))
    assert w is not None and len(w.heads) == 4 and w.weights.shape == (4,)
    assert w.config.prompt == RerankConfig().prompt_settings()  # the prompt the features were read from
    assert w.metrics["n_queries"] == 3 and w.metrics["heldout"]["learned nDCG@10"] == pytest.approx(
        scores["learned"], abs=1e-4
    )
    # the registered weights are what scorer="learned" reranks with
    rr = AttentionReranker(str(tiny_dir), scorer="learned")
    assert rr.heads == w.heads
    shown = runner.invoke(app, ["heads", "show", "--model", str(tiny_dir)])  # (listed nowhere before)
    assert shown.exit_code == 0 and re.search(r"- head-weights \[user\] \d{4}-\d\d-\d\dT.*, trained on", shown.output)


def test_heads_train_cuts_passages_as_the_reranker_its_advice_names(home, dl19_mini, tiny_dir, informative):
    """A passage too long for the model's window was refused with "lower max_doc_words/max_doc_tokens",
    options heads train did not have; it takes them now, and the weights record the cut they read."""
    from attnrank.llm.fingerprint import model_fingerprint
    from attnrank.rerank.learned import LearnedHeadWeights

    small = save_tiny(tiny_dir.parent / "small", layers=3, max_positions=512)
    r = runner.invoke(app, _args(dl19_mini, small, "--folds", "3", "--top", "2", "--rel", "2"))
    assert r.exit_code != 0 and "lower max_doc_words/max_doc_tokens" in _text(r), _text(r)
    r = runner.invoke(app, _args(dl19_mini, small, "--folds", "3", "--top", "2", "--rel", "2", "--max-doc-words", "12"))
    assert r.exit_code == 0, _text(r)
    w = LearnedHeadWeights.load(*model_fingerprint(str(small)))
    assert w is not None and w.config.prompt["max_doc_words"] == 12 and w.config.prompt["max_doc_tokens"] is None


def test_heads_train_no_save_writes_nothing(home, dl19_mini, tiny_dir):
    r = runner.invoke(
        app,
        _args(
            dl19_mini, tiny_dir, "--folds", "3", "--heads", "all", "--learner", "pairwise", "--rel", "2", "--no-save"
        ),
    )
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert "held-out 3-fold over 3 queries" in r.output and "saved to" not in r.output
    assert not (home / "heads").exists()  # nothing registered


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--heads", "best"], "--heads 'best'"),
        (["--learner", "listwise"], "--learner"),
        (["--l2", "0"], "--l2"),
        (["--l2", "nan"], "--l2 nan must be a finite number > 0"),  # was a traceback from sklearn, after the capture
        (["--l2", "inf"], "--l2 inf must be a finite number > 0"),
        (["--folds", "1"], "--folds"),
        (["--folds", "4"], "fewer than --folds 4"),
        (["--max-queries", "2", "--folds", "3"], "2 labelled queries with candidates are fewer"),
        (["--rel", "5"], "--rel 5 is above every label of the qrels (the highest is 3)"),  # blamed on --folds
    ],
)
def test_heads_train_rejects_bad_options_before_loading_a_model(home, dl19_mini, tiny_dir, monkeypatch, extra, message):
    from attnrank.llm import models

    loads: list[object] = []
    monkeypatch.setattr(models, "_load_cached", lambda *a: loads.append(a))
    r = runner.invoke(app, _args(dl19_mini, tiny_dir, *extra))
    assert r.exit_code != 0
    assert message in _text(r)
    assert loads == []


def test_heads_train_names_every_head_where_top_asks_for_more_than_the_model_has(home, dl19_mini, tiny_dir):
    """--top 50 on a model of 12 heads trained on all of them, but the report said "top-50 heads".
    --heads topN, its old spelling (every other command reads --heads as a head list), still works, warned."""
    r = runner.invoke(app, _args(dl19_mini, tiny_dir, "--folds", "3", "--top", "50", "--rel", "2", "--no-save"))
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert "all heads" in r.output and "top-50" not in r.output
    old = runner.invoke(app, _args(dl19_mini, tiny_dir, "--folds", "3", "--heads", "top50", "--rel", "2", "--no-save"))
    assert old.exit_code == 0 and "--heads top50 is now --top 50" in old.output, old.output
    assert "all heads" in old.output and "top-50" not in old.output
    both = runner.invoke(app, _args(dl19_mini, tiny_dir, "--top", "4", "--heads", "top4", "--no-save"))
    assert both.exit_code == 2 and "--top 4 and --heads top4 both set it" in cli_text(both)
    zero = runner.invoke(app, _args(dl19_mini, tiny_dir, "--top", "0", "--no-save"))  # (refused, as heads detect's)
    assert zero.exit_code == 2 and "--top '0' is not a count >= 1 or 'all'" in cli_text(zero)
