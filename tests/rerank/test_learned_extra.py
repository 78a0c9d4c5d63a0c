"""scikit-learn is the optional extra ``train``: without it, training says which extra to install."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from attnrank.errors import MissingExtraError
from attnrank.rerank.learned import QueryFeatures, train_head_weights


def test_training_without_scikit_learn_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # import sklearn -> ImportError
    q = QueryFeatures("q", ["a", "b"], np.array([[1.0], [0.0]]), np.array([1, 0]), [(0, 0)])
    with pytest.raises(MissingExtraError, match=r"attnrank\[train\]"):
        train_head_weights([q])


def test_cli_without_scikit_learn_names_the_extra_before_loading_a_model(monkeypatch, tmp_path, dl19_mini):
    from typer.testing import CliRunner

    from attnrank.cli import app

    monkeypatch.setitem(sys.modules, "sklearn", None)
    r = CliRunner().invoke(
        app,
        [
            "heads",
            "train",
            "--queries",
            str(dl19_mini / "topics.tsv"),
            "--qrels",
            str(dl19_mini / "qrels.txt"),
            "--corpus",
            str(dl19_mini / "passages.jsonl"),
            "--model",
            str(tmp_path / "no-such-model"),
        ],
    )
    assert isinstance(r.exception, MissingExtraError) and "attnrank[train]" in str(r.exception)
