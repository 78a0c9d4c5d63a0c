"""Fixtures of the HTTP server tests (which run it live: attnrank.serve.background)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="needs the 'serve' extra")
pytest.importorskip("uvicorn", reason="needs the 'serve' extra")
pytest.importorskip("httpx", reason="needs httpx (test of the 'serve' extra)")

from _tiny import tiny_llm


@pytest.fixture(scope="session")
def llm():
    return tiny_llm(layers=2, max_positions=8192)
