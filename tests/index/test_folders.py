from __future__ import annotations

import json
import subprocess
import sys

import pytest

from attnrank.errors import InputError
from attnrank.index import folders
from attnrank.index.bm25 import BM25Index
from attnrank.index.dense import DenseIndex
from attnrank.index.folders import check_target, remove_stale, swap_in
from attnrank.index.sharded.stats import block_stats
from attnrank.index.tokenize import TokenizerConfig


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


def test_a_folder_that_is_or_holds_a_mount_point_is_never_replaced(tmp_path, monkeypatch):
    """The old folder is removed after the swap: a corpus bind-mounted under the target was deleted
    through its mount point, --force or not; a target that is itself a mount (a Docker volume)
    failed at the swap, after the whole build. A path ending in '..' failed there too."""
    import os

    ix = _index(tmp_path / "ix")
    (ix / "mnt").mkdir()
    mounts = {str(ix / "mnt")}
    real = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda p: str(p) in mounts or real(p))  # (a bind mount needs root)
    for force in (False, True):
        with pytest.raises(InputError, match=r"it holds a mount point \(.*mnt\), whose files the removal"):
            check_target(ix, force=force)
    mounts = {str(ix)}
    with pytest.raises(InputError, match="is a mount point, which a save cannot replace; give a folder inside it"):
        check_target(ix)
    with pytest.raises(InputError, match=r"ends in '\.\.'"):
        check_target(ix / "mnt" / "..")


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


def test_index_folder_holding_user_files_is_not_replaced(tmp_path, monkeypatch, built_retriever):
    """A rebuild must not delete what the user put into an index folder (a run file, notes)."""
    from attnrank.index.retriever import HybridRetriever

    monkeypatch.chdir(tmp_path)
    target = built_retriever.save(tmp_path / "idx")
    (target / "run.trec").write_text("q1 Q0 d1 1 1.0 mine\n")
    (target / ".DS_Store").write_bytes(b"finder")  # a file manager's own: not worth a refusal
    (target / "notes").mkdir()
    (target / "notes" / "todo.txt").write_text("mine")
    with pytest.raises(InputError, match=r"does not list \(notes/todo\.txt, run\.trec\)"):
        built_retriever.save(target)
    assert (target / "run.trec").exists() and (target / "notes" / "todo.txt").read_text() == "mine"
    assert HybridRetriever.load(target, verify=True).num_docs == built_retriever.num_docs
    built_retriever.save(target, force=True)  # --force: the user asked for it
    assert not (target / "run.trec").exists()
    built_retriever.save(target)  # a clean index is replaced as before


def test_a_private_index_stays_private_when_it_is_saved_again(tmp_path, built_retriever):
    """A rebuild came back with the new folder's modes: a folder the user had made private (700,
    its files 600) became world-readable (755, 644)."""
    import stat

    from attnrank.index.retriever import HybridRetriever

    def modes(folder):
        return {p: stat.S_IMODE(p.stat().st_mode) for p in [folder, *folder.rglob("*")] if not p.is_symlink()}

    target = built_retriever.save(tmp_path / "idx")
    fresh = modes(target)
    assert any(m & 0o044 for m in fresh.values())  # (the umask's modes: readable by others, as made)
    target.chmod(0o700)
    (target / "docs.jsonl").chmod(0o600)
    built_retriever.save(target)
    again = modes(target)
    assert again[target] == 0o700 and all(m & 0o077 == 0 for m in again.values()), again
    assert {p.relative_to(target) for p in again} == {p.relative_to(target) for p in fresh}
    assert HybridRetriever.load(target, verify=True).num_docs == built_retriever.num_docs
    target.chmod(0o750)  # a group the user shares it with keeps reading it, others do not
    built_retriever.save(target)
    assert stat.S_IMODE(target.stat().st_mode) == 0o750
    assert all(m & 0o007 == 0 and m & 0o040 for m in modes(target).values())


