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
    # where no home is known, the folder set is read (Path.home() raised first, a RuntimeError traceback)
    monkeypatch.setenv("ATTNRANK_HOME", str(tmp_path / "set"))

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert cache_dir() == tmp_path / "set"


def _sysfs(root, cores: dict[int, str], cgroup: dict[str, str]):
    """A sysfs tree the test builds: each CPU's core (its core_cpus_list) and cgroup files."""
    for cpu, siblings in cores.items():
        topology = root / f"devices/system/cpu/cpu{cpu}/topology"
        topology.mkdir(parents=True)
        (topology / "core_cpus_list").write_text(siblings + "\n")
    for name, text in cgroup.items():
        path = root / "fs/cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return root


def test_torch_threads_are_the_physical_cores_within_the_cpu_quota(tmp_path, monkeypatch):
    """Threads were the logical CPUs of the affinity: both SMT siblings of a core (they share its
    matrix units) and, under `docker --cpus=2` on a 64-CPU host, 64 threads for 2 CPUs of quota."""
    from attnrank.config import compute_threads

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    smt = {c: f"{c - c % 2}-{c - c % 2 + 1}" for c in range(8)}  # 4 cores of 2 threads
    assert compute_threads(_sysfs(tmp_path / "a", smt, {})) == 4
    own = {c: str(c) for c in range(8)}
    assert compute_threads(_sysfs(tmp_path / "b", own, {"cpu.max": "200000 100000"})) == 2
    assert compute_threads(_sysfs(tmp_path / "c", own, {"cpu.max": "150000 100000"})) == 2  # (1.5 CPUs: 2)
    assert compute_threads(_sysfs(tmp_path / "d", own, {"cpu.max": "max 100000"})) == 8
    v1 = {"cpu/cpu.cfs_quota_us": "300000", "cpu/cpu.cfs_period_us": "100000"}
    assert compute_threads(_sysfs(tmp_path / "e", own, v1)) == 3
    v1_none = {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}
    assert compute_threads(_sysfs(tmp_path / "f", own, v1_none)) == 8
    assert compute_threads(tmp_path / "no-sysfs") == 8  # (no topology, no quota: the CPUs it may run on)
