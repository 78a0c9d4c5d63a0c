"""Without its extra, importing an adapter fails with an ImportError that names the extra."""

from __future__ import annotations

import importlib
import sys

import pytest

from attnrank.errors import MissingExtraError

CASES = [
    ("attnrank.integrations.langchain", "langchain_core", "langchain"),
    ("attnrank.integrations.llamaindex", "llama_index.core", "llamaindex"),
    ("attnrank.integrations.haystack", "haystack", "haystack"),
    ("haystack_integrations.components.rankers.attnrank", "haystack", "haystack"),
    ("haystack_integrations.components.retrievers.attnrank", "haystack", "haystack"),
    ("attnrank.serve.app", "fastapi", "serve"),
]


@pytest.mark.parametrize("module, dependency, extra", CASES)
def test_missing_extra_is_named(monkeypatch, module, dependency, extra):
    monkeypatch.setitem(sys.modules, dependency, None)  # makes `import dependency` fail
    for name in [m for m in sys.modules if m == module or m.startswith((module + ".", "haystack_integrations"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(sys.modules, "attnrank.integrations.haystack", raising=False)
    with pytest.raises(MissingExtraError, match=rf"pip install 'attnrank\[{extra}\]'"):
        importlib.import_module(module)
