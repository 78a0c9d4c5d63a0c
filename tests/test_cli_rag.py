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


class _Stop(Exception):
    pass


def test_ask_prunes_with_the_pruners_own_settings_unless_given(tmp_path, monkeypatch, built_retriever):
    """A reranking preset's block attention was handed to the pruner (and --state-cache-mb never
    was), so `ask` pruned otherwise than `attnrank prune` and Pipeline.from_model with the same flags."""
    from attnrank.pipeline import Pipeline
    from attnrank.prune.config import PruneConfig

    built_retriever.save(tmp_path / "ix")
    seen: list[PruneConfig] = []

    def capture(*args, prune=None, **kwargs):
        seen.append(prune)
        raise _Stop

    monkeypatch.setattr(Pipeline, "from_model", staticmethod(capture))
    base = ["ask", "vitamin D?", "--index-dir", str(tmp_path / "ix"), "-q"]
    runner.invoke(app, [*base, "--preset", "fused"])
    runner.invoke(app, [*base, "--no-rerank", "--attention", "block", "--state-cache-mb", "64"])
    default = PruneConfig()
    assert (seen[0].attention, seen[0].block_positions, seen[0].state_cache_mb) == (
        default.attention,
        default.block_positions,
        default.state_cache_mb,
    )
    assert (seen[1].attention, seen[1].block_positions, seen[1].state_cache_mb) == ("block", "rotated", 64)


def test_ask_names_a_missing_profile_or_probe_before_any_model_loads(home, tmp_path, monkeypatch, built_retriever):
    """--reorder without a registered slot profile and --method probe without a probe were named
    only after the model had loaded."""
    from attnrank.llm import models

    model = save_tiny(tmp_path / "model", layers=2)
    built_retriever.save(tmp_path / "ix")
    loads: list[object] = []
    monkeypatch.setattr(models, "_load_cached", lambda *a: loads.append(a))
    base = ["ask", "vitamin D?", "--index-dir", str(tmp_path / "ix"), "--model", str(model), "-q"]
    r = runner.invoke(app, [*base, "--reorder"])
    assert r.exit_code == 1 and "slot profile" in str(r.exception)
    r = runner.invoke(app, [*base, "--method", "probe"])
    assert r.exit_code == 1 and "sentence probe" in str(r.exception)
    assert loads == []


def test_ask_takes_neighbours_as_the_python_api_does(tmp_path, monkeypatch, built_retriever):
    """Pipeline(neighbours=...) had no CLI option in ask (prune had one)."""
    from attnrank.pipeline import Pipeline

    built_retriever.save(tmp_path / "ix")
    seen: list[dict] = []

    def capture(*args, **kwargs):
        seen.append(kwargs)
        raise _Stop

    monkeypatch.setattr(Pipeline, "from_model", staticmethod(capture))
    base = ["ask", "vitamin D?", "--index-dir", str(tmp_path / "ix"), "-q"]
    runner.invoke(app, [*base, "--neighbours", "2"])
    runner.invoke(app, base)
    assert [s["neighbours"] for s in seen] == [2, 0]
    r = runner.invoke(app, [*base, "--no-prune", "--neighbours", "1"])
    assert r.exit_code == 2 and "--neighbours" in r.output
