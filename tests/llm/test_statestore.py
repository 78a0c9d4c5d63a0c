"""The on-disk passage-state store: written once, read memory-mapped, refused when foreign."""

from __future__ import annotations

import copy
import hashlib
import json
import os

import numpy as np
import pytest

from attnrank.errors import InputError
from attnrank.llm.attention import AttentionCapturer
from attnrank.llm.blocks import block_prefix_ids, build_block_prompts
from attnrank.llm.capture import capture_blocks
from attnrank.llm.statestore import PassageStateStore, sample_digest
from attnrank.llm.statestore_write import write_store
from attnrank.types import Document

DOCS = [
    Document("paris", "Paris is the capital of France.", "Paris"),
    Document("berlin", "Berlin is the capital of Germany and its largest city."),
    Document("banana", "Bananas are rich in potassium and grow in the tropics."),
]
HEADS = [(1, 0), (3, 2)]


@pytest.fixture(scope="module")
def capturer(llm):
    return AttentionCapturer(llm.model, HEADS)


def build(tmp_path, llm, capturer, storage, docs=DOCS, **kw):
    folder = tmp_path / storage
    write_store(
        folder, capturer, llm.tokenizer, docs, model_id="tiny", fingerprint=llm.fingerprint, storage=storage, **kw
    )
    return folder


def open_store(folder, llm, capturer, **kw):
    kw.setdefault("max_doc_words", None)
    kw.setdefault("max_doc_tokens", None)
    return PassageStateStore.open(folder, capturer, llm.tokenizer, llm.fingerprint, **kw)


@pytest.mark.parametrize("storage, tol", [("float16", 2e-3), ("int8", 3e-2)])
def test_stored_states_give_the_recomputed_rows(tmp_path, llm, capturer, storage, tol):
    folder = build(tmp_path, llm, capturer, storage)
    store = open_store(folder, llm, capturer)
    prompt = build_block_prompts(llm.tokenizer, "capital of France?", DOCS)
    prefix = capturer.prefill(block_prefix_ids(llm.tokenizer))
    fresh = capture_blocks(capturer, prompt, prefix, fingerprint=llm.fingerprint)
    stored = capture_blocks(capturer, prompt, prefix, fingerprint=llm.fingerprint, store=store)
    # the stored states were used (not recomputed): a store's values are rounded, so rows
    # differ by rounding only, and not at all where the rounding is exact
    assert store.stale == 0 and store.served == len(DOCS)
    rel = abs(stored.rows - fresh.rows).max() / abs(fresh.rows).max()
    assert rel < tol
    header = json.loads((folder / "states.json").read_text())
    assert header["tokens"] == sum(len(b) for b in prompt.blocks)
    bytes_per_token = store.keys.nbytes * 2 / header["tokens"]
    per_value = 2 if storage == "float16" else 1
    assert bytes_per_token == 2 * 4 * 2 * 8 * per_value  # keys+values x 4 layers x 2 kv heads x head_dim 8


def test_stored_states_are_really_read(tmp_path, llm, capturer):
    """Zeroed stored keys change the rows: proof that the store, not a recomputation, served them."""
    folder = build(tmp_path, llm, capturer, "float16")
    zeros = np.zeros_like(np.load(folder / "keys.npy"))
    np.save(folder / "keys.npy", zeros)
    header = json.loads((folder / "states.json").read_text())
    header["samples"]["keys"] = sample_digest(zeros)  # a store consistent with its zero keys
    (folder / "states.json").write_text(json.dumps(header))
    store = open_store(folder, llm, capturer)
    prompt = build_block_prompts(llm.tokenizer, "capital of France?", DOCS)
    prefix = capturer.prefill(block_prefix_ids(llm.tokenizer))
    fresh = capture_blocks(capturer, prompt, prefix, fingerprint=llm.fingerprint)
    zeroed = capture_blocks(capturer, prompt, prefix, fingerprint=llm.fingerprint, store=store)
    s, e = zeroed.spans[0]
    # zero keys give every block token the same logit, hence the same attention: flat rows
    assert np.ptp(zeroed.real[:, s:e], axis=1).max() < 1e-9
    assert np.ptp(fresh.real[:, s:e], axis=1).min() > 1e-7


