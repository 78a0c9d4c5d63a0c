"""Tests of attnrank.llm.tokenizers: a model's tokenizer read alone, before its weights load."""

from __future__ import annotations

import json
import os
import struct

import pytest
from _tiny import save_tiny

from attnrank.errors import ModelError
from attnrank.llm.models import load_llm
from attnrank.llm.tokenizers import load_tokenizer

pytestmark = pytest.mark.usefixtures("isolated_home")


def test_a_truncated_gguf_is_named_when_its_tokenizer_is_read_alone(tmp_path):
    """The check of a prompt budget reads the tokenizer before the model: a GGUF cut short raised
    struct.error there, where loading the model names the file and the fix."""
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(struct.pack("<4sIQQ", b"GGUF", 3, 0, 1) + struct.pack("<Q", 5) + b"ab")
    with pytest.raises(ModelError, match="cannot load the tokenizer"):
        load_tokenizer(str(cut))


def test_the_tokenizer_alone_reads_a_model_named_as_load_llm_reads_it(tmp_path, monkeypatch):
    """load_tokenizer took "~/m" (and " ~/m ") as a hub id: the tokenizer of a model load_llm
    loads failed to load alone."""
    monkeypatch.setenv("HOME", str(tmp_path))
    save_tiny(tmp_path / "m", layers=1)
    for name in ("~/m", " ~/m "):
        assert load_tokenizer(name)("abc")["input_ids"]


def test_a_folders_tokenizer_is_read_once_until_its_files_change(tmp_path):
    """A command's checks and its model load read one tokenizer (``ask`` read SmolLM2's three times)."""
    folder = save_tiny(tmp_path / "m", layers=1)
    first = load_tokenizer(str(folder))
    assert load_tokenizer(str(folder)) is first
    assert load_llm(str(folder), dtype="float32").tokenizer is first
    settings = folder / "tokenizer_config.json"
    changed = {**json.loads(settings.read_text()), "model_max_length": 77}
    settings.write_text(json.dumps(changed))
    os.utime(settings, ns=(settings.stat().st_atime_ns, settings.stat().st_mtime_ns + 1_000_000))
    again = load_tokenizer(str(folder))
    assert again is not first and again.model_max_length == 77
    # rewritten at the same size with its modification time set back (cp -p, rsync -t): read again
    before = settings.stat()
    settings.write_text(json.dumps({**changed, "model_max_length": 78}))
    os.utime(settings, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert settings.stat().st_size == before.st_size and settings.stat().st_mtime_ns == before.st_mtime_ns
    assert load_tokenizer(str(folder)).model_max_length == 78
