"""Faster CPU embedding: the sentence-transformers model exported once to ONNX, run by ONNX
Runtime or OpenVINO.

Why not ``SentenceTransformer(..., backend="onnx"|"openvino")``: those backends go through
Optimum (``optimum-onnx`` needs transformers < 4.58, ``optimum-intel`` 2.2 needs < 5.6), which
cannot be installed beside the transformers 5.x attnrank requires. The export here needs only
torch's own ONNX exporter (``torch.onnx.export``, dynamo; with ``onnx`` and ``onnxscript``) and the
runtimes (``onnxruntime``, ``openvino``), all current.

What is exported: the model's transformer *and* its pooling (mean, CLS or max, from the
model's ``Pooling`` module) as one graph ``(input_ids, attention_mask[, token_type_ids]) ->
sentence embedding``; :meth:`ExportedEmbedder.encode` tokenizes with the model's own tokenizer
and ``max_seq_length``, runs the graph and L2-normalises, like ``SentenceTransformer.encode``.
Backends (:data:`BACKENDS`): ``onnx`` (float32, ONNX Runtime), ``onnx-int8`` (the same graph with
int8 weights, ONNX Runtime's dynamic quantization), ``openvino`` (the float32 graph compiled by
OpenVINO in float32) and ``openvino-bf16`` (the same graph run by OpenVINO in bfloat16, fast on
CPUs with AMX or AVX512-BF16). ``torch-bf16`` (no export: the torch model cast to bfloat16) is
handled by :func:`attnrank.index.embed.load_embedder`. Speed and nDCG@10 of each on SciFact:
docs/results/index_build.md.

The export is cached in ``config.cache_dir()/embedders/<name>-<variant>-<key12>/`` like the
de-quantized LLM (:mod:`attnrank.llm.gguf`): the key hashes the model's files (weights, config,
tokenizer, modules), the variant, :data:`EXPORT_VERSION` and the versions of torch, onnx and
onnxscript (onnxruntime too for int8), so a changed model or exporter never reuses a stale graph;
one process exports at a time (a lock file beside the folder); the folder is written to a
temporary sibling, checked against the torch model's embeddings, synced and swapped in
atomically; on load its recorded key and every file's SHA-256 must match, else it is exported again.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..config import cache_dir, thread_count
from ..errors import InputError, ModelError, require
from ..files import file_sha256, fsync_folder, fsync_tree, held_lock, remove_killed_builds, sibling
from .folders import swap_in

logger = logging.getLogger(__name__)

BACKENDS = ("torch", "torch-bf16", "onnx", "onnx-int8", "openvino", "openvino-bf16")
EXPORT_VERSION = 2  # bump when the exported graph or the folder layout changes (2: every file hashed)
_EXTRA = {"onnx": "onnx", "onnx-int8": "onnx", "openvino": "openvino", "openvino-bf16": "openvino"}
_RUNTIME = {"onnx": "onnxruntime", "onnx-int8": "onnxruntime", "openvino": "openvino", "openvino-bf16": "openvino"}
_OPENVINO_PRECISION = {"openvino": "f32", "openvino-bf16": "bf16"}
_META = "attnrank.json"
_GRAPH = "model.onnx"
_SOURCE_SUFFIXES = (".safetensors", ".bin", ".json", ".txt", ".model")
CHECK_TEXTS = ("A short sentence.", "Vitamin D deficiency and the risk of bone fractures in older adults.", "x")


def check_backend(backend: str) -> str:
    """``backend`` if it is one of :data:`BACKENDS`, else an :class:`InputError` naming them."""
    if backend not in BACKENDS:
        raise InputError(f"embed backend {backend!r} is not one of {BACKENDS}; use 'torch' (the default) or 'onnx'")
    return backend


# -- the cache key and folder ------------------------------------------------------------------
def source_digest(model_path: str | Path) -> str:
    """SHA-256 over the model folder's files that define it (weights, configs, tokenizer, modules)."""
    root = Path(model_path)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in _SOURCE_SUFFIXES)
    if not files:
        raise ModelError(f"{root}: no model files found to export; give a local sentence-transformers model folder")
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.relative_to(root).as_posix()}:{file_sha256(p)}\n".encode())
    return h.hexdigest()


