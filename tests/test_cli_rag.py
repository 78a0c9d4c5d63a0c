"""The ``ask`` command's checks before any model or index loads."""

from __future__ import annotations

from _tiny import save_tiny
from typer.testing import CliRunner

from attnrank.cli import app

runner = CliRunner()


def test_ask_reads_the_model_config_once_for_both_head_options(tmp_path, monkeypatch):
    """--heads and --prune-heads are both checked against the model's shape: one config read."""
    from transformers import AutoConfig

    model = save_tiny(tmp_path / "model", layers=3)  # a path no earlier test has read
    read, original = [], AutoConfig.from_pretrained

    def counted(source, *args, **kwargs):
        read.append(str(source))
        return original(source, *args, **kwargs)

    monkeypatch.setattr(AutoConfig, "from_pretrained", counted)
    args = ["ask", "q", "--index-dir", str(tmp_path / "no-index"), "--model", str(model)]
    r = runner.invoke(app, [*args, "--heads", "2-3", "--prune-heads", "0-0,1-1"])
    assert r.exit_code == 1 and "no-index" in r.output + str(r.exception)  # stopped at the index, after both checks
    assert read == [str(model)]
