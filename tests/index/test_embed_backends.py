"""Tests of the exported embed backends (attnrank.index.embed_export) on a tiny random sentence encoder."""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from _tiny import save_tiny_encoder
from typer.testing import CliRunner

from attnrank.cli import app
from attnrank.errors import IndexFormatError, InputError, MissingExtraError
from attnrank.index import embed_export
from attnrank.index.embed import clear_embedders, encode, load_embedder
from attnrank.index.retriever import HybridRetriever
from attnrank.types import Document

SENTENCES = [
    "the cat sat on the mat",
    "  vitamin d and bone fractures in older adults  ",
    "a",
    "paris is the capital of france and the seine flows through it " * 6,  # truncated at max_seq_length
]


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory) -> Path:
    return save_tiny_encoder(tmp_path_factory.mktemp("enc") / "tiny-encoder")


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNRANK_HOME", str(tmp_path / "home"))
    clear_embedders()
    yield
    clear_embedders()


def _export_folder(model: Path, variant: str = "onnx") -> Path:
    key = embed_export.export_key(model, variant)
    return embed_export.export_dir(model, variant, key)


def test_onnx_embeddings_equal_torch(encoder_dir):
    ref = encode(load_embedder(str(encoder_dir)), SENTENCES)
    got = encode(load_embedder(str(encoder_dir), "cpu", "onnx"), SENTENCES, batch_size=3)
    assert got.shape == ref.shape == (4, 32)
    np.testing.assert_allclose(got, ref, atol=1e-4)
    folder = _export_folder(encoder_dir)
    meta = json.loads((folder / "attnrank.json").read_text())
    assert meta["pooling"] == "mean" and meta["max_seq_length"] == 24 and "token_type_ids" in meta["inputs"]


def test_openvino_embeddings_equal_torch(encoder_dir):
    pytest.importorskip("openvino")
    ref = encode(load_embedder(str(encoder_dir)), SENTENCES)
    np.testing.assert_allclose(encode(load_embedder(str(encoder_dir), "cpu", "openvino"), SENTENCES), ref, atol=1e-4)
    bf16 = encode(load_embedder(str(encoder_dir), "cpu", "openvino-bf16"), SENTENCES)
    assert np.min(np.sum(bf16 * ref, axis=1)) > 0.99
    np.testing.assert_allclose(np.linalg.norm(bf16, axis=1), 1.0, atol=1e-5)


def test_int8_and_bf16_stay_close_and_unit_norm(encoder_dir):
    ref = encode(load_embedder(str(encoder_dir)), SENTENCES)
    for backend in ("onnx-int8", "torch-bf16"):
        got = encode(load_embedder(str(encoder_dir), "cpu", backend), SENTENCES)
        assert not np.array_equal(got, ref)
        assert np.min(np.sum(got * ref, axis=1)) > 0.98
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_a_foreign_or_damaged_export_is_not_reused(encoder_dir, caplog):
    embed_export.load_exported(encoder_dir, "onnx")
    folder = _export_folder(encoder_dir)
    meta_file = folder / "attnrank.json"
    meta = json.loads(meta_file.read_text())
    meta_file.write_text(json.dumps({**meta, "key": "0" * 64}))  # exported for another model
    assert "exported for key 000000000000" in embed_export.cached_export(folder, meta["key"])
    with caplog.at_level(logging.WARNING):
        embed_export.load_exported(encoder_dir, "onnx")
    assert "not reusing" in caplog.text
    assert json.loads(meta_file.read_text())["key"] == meta["key"]
    graph = folder / "model.onnx"
    graph.write_bytes(graph.read_bytes()[:-10] + b"0123456789")  # damaged
    assert "SHA-256" in embed_export.cached_export(folder, meta["key"])
    got = encode(embed_export.load_exported(encoder_dir, "onnx"), SENTENCES)
    np.testing.assert_allclose(got, encode(load_embedder(str(encoder_dir)), SENTENCES), atol=1e-4)


def test_a_changed_tokenizer_file_of_the_export_is_not_reused(encoder_dir):
    """Every file of the export is hashed, not only the graph: the tokenizer it runs with too."""
    embed_export.load_exported(encoder_dir, "onnx")
    folder = _export_folder(encoder_dir)
    key = json.loads((folder / "attnrank.json").read_text())["key"]
    assert embed_export.cached_export(folder, key) is None
    (folder / "tokenizer_config.json").write_text("{}")
    assert "tokenizer_config.json" in embed_export.cached_export(folder, key)
    (folder / "extra.txt").write_text("x")
    assert "extra.txt" in embed_export.cached_export(folder, key)