def test_changed_text_is_not_served(tmp_path, llm, capturer, caplog):
    folder = build(tmp_path, llm, capturer, "float16")
    store = open_store(folder, llm, capturer)
    changed = [DOCS[0], Document("berlin", "Berlin is the capital of Germany."), DOCS[2]]
    prompt = build_block_prompts(llm.tokenizer, "capital?", changed)
    prefix = capturer.prefill(block_prefix_ids(llm.tokenizer))
    fresh = capture_blocks(capturer, prompt, prefix, fingerprint=llm.fingerprint)
    with caplog.at_level("WARNING"):
        got = capture_blocks(capturer, prompt, prefix, fingerprint=llm.fingerprint, store=store)
    assert store.stale == 1 and "berlin" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):  # again: counted, warned once (a server logged it on every request)
        capture_blocks(capturer, prompt, prefix, fingerprint=llm.fingerprint, store=store)
    assert store.stale == 2 and "berlin" not in caplog.text
    s, e = got.spans[1]
    assert abs(got.rows[:, s:e] - fresh.rows[:, s:e]).max() < 2e-3


@pytest.mark.parametrize(
    "change, fragment",
    [
        (dict(max_doc_words=50), "max_doc_words"),
        (dict(fingerprint="0" * 64), "fingerprint"),
        (dict(heads=[(1, 0)]), "deepest_layer"),
    ],
)
def test_foreign_store_is_refused(tmp_path, llm, capturer, change, fragment):
    folder = build(tmp_path, llm, capturer, "float16")
    other = AttentionCapturer(llm.model, change["heads"]) if "heads" in change else capturer
    fp = change.get("fingerprint", llm.fingerprint)
    with pytest.raises(InputError, match=fragment):
        PassageStateStore.open(
            folder, other, llm.tokenizer, fp, max_doc_words=change.get("max_doc_words"), max_doc_tokens=None
        )


def test_a_store_built_before_the_models_config_changed_is_refused(tmp_path, llm, capturer, monkeypatch):
    """A hub model's fingerprint is its snapshot's commit: a config.json edited in the cache (here
    its RoPE base) keeps it, while the stored keys were rotated under the old one."""
    folder = build(tmp_path, llm, capturer, "float16")
    config = capturer.decoder.config
    with monkeypatch.context() as m:
        m.setattr(config, "rope_parameters", {**config.rope_parameters, "rope_theta": 500000.0})
        with pytest.raises(InputError, match="config_sha256"):
            open_store(folder, llm, capturer)
    header = json.loads((folder / "states.json").read_text())
    del header["config_sha256"]  # a store written before the config was recorded opens as before
    (folder / "states.json").write_text(json.dumps(header))
    assert open_store(folder, llm, capturer).get("paris", "nope") is None


def test_a_bfloat16_models_stored_states_come_in_bfloat16(tmp_path):
    """Kept in the state cache as they come: float32 copies of a bfloat16 model's states took twice the room."""
    import torch
    from _tiny import tiny_model, tiny_tokenizer

    from attnrank.llm.models import LLM

    model = tiny_model("llama", layers=4, heads=4, kv_heads=2, max_positions=2048).to(torch.bfloat16)
    llm = LLM(model=model, tokenizer=tiny_tokenizer(), model_id="tiny-bf16", fingerprint="b" * 64)
    capturer = AttentionCapturer(model, HEADS)
    folder = build(tmp_path, llm, capturer, "int8")
    store = open_store(folder, llm, capturer)
    state = store.get("paris", store.header["passages"][0][1])
    assert state.keys.dtype == state.values.dtype == torch.bfloat16
    # and on the model's device: CPU states beside a GPU model's failed at the first rotated block
    # (here the "meta" device stands in for a GPU: the store reads the device off the weights)
    elsewhere = AttentionCapturer(copy.deepcopy(model).to("meta"), HEADS)
    state = open_store(folder, llm, elsewhere).get("paris", store.header["passages"][0][1])
    assert state.keys.device.type == state.values.device.type == "meta" and state.keys.dtype == torch.bfloat16


