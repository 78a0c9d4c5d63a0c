"""attnrank.errors: the optional-dependency error names the extra, survives pickling, and tells a
missing package from one that is installed but fails to import."""

from __future__ import annotations

import pickle
import sys

import pytest

from attnrank.errors import MissingExtraError, require


def test_a_missing_extras_error_survives_pickling():
    """A Ray worker's error reaches the driver pickled: unpickling needed three arguments."""
    e = pickle.loads(pickle.dumps(MissingExtraError("Stemmer", "stem", "Porter stemming")))
    assert isinstance(e, MissingExtraError) and "pip install 'attnrank[stem]'" in str(e)


def test_an_installed_package_that_fails_to_import_is_not_called_missing(tmp_path, monkeypatch):
    """An ImportError raised inside an installed package read "not installed": reinstalling did
    not help, and the cause was hidden."""
    (tmp_path / "brokenpkg_attnrank_test.py").write_text("from os import no_such_name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MissingExtraError, match=r"installed but fails to import \(ImportError: cannot import name"):
        require("brokenpkg_attnrank_test", "x", "this")
    sys.modules.pop("brokenpkg_attnrank_test", None)
    with pytest.raises(MissingExtraError, match=r"'no_such_pkg_attnrank_test', which is not installed"):
        require("no_such_pkg_attnrank_test", "x", "this")