def test_a_file_system_that_refuses_modes_still_saves(tmp_path, built_retriever, monkeypatch):
    """Some file systems (a CIFS share, FAT) refuse chmod: making the build folder private, or
    carrying the old folder's mode over, must not fail the save after its build."""
    import os

    from attnrank.index.retriever import HybridRetriever

    def refused(path, mode, *a, **k):
        raise PermissionError(1, "Operation not permitted", str(path))

    target = built_retriever.save(tmp_path / "ix")
    monkeypatch.setattr(os, "chmod", refused)
    built_retriever.save(target)  # over an index, and anew
    built_retriever.save(tmp_path / "ix2")
    monkeypatch.undo()
    assert HybridRetriever.load(tmp_path / "ix2", verify=True).num_docs == built_retriever.num_docs


def test_an_index_built_in_a_setgid_folder_stays_its_groups(tmp_path, built_retriever):
    """The build folder was made private with chmod 700, which clears setgid: in a shared group
    folder (2770), the index's files came out in the builder's own group, unreadable to the rest."""
    import os
    import stat

    shared = tmp_path / "shared"
    shared.mkdir()
    group = 1 if os.getgid() != 1 else 2
    try:
        os.chown(shared, -1, group)
    except PermissionError:
        pytest.skip("changing a folder's group needs root or membership of another group")
    shared.chmod(0o2770)
    target = built_retriever.save(shared / "ix")
    for p in [target, *target.rglob("*")]:
        assert p.stat().st_gid == group, p
        if p.is_dir():
            assert p.stat().st_mode & stat.S_ISGID, p


def test_a_model_given_under_the_home_folders_tilde_is_protected(tmp_path, monkeypatch):
    """--model=~/models/tiny reaches attnrank unexpanded (bash expands no ~ after '='): the model
    loads from the home folder, but --force replaced ~/models, the folder holding it."""
    from attnrank.index.folders import model_paths

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    (tmp_path / "models" / "tiny" / "config.json").write_text("{}")
    with pytest.raises(InputError, match="it is or contains the model"):
        check_target(tmp_path / "models", force=True, protect=model_paths("~/models/tiny"))


def test_attnranks_home_is_never_an_index_target(tmp_path, monkeypatch, built_retriever):
    """--force replaced any folder but the working directory: attnrank's home (the user's trained
    weights and head sets) too."""
    home = tmp_path / "home"
    (home / "registry").mkdir(parents=True)
    (home / "registry" / "weights.json").write_text("{}")
    monkeypatch.setenv("ATTNRANK_HOME", str(home))
    for target in (home, tmp_path):
        with pytest.raises(InputError, match="attnrank's home"):
            built_retriever.save(target, force=True)
    assert (home / "registry" / "weights.json").read_text() == "{}"
    built_retriever.save(home / "indexes" / "mine")  # an index inside it is fine


def test_of_two_builds_of_one_folder_the_later_is_refused_not_reported_built(tmp_path, built_retriever, scifact_docs):
    """Two `attnrank index` runs into one new folder both said "indexed N documents"; the folder
    held the one that swapped in last, and the other user searched a corpus not theirs."""
    from attnrank.errors import IndexFormatError
    from attnrank.index.retriever import HybridRetriever

    target = tmp_path / "race"
    other = HybridRetriever().index(scifact_docs[:3], show_progress=False)

    def meanwhile(folder):  # another build of the same folder ends while this one runs
        other.save(target)

    with pytest.raises(IndexFormatError, match="written by another process during this build; nothing was replaced"):
        built_retriever.save(target, extra=meanwhile)
    assert HybridRetriever.load(target, verify=True).num_docs == 3
    assert [p.name for p in tmp_path.iterdir()] == ["race"]  # (no temporary folder left)