def test_missing_store_names_the_fix(tmp_path, llm, capturer):
    with pytest.raises(InputError, match="--passage-states"):
        open_store(tmp_path / "nothing", llm, capturer)


def _truncate(path, nbytes=100):
    path.write_bytes(path.read_bytes()[:-nbytes])


def _fewer_tokens(path):
    np.save(path, np.load(path)[:-5])


def _drop(path):
    path.unlink()


def _empty(path):  # (an interrupted copy: np.load raised EOFError, which the CLI printed as "Aborted!")
    path.write_bytes(b"")


@pytest.mark.parametrize(
    "storage, file, damage",
    [
        ("float16", "keys.npy", _truncate),
        ("float16", "values.npy", _fewer_tokens),
        ("int8", "key_scales.npy", _drop),
        ("int8", "value_scales.npy", _fewer_tokens),
        ("float16", "offsets.npy", _fewer_tokens),
        ("float16", "offsets.npy", _empty),
        ("int8", "keys.npy", _empty),
    ],
)
def test_damaged_store_is_refused_in_one_line(tmp_path, llm, capturer, storage, file, damage):
    """A truncated, shortened or missing array is an InputError naming the store, not a traceback
    (nor, for values of the wrong length, states sliced from the wrong rows)."""
    folder = build(tmp_path, llm, capturer, storage)
    damage(folder / file)
    with pytest.raises(InputError, match="passage states at .* are damaged"):
        open_store(folder, llm, capturer)


@pytest.mark.parametrize("passages", [None, [["paris"]], "x"])
def test_mangled_header_is_refused(tmp_path, llm, capturer, passages):
    folder = build(tmp_path, llm, capturer, "float16")
    header = json.loads((folder / "states.json").read_text())
    (folder / "states.json").write_text(json.dumps({**header, "passages": passages}))
    with pytest.raises(InputError, match="damaged"):
        open_store(folder, llm, capturer)


def test_a_header_whose_samples_are_no_mapping_is_refused(tmp_path, llm, capturer):
    folder = build(tmp_path, llm, capturer, "float16")
    header = json.loads((folder / "states.json").read_text())
    (folder / "states.json").write_text(json.dumps({**header, "samples": ["keys"]}))
    with pytest.raises(InputError, match="damaged.*samples are a list"):  # (a TypeError traceback)
        open_store(folder, llm, capturer)


@pytest.mark.parametrize("storage", ["float16", "int8"])
def test_arrays_of_equal_shape_swapped_are_refused_at_open(tmp_path, llm, capturer, storage):
    """Keys and values (same shape) swapped, or keys taken from another store of the same geometry,
    are caught at open by the sampled digests, without --verify."""
    folder = build(tmp_path, llm, capturer, storage)
    open_store(folder, llm, capturer)  # intact: opens
    keys, values = folder / "keys.npy", folder / "values.npy"
    k, v = keys.read_bytes(), values.read_bytes()
    keys.write_bytes(v)
    values.write_bytes(k)
    with pytest.raises(InputError, match="keys.npy is not the array written with this store"):
        open_store(folder, llm, capturer)
    keys.write_bytes(k)
    values.write_bytes(v)
    other = build(tmp_path / "other", llm, capturer, storage, docs=[DOCS[1], DOCS[0], DOCS[2]])
    assert np.load(other / "keys.npy").shape == np.load(keys).shape
    keys.write_bytes((other / "keys.npy").read_bytes())
    with pytest.raises(InputError, match="keys.npy is not the array written with this store"):
        open_store(folder, llm, capturer)