def export_key(model_path: str | Path, variant: str) -> str:
    """What an export depends on: the model's files, the variant, the exporter (:data:`EXPORT_VERSION`)
    and the versions of what writes the graph (torch, onnx, onnxscript; onnxruntime quantizes int8)
    and of what defines the traced forward and the tokenizer saved beside it (transformers,
    sentence-transformers): an upgrade of either kept reading a graph traced by the one before."""
    parts = [source_digest(model_path), variant, str(EXPORT_VERSION), *_exporter_versions(variant)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _exporter_versions(variant: str) -> list[str]:
    packages = [
        "torch",
        "onnx",
        "onnxscript",
        "transformers",
        "sentence-transformers",
        *(["onnxruntime"] if variant == "onnx-int8" else []),
    ]
    out = []
    for name in packages:
        try:
            out.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{name} none")
    return out


def export_dir(model_path: str | Path, variant: str, key: str) -> Path:
    return cache_dir() / "embedders" / f"{Path(model_path).name}-{variant}-{key[:12]}"


def cached_export(folder: Path, key: str) -> str | None:
    """Why ``folder`` cannot be used for ``key`` (None: it can): absent, incomplete, foreign or
    damaged (a file of the export, the graph or the tokenizer's, missing, added or changed)."""
    try:
        meta = json.loads((folder / _META).read_text())
    except (OSError, ValueError):
        return "no complete export"
    if meta.get("key") != key:
        return f"it was exported for key {str(meta.get('key'))[:12]}, not {key[:12]}"
    recorded = meta.get("files_sha256")
    found = _file_hashes(folder)
    if not isinstance(recorded, dict) or _GRAPH not in recorded or found != recorded:
        changed = sorted(set(found) ^ set(recorded or {}) | {f for f in found if found[f] != (recorded or {}).get(f)})
        return f"its files fail their SHA-256 check ({', '.join(changed) or 'none recorded'})"
    return None


def _file_hashes(folder: Path) -> dict[str, str]:
    """SHA-256 of every file of an export folder but its record."""
    return {
        p.relative_to(folder).as_posix(): file_sha256(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != _META
    }


# -- export ------------------------------------------------------------------------------------
def _pooling_mode(st: Any) -> str:
    """The pooling of a [Transformer, Pooling(, Normalize)] sentence-transformers model."""
    names = [type(m).__name__ for m in st]
    if names not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise InputError(
            f"the ONNX/OpenVINO embed backends export Transformer + Pooling (+ Normalize) models; this "
            f"model has modules {names}; use embed backend 'torch'"
        )
    cfg = st[1].get_config_dict()
    mode = cfg.get("pooling_mode")
    if mode is None:  # sentence-transformers < 6: one boolean per mode
        modes = [m for m in ("cls", "mean", "max") if cfg.get(f"pooling_mode_{m}_token" + ("s" if m != "cls" else ""))]
        mode = modes[0] if len(modes) == 1 else None
    if mode not in ("mean", "cls", "max"):
        raise InputError(f"pooling {cfg} is not mean, cls or max; use embed backend 'torch'")
    return str(mode)


def _dimension(st: Any) -> int:
    get = getattr(st, "get_embedding_dimension", None) or st.get_sentence_embedding_dimension  # renamed in 6.x
    return int(get() or 0)


def _pooled_module(st: Any, mode: str) -> Any:
    import torch

    class Pooled(torch.nn.Module):
        """Transformer + pooling as one module: token states -> one vector per text (unnormalised)."""

        def __init__(self) -> None:
            super().__init__()
            self.transformer = st[0].auto_model

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            kw = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
            h = self.transformer(input_ids=input_ids, attention_mask=attention_mask, **kw).last_hidden_state
            if mode == "cls":
                return h[:, 0]
            mask = attention_mask.unsqueeze(-1).to(h.dtype)
            if mode == "max":
                return h.masked_fill(mask == 0, -1e9).max(dim=1).values
            return (h * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)

    return Pooled().eval()


def build_export(model_path: str | Path, variant: str, folder: Path, key: str) -> None:
    """Export ``model_path`` to ``folder`` (``variant`` ``onnx`` or ``onnx-int8``), atomically and checked."""
    import torch
    from sentence_transformers import SentenceTransformer

    require("onnxscript", "onnx", "exporting the embedder to ONNX")
    start = time.perf_counter()
    st = SentenceTransformer(str(model_path), device="cpu", local_files_only=True)
    mode = _pooling_mode(st)
    tokenizer = st.tokenizer
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in tokenizer.model_input_names]
    enc = tokenizer(list(CHECK_TEXTS), padding=True, truncation=True, return_tensors="pt")
    max_len = int(st.max_seq_length or tokenizer.model_max_length)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence", max=max(max_len, 2))
    folder.parent.mkdir(parents=True, exist_ok=True)
    # (named by this process, as the GGUF cache's builds are: a killed export's graph, hundreds of
    # MB, was left for good under a mkdtemp name; the next export, under the lock, removes it)
    remove_killed_builds(folder, "an embedder export")
    tmp = sibling(folder, "tmp")
    tmp.mkdir(mode=0o755)
    try:
        module = _pooled_module(st, mode)
        with torch.no_grad():
            torch.onnx.export(
                module,
                (),
                str(tmp / "float32.onnx"),
                kwargs={n: enc[n] for n in names},
                input_names=names,
                output_names=["sentence_embedding"],
                dynamic_shapes={n: {0: batch, 1: seq} for n in names},
                dynamo=True,
                external_data=False,
            )
        graph = tmp / _GRAPH
        if variant == "onnx-int8":
            quantization = require("onnxruntime.quantization", "onnx", "the int8 ONNX embedder")
            quantization.quantize_dynamic(
                str(tmp / "float32.onnx"), str(graph), weight_type=quantization.QuantType.QInt8, per_channel=True
            )
            (tmp / "float32.onnx").unlink()
        else:
            (tmp / "float32.onnx").rename(graph)
        tokenizer.save_pretrained(tmp)
        meta = {
            "key": key,
            "source": str(model_path),
            "variant": variant,
            "inputs": names,
            "pooling": mode,
            "max_seq_length": max_len,
            "dim": int(_dimension(st)),
            "torch": torch.__version__,
            "export_version": EXPORT_VERSION,
            "exporters": _exporter_versions(variant),
            "files_sha256": _file_hashes(tmp),
        }
        (tmp / _META).write_text(json.dumps(meta, indent=1))
        _verify(st, tmp, variant)
        fsync_tree(tmp)  # durable before it is swapped in: a power loss must not leave a torn export
        # a stale or damaged export (the caller checked, holding the lock) is exchanged in one rename:
        # a reader that passed its check without the lock never finds the folder missing
        old = swap_in(tmp, folder)
        fsync_folder(folder.parent)
        if old is not None and old != tmp:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("exported %s to %s (%s) in %.1f s", Path(model_path).name, folder, variant, time.perf_counter() - start)


def _verify(st: Any, folder: Path, variant: str) -> None:
    """The export must reproduce the torch model's embeddings (float32: to 1e-4; int8: cosine >= 0.98)."""
    ref = st.encode(list(CHECK_TEXTS), convert_to_numpy=True, normalize_embeddings=True)
    got = ExportedEmbedder(folder, "onnx").encode(list(CHECK_TEXTS))
    if variant == "onnx-int8":
        worst = float(np.min(np.sum(ref * got, axis=1)))
        ok, what = worst >= 0.98, f"lowest cosine to the float32 embeddings {worst:.4f} (limit 0.98)"
    else:
        worst = float(np.max(np.abs(ref - got)))
        ok, what = worst <= 1e-4, f"largest difference from the torch embeddings {worst:.2e} (limit 1e-4)"
    if not ok:
        raise ModelError(
            f"the {variant} export in {folder} does not reproduce the model: {what}; use embed backend 'torch'"
        )


# -- run ---------------------------------------------------------------------------------------
class ExportedEmbedder:
    """An exported embedder with ``SentenceTransformer.encode``'s interface (what :func:`attnrank.index.embed.encode` calls)."""

    def __init__(self, folder: Path, backend: str):
        self.folder, self.backend = Path(folder), backend
        self.meta = json.loads((self.folder / _META).read_text())
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.folder, local_files_only=True)
        self.max_seq_length = int(self.meta["max_seq_length"])
        self._run = self._openvino() if backend in _OPENVINO_PRECISION else self._onnxruntime()

    def _onnxruntime(self):
        ort = require("onnxruntime", _EXTRA[self.backend], f"embed backend {self.backend!r}")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = thread_count()
        opts.inter_op_num_threads = 1
        session = ort.InferenceSession(str(self.folder / _GRAPH), opts, providers=["CPUExecutionProvider"])
        return lambda feeds: session.run(None, feeds)[0]

    def _openvino(self):
        ov = require("openvino", "openvino", f"embed backend {self.backend!r}")
        core = ov.Core()
        settings = {
            "INFERENCE_NUM_THREADS": thread_count(),
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": _OPENVINO_PRECISION[self.backend],
        }
        compiled = core.compile_model(core.read_model(str(self.folder / _GRAPH)), "CPU", settings)
        return lambda feeds: compiled(feeds)[compiled.output(0)]

    def get_sentence_embedding_dimension(self) -> int:
        return int(self.meta["dim"])

    def encode(
        self,
        texts: list[str],
        *,
        batch_size: int = 64,
        show_progress_bar: bool = False,
        convert_to_numpy: bool = True,
        normalize_embeddings: bool = True,
    ) -> np.ndarray:
        """Embeddings of ``texts`` in their order (longest first in batches, as sentence-transformers does)."""
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.zeros((len(texts), int(self.meta["dim"])), dtype=np.float32)
        starts = range(0, len(texts), batch_size)
        if show_progress_bar:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc=f"embed ({self.backend})", unit="batch")
        for s in starts:
            idx = order[s : s + batch_size]
            enc = self.tokenizer(
                [texts[i] for i in idx],
                padding=True,
                truncation=True,
                max_length=self.max_seq_length,
                return_tensors="np",
            )
            feeds = {n: np.asarray(enc[n], dtype=np.int64) for n in self.meta["inputs"]}
            out[idx] = self._run(feeds)
        if normalize_embeddings:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out


def require_runtime(backend: str) -> None:
    """The runtime of an exported ``backend`` (onnxruntime, OpenVINO), or the ImportError naming its extra."""
    require(_RUNTIME[backend], _EXTRA[backend], f"embed backend {backend!r}")


def load_exported(model_path: str | Path, backend: str) -> ExportedEmbedder:
    """The embedder of ``model_path`` for ``backend`` (exported on first use, then read from the cache)."""
    require_runtime(backend)
    variant = "onnx-int8" if backend == "onnx-int8" else "onnx"  # OpenVINO compiles the float32 graph
    key = export_key(model_path, variant)
    folder = export_dir(model_path, variant, key)
    if cached_export(folder, key) is not None:
        # one exporter at a time: another process's finished export is kept, not replaced while read
        with held_lock(folder.with_name(f".{folder.name}.lock")):
            why = cached_export(folder, key)
            if why is not None:
                if folder.exists():
                    logger.warning("not reusing the embedder export in %s (%s); exporting again", folder, why)
                build_export(model_path, variant, folder, key)
    return ExportedEmbedder(folder, backend)
