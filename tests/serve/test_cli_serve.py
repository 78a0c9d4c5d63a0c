"""``attnrank serve``'s checks of its options, made before any model or index loads."""

from __future__ import annotations

from _cli import cli_text
from typer.testing import CliRunner

from attnrank.cli import app

runner = CliRunner()


def test_serve_refuses_an_empty_index_name_before_loading_anything(monkeypatch):
    """``--index ""`` was read as no index: the server started without one (every other command
    refuses it)."""
    import uvicorn

    from attnrank.serve import engine

    loaded = []
    monkeypatch.setattr(engine, "build_engine", lambda *a, **k: loaded.append(a))
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: loaded.append("run"))
    r = runner.invoke(app, ["serve", "--index", "", "--port", "0"])
    assert r.exit_code == 2, cli_text(r)
    assert "give --index NAME (stored under ./indexes) or --index-dir DIR" in cli_text(r)
    assert "attnrank serving" not in r.output and loaded == []