@pytest.mark.parametrize("force", [False, True], ids=["", "force"])
@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
@pytest.mark.parametrize("before", ["index", "empty"])
def test_a_file_written_between_the_last_check_and_the_swap_is_put_back(
    tmp_path, monkeypatch, built_retriever, scifact_docs, before, exchange, force
):
    """The save checked the folder, then swapped its build in and removed what it swapped out: a
    file another program wrote into the folder in that moment went with it (with either swap: one
    atomic exchange, or two renames where the file system has none; and with --force, which this
    folder did not need)."""
    from attnrank.errors import IndexFormatError
    from attnrank.index import folders, store
    from attnrank.index.retriever import HybridRetriever

    if not exchange:
        monkeypatch.setattr(folders, "_exchange", lambda a, b: False)

    target = tmp_path / "ix"
    if before == "index":
        HybridRetriever().index(scifact_docs[:3], show_progress=False).save(target)
    else:
        target.mkdir()
    swap_in = store.swap_in

    def late_writer(tmp, folder):  # another program writes into the folder just before the swap
        (folder / "notes.txt").write_text("mine")
        return swap_in(tmp, folder)

    monkeypatch.setattr(store, "swap_in", late_writer)
    with pytest.raises(IndexFormatError, match="changed while this build was swapping it in; nothing was replaced"):
        built_retriever.save(target, force=force)
    assert (target / "notes.txt").read_text() == "mine"
    if before == "index":
        assert HybridRetriever.load(target).num_docs == 3
    else:
        assert [p.name for p in target.iterdir()] == ["notes.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["ix"]  # (the build removed, no temporary folder left)


def test_a_recheck_that_fails_puts_the_folder_back(tmp_path, monkeypatch, built_retriever, scifact_docs):
    """An error (or an interrupt) in the check after the swap left the previous folder under the
    build's temporary name, which the next save removed as a killed build's."""
    from attnrank.index import store
    from attnrank.index.retriever import HybridRetriever

    target = HybridRetriever().index(scifact_docs[:3], show_progress=False).save(tmp_path / "ix")

    def failing(folder):
        raise OSError("a file vanished during the walk")

    monkeypatch.setattr(store, "not_replaceable", failing)
    with pytest.raises(OSError, match="vanished during the walk"):
        built_retriever.save(target)
    assert HybridRetriever.load(target).num_docs == 3
    assert [p.name for p in tmp_path.iterdir()] == ["ix"]


def test_a_folder_put_back_by_two_renames_survives_a_kill_between_them(tmp_path):
    """Killed between the two renames that put a folder back, it is left as an .old sibling with no
    folder at the target: the next save restores it, index or not (it removed any but an index)."""
    target = tmp_path / "ix"
    orphan = tmp_path / f".ix.old-{_dead_pid()}-12345678"
    orphan.mkdir()
    (orphan / "notes.txt").write_text("mine")
    remove_stale(target)
    assert (target / "notes.txt").read_text() == "mine" and not orphan.exists()


def test_an_index_folder_under_a_file_is_refused_before_the_build(tmp_path):
    """`index --index-dir notes.jsonl/sub` built the whole index (the passage states too), then
    failed at the save: "File exists: notes.jsonl"."""
    (tmp_path / "notes.jsonl").write_text("mine")
    with pytest.raises(InputError, match=r"notes\.jsonl is a file, not a folder; choose another path"):
        check_target(tmp_path / "notes.jsonl" / "sub")
    assert (tmp_path / "notes.jsonl").read_text() == "mine"


def test_sharded_index_counts_as_an_index(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shard = _index(tmp_path / "sh" / "shard-00000")
    (shard / "docs.jsonl").write_text("{}\n")
    top = {"format": "attnrank-sharded-index", "files": {"stats/df.npy": {}}, "shards": [{"name": "shard-00000"}]}
    (tmp_path / "sh" / "manifest.json").write_text(json.dumps(top))
    (tmp_path / "sh" / "stats").mkdir()
    (tmp_path / "sh" / "stats" / "df.npy").write_bytes(b"x")
    with pytest.raises(InputError, match=r"does not list \(shard-00000/docs\.jsonl\)"):
        check_target(tmp_path / "sh")
    manifest = json.loads((shard / "manifest.json").read_text())
    (shard / "manifest.json").write_text(json.dumps({**manifest, "files": {"docs.jsonl": {}}}))
    check_target(tmp_path / "sh")


def test_the_working_directory_is_protected_under_another_spelling(tmp_path, monkeypatch):
    """On a case-insensitive file system (macOS) ~/projects/rag is ~/Projects/rag, but their real
    paths differ in case: --force let a save replace (and delete) the working directory."""
    import os

    (tmp_path / "Proj").mkdir()
    (tmp_path / "proj").mkdir()  # on such a file system, the same folder as Proj
    (tmp_path / "proj" / "thesis.txt").write_text("mine")
    real_samefile = os.path.samefile

    def case_insensitive(a, b):
        return str(a).lower() == str(b).lower() or real_samefile(a, b)

    monkeypatch.setattr(os.path, "samefile", case_insensitive)
    monkeypatch.chdir(tmp_path / "Proj")
    with pytest.raises(InputError, match="it is or contains the working directory"):
        check_target(tmp_path / "proj", force=True)
    check_target(tmp_path / "other", force=True)  # an unrelated folder is still allowed


def test_a_temporary_folder_whose_build_holds_its_lock_is_kept_whatever_its_pid(tmp_path):
    """A build in another container (its PID not visible here) holds its folder's lock: a save of the
    same name there removed the folder of a build still running."""
    import os

    from attnrank.files import hold_writer_lock

    target = tmp_path / "a"
    dead = _dead_pid()
    held, left = (_index(tmp_path / f".a.tmp-{dead}-{tag}") for tag in ("0000000a", "0000000b"))
    lock = hold_writer_lock(held)
    try:
        remove_stale(target)
    finally:
        os.close(lock)
    assert held.is_dir() and not left.exists()


def test_a_stale_folder_that_could_not_be_removed_is_said_not_logged_as_removed(tmp_path, monkeypatch, caplog):
    """remove_stale logged "removed ..." and returned the folder where rmtree (ignoring errors) had failed."""
    left = _index(tmp_path / f".a.tmp-{_dead_pid()}-0000000c")
    monkeypatch.setattr(folders.shutil, "rmtree", lambda *a, **k: None)  # a removal that fails
    with caplog.at_level("WARNING", logger="attnrank.index.folders"):
        assert remove_stale(tmp_path / "a") == []
    assert left.is_dir() and "could not remove" in caplog.text and "removed" not in caplog.text.replace("remove it", "")


@pytest.mark.parametrize("part", ["bm25", "dense", "stats"])
def test_an_index_part_saves_only_into_a_new_or_empty_folder(tmp_path, scifact_docs, part):
    """BM25Index, DenseIndex and CorpusStats write files of fixed names (params.json, vocab.json,
    index.faiss, totals.json): into a folder of the user's files they replaced a namesake. They
    now refuse any folder that holds files, naming it, and leave it as it was."""
    texts = [d.full_text for d in scifact_docs[:20]]
    if part == "bm25":
        built, name = BM25Index().index(texts), "params.json"
    elif part == "dense":
        built, name = DenseIndex().index(texts), "index.faiss"
    else:
        built, name = block_stats(texts, TokenizerConfig()), "totals.json"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / name).write_text("the user's own file")
    with pytest.raises(InputError, match=r"new or empty folder; .*mine holds files"):
        built.save(mine)
    assert [p.name for p in mine.iterdir()] == [name]
    assert (mine / name).read_text() == "the user's own file"
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="is a file"):
        built.save(tmp_path / "file")
    empty = tmp_path / "empty"
    empty.mkdir()
    built.save(empty)
    built.save(tmp_path / "new" / "part")
    assert {p.name for p in empty.iterdir()} == {p.name for p in (tmp_path / "new" / "part").iterdir()}
    assert name in {p.name for p in empty.iterdir()}


