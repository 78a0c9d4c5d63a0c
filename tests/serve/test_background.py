"""The background server and the loopback rule that ``attnrank serve`` shares with it."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI

from attnrank.serve.background import LOOPBACK_HOSTS, allowed_hosts, background_server, is_loopback


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", " LocalHost "])
def test_a_loopback_address_answers_its_own_host_names_only(host):
    assert is_loopback(host) and allowed_hosts(host) == LOOPBACK_HOSTS


@pytest.mark.parametrize("host, own", [("127.0.0.2", "127.0.0.2"), ("0:0:0:0:0:0:0:1", "[0:0:0:0:0:0:0:1]")])
def test_another_loopback_spelling_answers_its_own_url_too(host, own):
    """is_loopback took all of 127.0.0.0/8 and any spelling of ::1, but only the three usual
    names were answered: a server on 127.0.0.2 refused its own URL (400)."""
    assert allowed_hosts(host) == (*LOOPBACK_HOSTS, own)
    with background_server(_hello(), host=host) as base:
        assert httpx.get(f"{base}/hello").json() == {"hello": "world"}
        assert httpx.get(f"{base}/hello", headers={"host": "attacker.example"}).status_code == 400


@pytest.mark.parametrize(
    "host, own",
    [
        ("127.1", ("127.1",)),
        ("2130706433", ("2130706433",)),
        ("::ffff:127.0.0.1", ("[::ffff:127.0.0.1]", "[::ffff:7f00:1]")),
    ],
)
def test_a_spelling_the_system_reads_as_loopback_is_loopback(host, own):
    """`--host 127.1` binds 127.0.0.1, as the system's resolver reads it, but was taken for an exposed
    address: a warning that every route answers anyone, and no Host check (DNS rebinding)."""
    assert is_loopback(host) and allowed_hosts(host) == (*LOOPBACK_HOSTS, *own)
    with background_server(_hello(), host=host) as base:
        assert httpx.get(f"{base}/hello").json() == {"hello": "world"}
        assert httpx.get(f"{base}/hello", headers={"host": "attacker.example"}).status_code == 400


def test_a_name_of_a_loopback_address_answers_that_address_too(monkeypatch):
    """A machine's name in /etc/hosts is often 127.0.1.1: served on loopback, and its clients may
    call the address itself."""
    import socket

    real = socket.getaddrinfo
    monkeypatch.setattr(
        socket,
        "getaddrinfo",
        lambda host, *a, **k: (
            [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.1.1", 0))] if host == "myhost" else real(host, *a, **k)
        ),
    )
    assert is_loopback("myhost") and allowed_hosts("myhost") == (*LOOPBACK_HOSTS, "myhost", "127.0.1.1")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.1", "fe80::1", "::ffff:10.0.0.1", "example.invalid"])
def test_another_address_answers_any_host_name(host):
    assert not is_loopback(host) and allowed_hosts(host) is None


def _hello() -> FastAPI:
    app = FastAPI()

    @app.get("/hello")
    def hello() -> dict[str, str]:
        return {"hello": "world"}

    return app


def test_an_ipv6_loopback_server_serves_and_checks_the_host_header():
    """background_server bound IPv4 alone (an IPv6 address failed to bind), and an IPv6 loopback
    `attnrank serve` was not host-restricted (Starlette before 1.7 read "[::1]:8000" as "[")."""
    with background_server(_hello(), host="::1") as base:
        assert base.startswith("http://[::1]:")
        assert httpx.get(f"{base}/hello").json() == {"hello": "world"}  # (Host: [::1]:port)
        assert httpx.get(f"{base}/hello", headers={"host": "localhost"}).status_code == 200
        r = httpx.get(f"{base}/hello", headers={"host": "attacker.example"})
        assert r.status_code == 400 and "Invalid host header" in r.text
