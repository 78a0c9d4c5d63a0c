from __future__ import annotations

import pytest

from attnrank.files import atomic_path


def test_atomic_path_replaces_only_a_complete_file(tmp_path):
    target = tmp_path / "sub" / "out.txt"
    with atomic_path(target) as tmp:
        assert tmp.parent == target.parent and tmp.name.startswith(".out.txt.tmp-")
        tmp.write_text("new")
        assert not target.exists()  # nothing visible before the block ends
    assert target.read_text() == "new" and [p.name for p in target.parent.iterdir()] == ["out.txt"]


def test_atomic_path_keeps_the_old_file_when_the_write_fails(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(OSError, match="disk full"), atomic_path(target, fsync=False) as tmp:
        tmp.write_text("half")
        raise OSError("disk full")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]