def test_a_folder_inside_a_folder_corpus_is_never_an_index_target(tmp_path):
    """`attnrank index corpus --index-dir corpus/sub --force` indexed corpus/sub's documents and then
    replaced the folder holding them (only a target that is or contains the corpus was refused)."""
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "sub" / "doc1.txt").write_text("part of the corpus")
    with pytest.raises(InputError, match="lies inside the corpus folder"):
        check_target(corpus / "sub", force=True, protect=[corpus])
    assert (corpus / "sub" / "doc1.txt").read_text() == "part of the corpus"
    check_target(corpus / "new-index", force=True, protect=[corpus])  # a new folder there, as ./indexes of "."
    (corpus / "os").mkdir()
    (corpus / "os" / ".DS_Store").write_text("x")  # a file manager's own: nothing to lose
    check_target(corpus / "os", force=True, protect=[corpus])
    from attnrank.index.retriever import HybridRetriever
    from attnrank.types import Document

    ix = HybridRetriever().index([Document("d1", "apples"), Document("d2", "pears")], show_progress=False)
    ix.save(corpus / "ix")
    check_target(corpus / "ix", force=True, protect=[corpus])  # re-indexing into its own index there
    (corpus / "ix" / "notes.txt").write_text("mine")  # ... unless it holds a file of the user's own
    with pytest.raises(InputError, match="lies inside the corpus folder"):
        check_target(corpus / "ix", force=True, protect=[corpus])
    check_target(tmp_path / "elsewhere", force=True, protect=[corpus])
    (tmp_path / "c.jsonl").write_text("{}\n")  # a corpus file: a folder beside it is no part of it
    check_target(tmp_path / "ix", force=True, protect=[tmp_path / "c.jsonl"])


