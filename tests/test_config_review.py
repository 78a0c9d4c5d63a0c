"""Environment overrides read by attnrank.config."""

from __future__ import annotations

import pytest

from attnrank.config import cpu_auto_dtype, hardware_bf16, set_torch_threads
from attnrank.errors import InputError


@pytest.mark.parametrize("value", ["0", "abc", "-2", "1.5"])
def test_bad_attnrank_threads_is_a_one_line_input_error(monkeypatch, value):
    """Before: int('abc') raised a bare ValueError and '0' torch's RuntimeError, neither naming the variable."""
    monkeypatch.setenv("ATTNRANK_THREADS", value)
    with pytest.raises(InputError, match=rf"ATTNRANK_THREADS='{value}' is not a whole number >= 1.*unset it"):
        set_torch_threads()


def test_bad_cpu_dtype_is_an_input_error(monkeypatch):
    monkeypatch.setenv("ATTNRANK_CPU_DTYPE", "float8")
    with pytest.raises(InputError, match="ATTNRANK_CPU_DTYPE='float8' is not one of"):
        cpu_auto_dtype()


def test_bfloat16_hardware_is_amx_or_avx512_bf16():
    assert hardware_bf16({"amx_bf16": True, "avx512_bf16": False})
    assert hardware_bf16({"amx_bf16": False, "avx512_bf16": True})  # AMD Zen 4: 1.9x faster than float32
    assert not hardware_bf16({"amx_bf16": False, "avx512_bf16": False, "avx512_f": True})
    assert not hardware_bf16({})


def test_folder_variables_expand_home_and_treat_empty_as_unset(monkeypatch, tmp_path):
    """ATTNRANK_HOME="" put the registry in ./heads of whatever folder attnrank ran from; "~/x" (an
    env file does not expand it) made a folder named "~"."""
    from pathlib import Path

    from attnrank.config import cache_dir, index_root

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("ATTNRANK_HOME", "")
    monkeypatch.setenv("ATTNRANK_INDEX_DIR", "  ")
    assert cache_dir() == Path.home() / ".cache" / "attnrank" and index_root() == Path("indexes")
    monkeypatch.setenv("ATTNRANK_HOME", "~/ah")
    assert cache_dir() == tmp_path / "ah"