def test_offsets_of_another_build_are_refused_and_duplicates_counted(tmp_path, llm, capturer):
    """offsets.npy was checked for shape only: another build's, of the same passage count and
    token total, cut every passage's states at other rows. Two passages of one text were counted
    as one passage in stats() (/health)."""
    twin = Document("paris-copy", DOCS[0].text, DOCS[0].title)
    folder = build(tmp_path, llm, capturer, "float16", docs=[*DOCS, twin])
    store = open_store(folder, llm, capturer)
    assert store.stats()["passages"] == 4
    offsets = np.load(folder / "offsets.npy")
    moved = offsets.copy()
    moved[1] += 1  # the first passage one token longer, the second one shorter: the same total
    np.save(folder / "offsets.npy", moved)
    with pytest.raises(InputError, match="offsets.npy is not the array written with this store"):
        open_store(folder, llm, capturer)
    header = json.loads((folder / "states.json").read_text())
    del header["samples"]["offsets"]  # (a store written before offsets were sampled)
    (folder / "states.json").write_text(json.dumps(header))
    prompt = build_block_prompts(llm.tokenizer, "capital of France?", DOCS)
    prefix = capturer.prefill(block_prefix_ids(llm.tokenizer))
    with pytest.raises(InputError, match="stored token rows, its block"):
        capture_blocks(capturer, prompt, prefix, fingerprint=llm.fingerprint, store=open_store(folder, llm, capturer))


def test_stores_without_samples_still_open(tmp_path, llm, capturer):
    """A store written before the samples were recorded opens as before."""
    folder = build(tmp_path, llm, capturer, "float16")
    header = json.loads((folder / "states.json").read_text())
    del header["samples"]
    (folder / "states.json").write_text(json.dumps(header))
    assert open_store(folder, llm, capturer).get("paris", "nope") is None


def test_the_config_digest_covers_what_shapes_sliding_and_nope_models_states():
    """A local model's fingerprint hashes its weights only: an edited sliding window or NoPE layer
    list kept the digest, so a store built under the old config was served. A model that sets none
    of those fields keeps the digest it had."""
    from _tiny import tiny_model

    from attnrank.llm.statestore import _CONFIG_FIELDS, config_digest

    cfg = tiny_model("mistral", sliding_window=64).config
    before = config_digest(cfg)
    cfg.sliding_window = 32
    assert config_digest(cfg) != before
    for family in ("llama", "qwen2", "Qwen3"):  # (transformers fills in full-attention layer types for Qwen)
        cfg = tiny_model(family).config
        old = {k: getattr(cfg, k, None) for k in _CONFIG_FIELDS}
        assert config_digest(cfg) == hashlib.sha256(json.dumps(old, sort_keys=True, default=str).encode()).hexdigest()


def test_a_store_is_written_whole_or_not_at_all_and_never_into_an_existing_folder(tmp_path, llm, capturer):
    """An existing folder was a raw FileExistsError; a failed write left a partial folder without
    states.json, which remove_store then refused to delete. Batches of one passage write the
    memory-mapped arrays at their offsets as a whole-store write would."""
    whole = build(tmp_path, llm, capturer, "float16")
    with pytest.raises(InputError, match=r"float16 exists; passage states are written to a new folder"):
        build(tmp_path, llm, capturer, "float16")
    one_by_one = tmp_path / "one"
    write_store(one_by_one, capturer, llm.tokenizer, DOCS, model_id="tiny", fingerprint=llm.fingerprint, batch_docs=1)
    for name in ("keys.npy", "values.npy", "offsets.npy", "states.json"):
        assert (whole / name).read_bytes() == (one_by_one / name).read_bytes(), name

    with pytest.raises(InputError, match="no passages to store"):  # (was a raw FileNotFoundError)
        build(tmp_path, llm, capturer, "int8", docs=[])

    def interrupted(n):
        raise KeyboardInterrupt  # after the first batch

    with pytest.raises(KeyboardInterrupt):  # nothing is left behind
        build(tmp_path, llm, capturer, "int8", batch_docs=1, progress=interrupted)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["float16", "one"]


