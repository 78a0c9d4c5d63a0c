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
    assert "give --index NAME (stored under ./indexes, or $ATTNRANK_INDEX_DIR) or --index-dir DIR" in cli_text(r)
    assert "attnrank serving" not in r.output and loaded == []


def test_serve_refuses_an_empty_host_and_logs_at_info_only_its_request_lines(monkeypatch):
    """``--host ""`` bound every interface (a `--host "$HOST"` with the variable unset exposed the
    server); and serve set every attnrank logger to INFO, so --verbose changed nothing and each
    prune or answer logged the stages' lines beside its one request line."""
    import logging

    import uvicorn

    from attnrank.serve import engine

    ran = []
    monkeypatch.setattr(engine, "build_engine", lambda *a, **k: object())
    monkeypatch.setattr("attnrank.serve.app.create_app", lambda *a, **k: object())
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: ran.append("run"))
    r = runner.invoke(app, ["serve", "--host", " ", "--port", "0"])
    assert r.exit_code == 2 and "--host ' ' is empty" in cli_text(r) and ran == []
    levels = {name: logging.getLogger(name).level for name in ("", "attnrank", "attnrank.serve.access")}
    try:
        for flags, stages in (([], logging.WARNING), (["--verbose"], logging.INFO)):
            r = runner.invoke(app, ["serve", "--port", "0", *flags])
            assert r.exit_code == 0, cli_text(r)
            assert logging.getLogger("attnrank.serve.access").getEffectiveLevel() == logging.INFO
            assert logging.getLogger("attnrank.prune").getEffectiveLevel() == stages
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    assert ran == ["run", "run"]


def test_serve_listens_at_once_and_restricts_hosts_on_loopback_only(monkeypatch, caplog):
    """Bound but not listening, the port was bound by a second serve too (SO_REUSEADDR), which
    failed only after its model had loaded; a loopback server now answers its own host names only,
    and serving on every interface is warned of."""
    import logging
    import socket

    import uvicorn

    from attnrank.serve import engine
    from attnrank.serve.background import LOOPBACK_HOSTS

    seen = []
    monkeypatch.setattr(engine, "build_engine", lambda *a, **k: object())
    monkeypatch.setattr("attnrank.serve.app.create_app", lambda *a, **k: seen.append(k["allowed_hosts"]) or object())

    def run(self, sockets=None):
        (sock,) = sockets
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        with socket.socket(sock.family) as second:
            second.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                second.bind(sock.getsockname())
            except OSError:
                seen.append("second bind refused")

    monkeypatch.setattr(uvicorn.Server, "run", run)
    with caplog.at_level(logging.WARNING, logger="attnrank.cli.serve"):
        r = runner.invoke(app, ["serve", "--port", "0", "-q"])
        assert r.exit_code == 0, cli_text(r)
        assert "without authentication" not in caplog.text
        r = runner.invoke(app, ["serve", "--host", "::1", "--port", "0", "-q"])  # (was not restricted)
        assert r.exit_code == 0 and "serving on http://[::1]:" in r.output, cli_text(r)
        assert "without authentication" not in caplog.text
        r = runner.invoke(app, ["serve", "--host", "0.0.0.0", "--port", "0", "-q"])
        assert r.exit_code == 0, cli_text(r)
    assert seen == [LOOPBACK_HOSTS, "second bind refused"] * 2 + [None, "second bind refused"]
    assert "serving on 0.0.0.0: every route answers anyone" in caplog.text
