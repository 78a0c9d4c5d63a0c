from __future__ import annotations

import os
import re

import pytest

from attnrank.errors import InputError
from attnrank.files import atomic_path, check_file_target, held_lock, hold_writer_lock, lock_held


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


@pytest.mark.parametrize("mode", [0o640, 0o600, 0o664])
def test_a_replaced_file_keeps_its_permissions(tmp_path, mode):
    """The replacement used to get the temporary file's mode (umask default): a group-readable
    run became private to its writer, or a private one readable by all."""
    target = tmp_path / "run.trec"
    target.write_text("old")
    os.chmod(target, mode)
    with atomic_path(target, fsync=False) as tmp:
        tmp.write_text("new")
    assert target.read_text() == "new" and target.stat().st_mode & 0o7777 == mode


def test_check_file_target_refuses_what_atomic_path_cannot_write(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    check_file_target(tmp_path / "new" / "run.trec", "-o")  # a new file in a new folder is fine
    check_file_target(tmp_path / "notes.txt", "-o")  # whether it may be replaced is the caller's rule
    for path, message in [
        (tmp_path / "folder", "-o {} is a folder; give a file path"),
        (fifo, "-o {} is not a regular file"),
        (tmp_path / "notes.txt" / "deeper" / "run.trec", "notes.txt is a file, not a folder"),
    ]:
        with pytest.raises(InputError, match=re.escape(message.format(path))):
            check_file_target(path, "-o")
    assert (tmp_path / "notes.txt").read_text() == "mine" and not (tmp_path / "new").exists()


def test_check_file_target_refuses_a_path_inside_an_index(tmp_path):
    """`search -o indexes/sf/run.trec` wrote into the index folder: a file its manifest does not list,
    after which `attnrank index` refused to rebuild that index without --force."""
    from attnrank.index.retriever import HybridRetriever
    from attnrank.types import Document

    ix = HybridRetriever().index([Document("a", "fleas bite")], show_progress=False).save(tmp_path / "ix")
    for path in (ix / "run.trec", ix / "sub" / "run.trec"):
        with pytest.raises(InputError, match=re.escape(f"-o {path} lies inside the attnrank index {ix}")):
            check_file_target(path, "-o")
    assert not (ix / "run.trec").exists() and not (ix / "sub").exists()
    check_file_target(tmp_path / "run.trec", "-o")  # beside it is fine
    check_file_target(ix / ".." / "run.trec", "-o")  # (by way of the index: beside it too)
    (tmp_path / "link").symlink_to(ix)
    with pytest.raises(InputError, match="lies inside the attnrank index"):  # (through a link: inside it)
        check_file_target(tmp_path / "link" / "run.trec", "-o")


def test_check_file_target_refuses_a_folder_it_cannot_write_in(tmp_path, unwritable_dir):
    """The temporary file was first created after the work (a search, an index build): an
    unwritable folder failed only then, the work lost. os.access passes as root, so a file is tried."""
    locked = unwritable_dir
    with pytest.raises(InputError, match=f"-o {re.escape(str(locked))}/x/run.trec: cannot write in {locked}"):
        check_file_target(locked / "x" / "run.trec", "-o")
    check_file_target(tmp_path / "fine" / "run.trec", "-o")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # the tried file went
    link = tmp_path / "latest.trec"  # written through: its target's folder is the one tried
    link.symlink_to(locked / "today.trec")
    with pytest.raises(InputError, match=f"cannot write in {locked}"):
        check_file_target(link, "-o")


def test_a_symbolic_link_is_written_through_not_replaced(tmp_path):
    """A user's link (``latest.trec -> runs/today.trec``) stays a link; its target gets the new file."""
    from attnrank.files import atomic_path

    target = tmp_path / "runs" / "today.trec"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / "latest.trec"
    link.symlink_to(target)
    with atomic_path(link) as tmp:
        tmp.write_text("new\n")
    assert link.is_symlink() and target.read_text() == "new\n" and link.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.trec", "runs"]  # no temporary left


def test_a_file_of_blank_lines_is_not_a_run_attnrank_wrote(tmp_path):
    from attnrank.files import is_attnrank_run

    blank = tmp_path / "blank.trec"
    blank.write_text("\n\n  \n")
    assert not is_attnrank_run(blank)
    blank.write_text("q1 Q0 d1 1 2.5 attnrank-bm25\n\n")
    assert is_attnrank_run(blank)


def test_a_guard_keeps_a_file_that_appeared_during_the_write(tmp_path):
    """Outputs were checked only before a long run; whatever was at the path at its end was replaced."""
    from attnrank.errors import InputError
    from attnrank.files import atomic_path, is_attnrank_run, replace_guard

    path = tmp_path / "run.trec"
    guard = replace_guard(is_attnrank_run, "a TREC run", "-o")
    with atomic_path(path, guard=guard) as tmp:
        tmp.write_text("q1 Q0 d1 1 1.0 attnrank\n")
    assert path.read_text() == "q1 Q0 d1 1 1.0 attnrank\n"  # new, or attnrank's own: written
    refused = pytest.raises(InputError, match="-o .*run.trec exists and is not a TREC run attnrank wrote")
    with refused, atomic_path(path, guard=guard) as tmp:
        tmp.write_text("q1 Q0 d2 1 1.0 attnrank\n")
        path.write_text("the user's notes\n")  # appears while the run writes
    assert path.read_text() == "the user's notes\n"
    (kept,) = [p for p in tmp_path.iterdir() if p.name != "run.trec"]  # the run's output is not lost
    assert kept.name.startswith("run.trec.attnrank-new-") and kept.read_text() == "q1 Q0 d2 1 1.0 attnrank\n"
    kept.unlink()
    path.chmod(0o000)  # the foreign file's bits are not the kept output's (it was unreadable)
    with refused, atomic_path(path, guard=guard) as tmp:
        tmp.write_text("q1 Q0 d3 1 1.0 attnrank\n")
    path.chmod(0o600)
    (kept,) = [p for p in tmp_path.iterdir() if p.name != "run.trec"]
    assert kept.stat().st_mode & 0o777 != 0 and kept.read_text() == "q1 Q0 d3 1 1.0 attnrank\n"


def test_temporary_files_of_a_killed_write_are_removed_and_nothing_else(tmp_path):
    """A write killed mid-way left its hidden ``.NAME.tmp-PID-HEX`` file behind for good."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(done.stdout)
    stale = tmp_path / f".run.trec.tmp-{dead}-0123abcd"
    live = tmp_path / f".run.trec.tmp-{dead}-4567abcd"  # a write under way (its PID not visible here)
    running = tmp_path / f".run.trec.tmp-{os.getpid()}-89abcdef"  # one whose process runs (no lock yet)
    other = tmp_path / f".notes.txt.tmp-{dead}-0123abcd"  # another file's
    mine = tmp_path / ".run.trec.tmp-backup"  # the user's own, not atomic_path's name
    for p in (stale, live, running, other, mine):
        p.write_text("x")
    lock = hold_writer_lock(live)  # as atomic_path holds it while its caller writes
    try:
        with atomic_path(tmp_path / "run.trec") as tmp:
            assert lock_held(tmp) is True
            tmp.write_text("new")
    finally:
        os.close(lock)
    assert not stale.exists() and live.exists() and running.exists() and other.exists() and mine.exists()
    assert (tmp_path / "run.trec").read_text() == "new"


def test_a_file_system_without_locks_is_warned_of_not_fatal(tmp_path, monkeypatch, caplog):
    """An NFS home without lockd fails flock with ENOLCK: raised, the default model could not load
    at all, and a training's save failed after the work."""
    import errno
    import fcntl

    def no_locks(*args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    ran = False
    with caplog.at_level("WARNING", logger="attnrank.files"), held_lock(tmp_path / "x.lock"):
        ran = True
    assert ran and "cannot lock" in caplog.text and "No locks available" in caplog.text

    def held(*args):
        raise BlockingIOError(errno.EWOULDBLOCK, "held")

    monkeypatch.setattr(fcntl, "flock", held)  # another process holding it is still said so
    with pytest.raises(BlockingIOError), held_lock(tmp_path / "x.lock", wait=False):
        pass