def test_a_killed_writes_folder_is_removed_by_the_next_write_and_a_live_ones_kept(tmp_path, llm, capturer):
    """A write killed outright (SIGKILL, SIGTERM: no finally) left its temporary folder, gigabytes
    at a corpus's scale, beside the store for good; index builds removed theirs."""
    import subprocess
    import sys

    from attnrank.files import hold_writer_lock

    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)
    killed = tmp_path / f".float16.tmp-{dead}-0f5c592d"
    (killed / "keys.npy").parent.mkdir()
    (killed / "keys.npy").write_bytes(b"x" * 1000)
    live = tmp_path / f".float16.tmp-{dead}-1a2b3c4d"  # (its writer on another machine holds its lock)
    live.mkdir()
    lock = hold_writer_lock(live)
    try:
        build(tmp_path, llm, capturer, "float16")
    finally:
        if lock is not None:
            os.close(lock)
    assert not killed.exists() and live.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["float16", live.name])


def test_a_latent_attention_model_is_refused_before_anything_is_stored(tmp_path):
    """DeepSeek's latent attention keeps keys and values of two widths: a store of its states was
    written whole, then every open refused it as damaged (and advised a rebuild, which did the same)."""
    from _tiny import tiny_latent_attention_model, tiny_tokenizer

    from attnrank.errors import ModelError

    capturer = AttentionCapturer(tiny_latent_attention_model(), [(1, 0)])
    docs = [Document("a", "hello world"), Document("b", "another passage")]
    with pytest.raises(ModelError, match="one head size.*use attention='full'"):
        write_store(tmp_path / "ps", capturer, tiny_tokenizer(), docs, model_id="t", fingerprint="t")
    assert not (tmp_path / "ps").exists() and not list(tmp_path.iterdir())


def test_a_store_is_on_disk_before_it_is_renamed_into_place(tmp_path, llm, capturer, monkeypatch):
    """Outside an index build (whose atomic folder syncs everything) the header and offsets were
    renamed into place unsynced: a power loss could leave an empty states.json that every open
    refuses and remove_store does not remove."""
    from attnrank.llm import statestore_write

    synced: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(statestore_write, "fsync_tree", lambda root: synced.append(("tree", sorted(os.listdir(root)))))
    monkeypatch.setattr(statestore_write, "fsync_folder", lambda folder: synced.append(("folder", [str(folder)])))
    folder = tmp_path / "sub" / "ps"
    write_store(folder, capturer, llm.tokenizer, DOCS, model_id="tiny", fingerprint=llm.fingerprint)
    assert synced[0] == ("tree", ["keys.npy", "offsets.npy", "states.json", "values.npy"])  # every file, before
    assert synced[1] == ("folder", [str(folder.parent)]) and folder.is_dir()  # the rename, after


def _written_by(folder, encoder):
    header = json.loads((folder / "states.json").read_text())
    if encoder is None:
        del header["encoder"]  # a store written before the field
    else:
        header["encoder"] = encoder
    (folder / "states.json").write_text(json.dumps(header))


def test_a_store_from_an_earlier_encoder_serves_only_models_it_encoded_alike(tmp_path, llm, capturer):
    """Stores written before block states were fixed for length-following rotary (and int8, sliding
    windows, layers without rotary) hold states encoded otherwise for such models: refused for them,
    still served to a model the fixes did not touch."""
    from _tiny import tiny_longrope_model

    from attnrank.llm.models import LLM

    folder = build(tmp_path, llm, capturer, "float16")
    assert json.loads((folder / "states.json").read_text())["encoder"] == 2
    _written_by(folder, None)
    assert open_store(folder, llm, capturer).served == 0  # a plain model: opens as before
    _written_by(folder, 3)
    with pytest.raises(InputError, match="newer attnrank"):
        open_store(folder, llm, capturer)

    model = tiny_longrope_model(max_positions=2048, switch=1024)
    longrope = LLM(model=model, tokenizer=llm.tokenizer, model_id="tiny-longrope", fingerprint="l" * 64)
    rope_capturer = AttentionCapturer(model, [(1, 0)])
    folder = build(tmp_path / "longrope", longrope, rope_capturer, "float16")
    assert open_store(folder, longrope, rope_capturer).served == 0
    _written_by(folder, None)
    with pytest.raises(InputError, match="earlier attnrank .* rebuild"):
        open_store(folder, longrope, rope_capturer)


