"""Fixtures of the tests of attnrank.llm."""

from __future__ import annotations

import pytest

from attnrank.llm.models import clear_llm_cache


@pytest.fixture
def isolated_home(tmp_path, monkeypatch):
    """Its own cache root (``ATTNRANK_HOME``) and an empty process-level model cache for the test."""
    monkeypatch.setenv("ATTNRANK_HOME", str(tmp_path / "home"))
    clear_llm_cache()
    yield
    clear_llm_cache()