@pytest.mark.parametrize("package", ["onnxscript", "transformers", "sentence-transformers"])
def test_the_export_key_names_the_exporters_versions(encoder_dir, monkeypatch, package):
    """transformers and sentence-transformers define the traced forward and the tokenizer saved
    with it: after an upgrade of either, the graph traced by the one before was still read."""
    before = embed_export.export_key(encoder_dir, "onnx-int8")
    real = embed_export.importlib.metadata.version
    monkeypatch.setattr(embed_export.importlib.metadata, "version", lambda n: "0.0.0" if n == package else real(n))
    assert embed_export.export_key(encoder_dir, "onnx-int8") != before


def test_a_second_process_keeps_a_finished_export_it_waited_for(encoder_dir, monkeypatch):
    """Two processes asking for one export: the second waits on the lock, then finds the first's
    folder complete and reads it, instead of deleting it (while the first reads it) to export again."""
    import threading

    folder = _export_folder(encoder_dir)
    key = embed_export.export_key(encoder_dir, "onnx")
    calls = []
    real_build = embed_export.build_export

    def slow_build(*args):
        calls.append(threading.current_thread().name)
        real_build(*args)

    monkeypatch.setattr(embed_export, "build_export", slow_build)
    threads = [threading.Thread(target=embed_export.load_exported, args=(encoder_dir, "onnx"), name=n) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and embed_export.cached_export(folder, key) is None


def test_a_changed_model_gets_a_new_export(encoder_dir, tmp_path):
    copy = tmp_path / "tiny-encoder"
    shutil.copytree(encoder_dir, copy)
    before = embed_export.export_key(copy, "onnx")
    assert embed_export.export_key(copy, "onnx-int8") != before
    cfg = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**cfg, "layer_norm_eps": 1e-6}))  # a changed model file
    assert embed_export.export_key(copy, "onnx") != before


def test_the_manifest_records_the_backend(encoder_dir, tmp_path):
    docs = [Document(f"d{i}", s) for i, s in enumerate(SENTENCES)]
    r = HybridRetriever(embedder=str(encoder_dir), embed_backend="onnx").index(docs, show_progress=False)
    path = r.save(tmp_path / "ix")
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["dense"]["backend"] == "onnx"
    loaded = HybridRetriever.load(path)
    assert loaded.embed_backend == loaded.dense.backend == "onnx"
    assert loaded.search("cat on the mat", k=1, mode="dense")[0].id == "d0"
    assert HybridRetriever.load(path, embed_backend="torch").dense.backend == "torch"
    # saved again after a load whose queries run torch: the vectors are still onnx's (it recorded torch)
    again = HybridRetriever.load(path, embed_backend="torch").save(tmp_path / "ix2")
    assert json.loads((again / "manifest.json").read_text())["dense"]["backend"] == "onnx"
    del manifest["dense"]["backend"]  # an index built before the setting existed: torch
    (path / "manifest.json").write_text(json.dumps(manifest))
    assert HybridRetriever.load(path).embed_backend == "torch"


def test_cli_index_embed_backend(encoder_dir, tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": s}) + "\n" for i, s in enumerate(SENTENCES)))
    args = ["index", str(corpus), "--index-dir", str(tmp_path / "ix"), "--embedder", str(encoder_dir), "-q"]
    r = CliRunner().invoke(app, [*args, "--embed-backend", "onnx"])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "ix" / "manifest.json").read_text())["dense"]["backend"] == "onnx"
    r = CliRunner().invoke(app, [*args, "--embed-backend", "tensorrt"])
    assert r.exit_code == 2 and "'tensorrt' is not one of" in " ".join(r.output.split())


def test_bad_backend_and_missing_extra(encoder_dir, monkeypatch):
    with pytest.raises(InputError, match="embed backend 'onnx2'"):
        load_embedder(str(encoder_dir), "cpu", "onnx2")
    with pytest.raises(InputError, match="runs on CPU"):
        load_embedder(str(encoder_dir), "cuda", "onnx")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if the extra were not installed
    with pytest.raises(MissingExtraError, match=r"pip install 'attnrank\[onnx\]'"):
        load_embedder(str(encoder_dir), "cpu", "onnx")
    monkeypatch.setitem(sys.modules, "openvino", None)
    with pytest.raises(ImportError, match=r"pip install 'attnrank\[openvino\]'"):
        load_embedder(str(encoder_dir), "cpu", "openvino")