def test_an_earlier_encoders_store_is_refused_for_int8_and_sliding_window_models(tmp_path, llm):
    from attnrank.llm.quantize import int8_available, quantize_int8

    sliding = copy.deepcopy(llm.model)
    sliding.config.sliding_window, sliding.config.use_sliding_window = 4096, True
    models = {"sliding": sliding}
    if int8_available():
        models["int8"] = copy.deepcopy(llm.model)
        quantize_int8(models["int8"])
    for name, model in models.items():
        capturer = AttentionCapturer(model, HEADS)
        folder = build(tmp_path / name, llm, capturer, "float16")
        assert open_store(folder, llm, capturer).served == 0
        _written_by(folder, None)
        with pytest.raises(InputError, match="earlier attnrank"):
            open_store(folder, llm, capturer)
    # a field the store's digest covers but no encoder fix touched (here unread by Llama) opens as before
    scaled = copy.deepcopy(llm.model)
    scaled.config.query_pre_attn_scalar = 64
    capturer = AttentionCapturer(scaled, HEADS)
    folder = build(tmp_path / "scaled", llm, capturer, "float16")
    _written_by(folder, None)
    assert open_store(folder, llm, capturer).served == 0
    # a store for another setup is named as such, not as an earlier encoder's
    with pytest.raises(InputError, match="max_doc_words"):
        open_store(tmp_path / "sliding" / "float16", llm, AttentionCapturer(sliding, HEADS), max_doc_words=3)


def test_what_a_store_refuses_is_found_before_anything_is_encoded():
    """An index build writes its store last: a passage past a sliding window (or a latent-attention
    model) was refused after the whole corpus had been embedded. check_store finds both first."""
    from _tiny import tiny_latent_attention_model, tiny_model, tiny_tokenizer

    from attnrank.errors import ModelError
    from attnrank.llm.statestore_write import check_store

    docs = [Document("a", "hello world"), Document("b", " ".join(["word"] * 400))]
    sliding = AttentionCapturer(tiny_model("mistral", sliding_window=1024, max_positions=4096), [(1, 0)])
    with pytest.raises(InputError, match="reaches this model's sliding window of 1024"):
        check_store(sliding, tiny_tokenizer(), docs)
    check_store(sliding, tiny_tokenizer(), docs, max_doc_words=5)  # cut below the window: fine
    with pytest.raises(ModelError, match="one head size"):
        check_store(AttentionCapturer(tiny_latent_attention_model(), [(1, 0)]), tiny_tokenizer(), docs)


def test_a_store_attnrank_wrote_is_removed_file_by_file(tmp_path, monkeypatch):
    """The store's own files are unlinked one by one and the folder removed empty: a file that
    appears in it after the check (a user's, saved there meanwhile) stops the removal and stays."""
    import pathlib

    from attnrank.llm.statestore_write import remove_store

    folder = tmp_path / "ps"
    folder.mkdir()
    (folder / "states.json").write_text('{"format": "attnrank-passage-states"}')
    (folder / "keys.npy").write_bytes(b"x")
    remove_store(folder)
    assert not folder.exists()

    folder.mkdir()
    (folder / "states.json").write_text('{"format": "attnrank-passage-states"}')
    listed = pathlib.Path.iterdir

    def then_a_file_appears(self):
        names = list(listed(self))
        (folder / "notes.txt").write_text("keep me")
        return iter(names)

    monkeypatch.setattr(pathlib.Path, "iterdir", then_a_file_appears)
    with pytest.raises(OSError):
        remove_store(folder)
    assert (folder / "notes.txt").read_text() == "keep me" and not (folder / "states.json").exists()