def test_a_folder_of_a_file_managers_files_and_empty_folders_holds_nothing_to_lose(tmp_path):
    """A folder Finder had opened (.DS_Store) was refused without --force, and one of empty
    subfolders inside a folder corpus even with it, as holding "files"."""
    fresh = tmp_path / "fresh"
    (fresh / "empty").mkdir(parents=True)
    (fresh / ".DS_Store").write_text("x")
    check_target(fresh)
    corpus = tmp_path / "corpus"
    (corpus / "sub" / "empty").mkdir(parents=True)
    check_target(corpus / "sub", force=True, protect=[corpus])
    (corpus / "sub" / "empty" / "doc.txt").write_text("mine")  # a file at any depth is
    with pytest.raises(InputError, match="lies inside the corpus folder"):
        check_target(corpus / "sub", force=True, protect=[corpus])


def test_a_folder_holding_a_link_to_a_folder_is_not_empty(tmp_path):
    """is_dir follows a link and rglob does not enter it: a folder holding only a link to the
    user's data folder was judged empty, replaced without --force, and the link deleted."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "doc.txt").write_text("mine")
    target = tmp_path / "target"
    target.mkdir()
    (target / "mydata").symlink_to(data, target_is_directory=True)
    with pytest.raises(InputError):
        check_target(target)


def test_an_index_folder_in_a_folder_it_cannot_write_in_is_refused_before_the_build(unwritable_dir):
    """`attnrank index ... --index-dir /sys/kernel/x` read and embedded the corpus, then failed
    creating the temporary folder."""
    with pytest.raises(InputError, match="cannot write in"):
        check_target(unwritable_dir / "idx")


def test_force_never_replaces_the_folder_of_the_embedder_the_index_records(tmp_path, monkeypatch):
    """save(models_folder, force=True) deleted the local embedder it had just embedded with (the
    index then recorded a model that no longer existed), in the single and the sharded build."""
    from _tiny import save_tiny_encoder

    from attnrank.index.retriever import HybridRetriever
    from attnrank.index.sharded.build import ShardedIndexer
    from attnrank.types import Document

    monkeypatch.chdir(tmp_path)
    models = tmp_path / "models"
    encoder = save_tiny_encoder(models / "enc")
    docs = [Document(f"d{i}", f"passage {i} about topic {i % 2}") for i in range(4)]
    r = HybridRetriever(embedder=str(encoder)).index(docs, show_progress=False)
    with pytest.raises(InputError, match="it is or contains the embedder"):
        r.save(models, force=True)
    with pytest.raises(InputError, match="it is or contains the embedder"):
        ShardedIndexer(HybridRetriever(embedder=str(encoder)), shards=2).build(docs, models, force=True)
    assert (encoder / "config.json").exists()
    # and `attnrank index` refuses it before the corpus is read and embedded (after, before)
    from typer.testing import CliRunner

    from attnrank.cli import app

    (tmp_path / "c.jsonl").write_text("{not json\n")  # read first, this would be the error
    args = ["index", str(tmp_path / "c.jsonl"), "--index-dir", str(models), "--embedder", str(encoder), "--force"]
    r = CliRunner().invoke(app, [*args, "-q"])
    said = " ".join((r.output + str(r.exception)).split())
    assert r.exit_code != 0 and "it is or contains the embedder" in said, said
    assert (encoder / "config.json").exists()


def test_a_build_missing_a_file_never_replaces_the_index(tmp_path, built_retriever, monkeypatch, caplog):
    """A file removed from the temporary folder during the build (another container's sweep of
    stale folders) left an index without it, swapped in over the good one; and a previous index
    that could not be removed after the swap stayed hidden beside it while nothing said so."""
    from attnrank.errors import IndexFormatError
    from attnrank.index import store
    from attnrank.index.retriever import HybridRetriever

    target = built_retriever.save(tmp_path / "ix")
    before = sorted(p.name for p in target.iterdir())
    with pytest.raises(IndexFormatError, match="the build lost a file before it was saved .* nothing was replaced"):
        built_retriever.save(target, extra=lambda tmp: (tmp / "docs.jsonl").unlink())
    assert sorted(p.name for p in target.iterdir()) == before and HybridRetriever.load(target).num_docs
    monkeypatch.setattr(store.shutil, "rmtree", lambda *a, **k: None)  # the old folder's removal fails
    with caplog.at_level("WARNING", logger="attnrank.index.store"):
        built_retriever.save(target, force=True)
    assert "could not remove the previous index, kept at" in caplog.text


def test_an_index_inside_another_index_is_refused(tmp_path, built_retriever):
    """`attnrank index c --index-dir idx/sub` wrote a second index into the first, whose rebuild was
    then refused (files its manifest does not list) until --force deleted the inner one."""
    built_retriever.save(tmp_path / "idx")
    for target in (tmp_path / "idx" / "sub", tmp_path / "idx" / "a" / "b"):
        with pytest.raises(InputError, match=r"lies inside the attnrank index .*idx, which holds its own files only"):
            check_target(target, force=True)
    with pytest.raises(InputError, match="lies inside the attnrank index"):
        built_retriever.save(tmp_path / "idx" / "sub")
    assert not (tmp_path / "idx" / "sub").exists()
    built_retriever.save(tmp_path / "idx")  # the index itself is replaced as before
    check_target(tmp_path / "beside", force=False)


def test_refusals_name_the_python_argument_in_python_and_the_option_on_the_command_line(built_retriever, tmp_path):
    """save() over a user's folder advised "pass --force", and over a file "choose another
    --index-dir/--index": flags the Python API does not have."""
    import subprocess
    import sys

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.txt").write_text("mine")
    (tmp_path / "report.pdf").write_text("pdf")
    with pytest.raises(InputError, match=r"or pass force=True \(CLI: --force\) to replace it$"):
        built_retriever.save(tmp_path / "mine")
    with pytest.raises(InputError, match=r"report\.pdf is a file, not an index folder; choose another folder$"):
        built_retriever.save(tmp_path / "report.pdf")
    (tmp_path / "c.jsonl").write_text('{"_id": "a", "text": "alpha"}\n')
    cli = [sys.executable, "-m", "attnrank.cli", "index", "c.jsonl", "--index-dir", "mine", "-q"]
    done = subprocess.run(cli, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 1 and done.stderr.strip().endswith("or pass --force to replace it"), done.stderr
    assert (tmp_path / "mine" / "thesis.txt").read_text() == "mine"
