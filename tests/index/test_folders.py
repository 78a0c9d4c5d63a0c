from __future__ import annotations

import json
import subprocess
import sys

import pytest

from attnrank.errors import InputError
from attnrank.index import folders
from attnrank.index.folders import check_target, remove_stale, swap_in


def _index(path, tag="x"):
    path.mkdir(parents=True)
    (path / "manifest.json").write_text(json.dumps({"format": "attnrank-index", "tag": tag}))
    return path


def _dead_pid() -> int:
    return int(
        subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
        ).stdout
    )


def test_check_target_rules(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check_target(tmp_path / "new")  # absent
    (tmp_path / "empty").mkdir()
    check_target(tmp_path / "empty")
    check_target(_index(tmp_path / "ix"))
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "thesis.txt").write_text("mine")
    with pytest.raises(InputError, match="is not an attnrank index"):
        check_target(tmp_path / "user")
    check_target(tmp_path / "user", force=True)
    with pytest.raises(InputError, match="working directory"):
        check_target(tmp_path, force=True)
    with pytest.raises(InputError, match="the corpus"):
        check_target(tmp_path / "user", force=True, protect=[tmp_path / "user" / "thesis.txt"])


def test_swap_without_exchange_and_restore_after_crash(tmp_path, monkeypatch):
    target, new = _index(tmp_path / "a", "old"), _index(tmp_path / ".a.tmp-1-00000000", "new")
    monkeypatch.setattr(folders, "_exchange", lambda a, b: False)  # a file system without RENAME_EXCHANGE
    old = swap_in(new, target)
    assert json.loads((target / "manifest.json").read_text())["tag"] == "new"
    assert json.loads((old / "manifest.json").read_text())["tag"] == "old"
    # a build killed between the fallback's two renames leaves only the .old copy: it is restored
    target.rename(tmp_path / "elsewhere")
    orphan = tmp_path / f".a.old-{_dead_pid()}-12345678"
    old.rename(orphan)
    remove_stale(target)
    assert json.loads((target / "manifest.json").read_text())["tag"] == "old" and not orphan.exists()