def test_an_embedder_replaced_since_the_build_is_refused(encoder_dir, tmp_path):
    model = tmp_path / "encoder"
    shutil.copytree(encoder_dir, model)
    docs = [Document(f"d{i}", t) for i, t in enumerate(SENTENCES)]
    HybridRetriever(embedder=str(model)).index(docs, show_progress=False).save(tmp_path / "idx")
    # The same model through another backend embeds the probe alike: accepted.
    HybridRetriever.load(tmp_path / "idx", embed_backend="onnx").search(SENTENCES[0], k=2, mode="dense")
    shutil.rmtree(model)
    save_tiny_encoder(model, seed=1)  # same path, same dimension, another vector space
    clear_embedders()
    r = HybridRetriever.load(tmp_path / "idx")
    assert r.search(SENTENCES[0], k=2, mode="bm25").documents()  # BM25 needs no embedder
    with pytest.raises(InputError, match=r"embeds a probe text differently .* the model changed since the build"):
        r.search(SENTENCES[0], k=2, mode="dense")
    # nor are the index's vectors read for the reranker's dense signal (they were, beside the new query vectors)
    from attnrank.rerank.signals import SignalComputer

    with pytest.raises(InputError, match=r"embeds a probe text differently .* the model changed since the build"):
        SignalComputer(str(model)).use_index(r)


def test_an_index_built_with_a_relative_embedder_path_loads_from_another_folder(encoder_dir, tmp_path, monkeypatch):
    """The manifest recorded './encoder' as given: searched from any other working directory
    (or by a batch actor), the index failed with 'no such local model folder'."""
    build, elsewhere = tmp_path / "build", tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copytree(encoder_dir, build / "encoder")
    monkeypatch.chdir(build)
    docs = [Document(f"d{i}", t) for i, t in enumerate(SENTENCES)]
    HybridRetriever(embedder="./encoder").index(docs, show_progress=False).save(tmp_path / "idx")
    monkeypatch.chdir(elsewhere)
    clear_embedders()
    r = HybridRetriever.load(tmp_path / "idx")
    assert r.embedder == str((build / "encoder").resolve())
    assert r.search(SENTENCES[0], k=2, mode="dense").documents()[0].id == "d0"
    assert HybridRetriever(embedder="org/not-a-local-folder").embedder == "org/not-a-local-folder"


def test_a_bad_embed_backend_at_load_names_the_argument_not_the_index(encoder_dir, tmp_path):
    docs = [Document(f"d{i}", t) for i, t in enumerate(SENTENCES)]
    HybridRetriever(embedder=str(encoder_dir)).index(docs, show_progress=False).save(tmp_path / "idx")
    with pytest.raises(InputError, match="embed backend 'bogus' is not one of") as e:  # was: rebuild the index
        HybridRetriever.load(tmp_path / "idx", embed_backend="bogus")
    assert not isinstance(e.value, IndexFormatError)


def test_an_export_removes_what_killed_exports_left(encoder_dir):
    """An export killed midway left its tempfile-named folder (its graph, hundreds of MB for a real
    model) for good; exports name theirs by their process now, and the next one removes a killed
    one's, as the GGUF cache's builds do. Another cache's folder stays."""
    import subprocess
    import sys

    embed_export.load_exported(encoder_dir, "onnx")
    folder = _export_folder(encoder_dir)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    killed = folder.with_name(f".{folder.name}.tmp-{int(gone.stdout)}-0123abcd")
    older = folder.with_name(f".{folder.name}.tmp-k3_9zq1x")
    other = folder.with_name(f".other-export.tmp-{int(gone.stdout)}-0123abcd")
    for p in (killed, older, other):
        p.mkdir()
        (p / "float32.onnx").write_bytes(b"half")
    meta = folder / "attnrank.json"
    meta.write_text(meta.read_text().replace('"key"', '"key_"', 1))  # not reusable: exported again
    embed_export.load_exported(encoder_dir, "onnx")
    assert not killed.exists() and not older.exists() and other.is_dir()
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}.tmp-")]
