"""The per-model artifact store: retrieval-head sets and everything else learned per model
(head weights, the sentence probe, slot profiles), with one save/load protocol.

A head set is only valid for the weights it was detected on, so every entry is keyed by the
model id and :attr:`attnrank.llm.models.LLM.fingerprint` (hub commit, or the sha256 of a GGUF or of
a folder's weight and defining files, :mod:`attnrank.llm.fingerprint`). A
registry document (JSON) holds one model's entries::

    {"format": "attnrank-heads/1", "model_id": "...", "fingerprint": "...",
     "sets": [{"name", "method", "heads": ["l-h", ...], "scores": [[...L x H...]] | null,
               "data", "date", "params", "n_layers", "n_heads"}, ...],
     "artifacts": {"<kind>": {"date": "...", "payload": {...}}}}

Two sources: *shipped* sets inside the package (``attnrank/heads/data/*.json``, each a document
or ``{"models": [document, ...]}``) and *user* detections under
``config.cache_dir()/heads/`` (one file per model and fingerprint, written atomically). A
shipped document may use ``"fingerprint": "*"`` (any weights of that model, e.g. the sets
QRHead released for Llama-3.1-8B-Instruct); it then matches by the model id's last path
component, case-insensitively.

``resolve_heads("auto", llm)`` picks one set, in this preference order:

1. user registry before shipped sets (a user detection overrides what ships);
2. an exact fingerprint before a ``"*"`` match;
3. by method: ``qr-ndcg`` (QRHead's BEIR selection), ``qr-score`` (QRHead LME), ``contrastive``
   (CoRe), then any other method, ``copy`` (Wu et al. NIAH copy-paste) last: QRHead reports
   that query-focused detection suits reranking better than NIAH copy-paste;
4. the newest date.

``"auto:METHOD"`` restricts the choice to one method. Artifacts — ``"head-weights"``
(:class:`~attnrank.rerank.learned.LearnedHeadWeights`), ``"slot-profiles"``
(:mod:`attnrank.rerank.position`), ``"sentence-probe"`` (:class:`~attnrank.prune.probe.SentenceProbe`) —
are stored by :func:`~attnrank.registry_save.save_artifact` / :func:`load_artifact` (or a
:class:`~attnrank.artifacts.RegistryArtifact`'s ``save``/``load``) with the same precedence. This
module reads; :mod:`attnrank.registry_save` writes the user registry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import config
from .errors import InputError
from .llm.headspec import HeadList, parse_heads

logger = logging.getLogger(__name__)

FORMAT = "attnrank-heads/1"
ANY_FINGERPRINT = "*"
METHOD_PREFERENCE = ("qr-ndcg", "qr-score", "contrastive")  # then others, then "copy"
SHIPPED_DIR = Path(__file__).parent / "heads" / "data"


@dataclass
class HeadSet:
    """One registered head set. ``scores`` is the optional full ``[L][H]`` score matrix
    (None entries = not measured); ``source`` is ``"user"`` or ``"shipped"`` (not stored)."""

    method: str
    heads: list[str]
    model_id: str
    fingerprint: str
    name: str = ""
    scores: list[list[float | None]] | None = None
    data: str = ""
    date: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    n_layers: int | None = None
    n_heads: int | None = None
    source: str = "user"
    path: str = ""

    @property
    def pairs(self) -> HeadList:
        return parse_heads(self.heads) or []

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("model_id", "fingerprint", "source", "path"):
            out.pop(key)
        return out


def user_dir() -> Path:
    """Where user detections live: ``config.cache_dir()/heads``."""
    return config.cache_dir() / "heads"


def _slug(model_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", model_id.strip("/")).strip("_")[-80:] or "model"


def _base(model_id: str) -> str:
    """A model's name as the shipped head sets match it: the last path part, lower-cased, without
    Meta's "meta-" prefix (ICR's scripts load ``meta-llama/Meta-Llama-3.1-8B-Instruct``, whose
    sets ship as ``Llama-3.1-8B-Instruct``)."""
    return model_id.rstrip("/").split("/")[-1].lower().removeprefix("meta-")


def user_file(model_id: str, fingerprint: str, root: Path | None) -> Path:
    # (a fingerprint is hex; any other character is replaced, so that no "/.." leads out of the root)
    return (root or user_dir()) / f"{_slug(model_id)}-{re.sub(r'[^0-9A-Za-z]', '_', fingerprint[:12])}.json"


def _read_docs(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8 text
        logger.warning("skipping head registry file %s: %s", path, e)
        return []
    docs = data.get("models", [data]) if isinstance(data, dict) else []
    docs = [d for d in docs if isinstance(d, dict) and d.get("format") == FORMAT] if isinstance(docs, list) else []
    good = [d for d in docs if well_formed(d)]
    if len(good) < len(docs):
        logger.warning("skipping %d malformed head registry document(s) in %s", len(docs) - len(good), path)
    return good


def well_formed(doc: dict[str, Any]) -> bool:
    """A document whose keys have the types the readers rely on (a non-empty fingerprint)."""
    return (
        isinstance(doc.get("model_id"), str)
        and isinstance(doc.get("fingerprint"), str)
        and bool(doc["fingerprint"])
        and isinstance(doc.get("sets", []), list)
        and isinstance(doc.get("artifacts", {}), dict)
    )


def _matches(doc: dict[str, Any], model_id: str, fingerprint: str) -> int:
    """2: same weights; 1: a ``"*"`` entry for a model of the same name; 0: no match."""
    fp = doc.get("fingerprint", "")
    if fp == fingerprint and fp != ANY_FINGERPRINT:
        return 2
    return int(fp == ANY_FINGERPRINT and _base(doc.get("model_id", "")) == _base(model_id))


def _documents(
    model_id: str,
    fingerprint: str,
    root: Path | None,
    shipped_only: bool = False,
    holds: Callable[[dict[str, Any]], bool] = lambda doc: True,
):
    """(source, match level, path, doc) for every matching document, user files first (none with
    ``shipped_only``); where the user registry holds what the lookup reads (``holds``) for the
    model's id under other fingerprints only, that is warned of once. (Read per kind: once any
    entry was saved under the new fingerprint, weights left under the old one fell back to equal
    weights without a word.)"""
    roots = [("user", root or user_dir()), ("shipped", SHIPPED_DIR)][1 if shipped_only else 0 :]
    for source, folder in roots:
        others: list[tuple[Path, str]] = []
        found = False
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            for doc in _read_docs(path):
                level = _matches(doc, model_id, fingerprint)
                if level:
                    found = found or holds(doc)
                    yield source, level, path, doc
                elif source == "user" and doc["model_id"] == model_id and holds(doc):
                    others.append((path, doc["fingerprint"]))
        if others and not found:
            _warn_other_fingerprints(model_id, fingerprint, others)


_WARNED: set[tuple[str, str]] = set()


def _warn_other_fingerprints(model_id: str, fingerprint: str, others: list[tuple[Path, str]]) -> None:
    """Say (once per model and fingerprint) that what a user registered for ``model_id`` is keyed
    by other weights: a lookup that finds nothing falls back (equal weights, all heads), which
    would otherwise pass for the user's own trained weights."""
    if (model_id, fingerprint) in _WARNED:
        return
    _WARNED.add((model_id, fingerprint))
    path, other = others[0]
    logger.warning(
        "the head registry holds entries for %r under another fingerprint (%s, in %s; this model's is %s): they "
        "are not used. The model's weights, configuration or tokenizer differ from those they were made for (or "
        "they were made before 2026-12-06, when a local folder's fingerprint hashed its weight files alone); "
        "retrain them for this model, or load the one they were made for",
        model_id,
        other[:12],
        path,
        fingerprint[:12],
    )


def load_head_sets(model_id: str, fingerprint: str, *, root: Path | None = None) -> list[HeadSet]:
    """Every head set registered for this model and fingerprint, best first (see module doc)."""
    found = []
    for source, level, path, doc in _documents(model_id, fingerprint, root, holds=lambda d: bool(d.get("sets"))):
        for entry in doc.get("sets", []):
            try:
                if not isinstance(entry, dict):
                    raise TypeError(f"entry {entry!r} is not an object")
                hs = HeadSet(
                    model_id=doc["model_id"],
                    fingerprint=doc["fingerprint"],
                    source=source,
                    path=str(path),
                    **{k: v for k, v in entry.items() if k in _ENTRY_KEYS},
                )
                if not all(isinstance(v, str) for v in (hs.method, hs.name, hs.date)):
                    raise TypeError("method, name and date must be strings")
                if not isinstance(hs.heads, list) or not all(isinstance(h, str) for h in hs.heads) or not hs.pairs:
                    raise TypeError(f"heads {hs.heads!r} is not a non-empty list of 'layer-head' strings")
            except (TypeError, KeyError, InputError) as e:
                logger.warning("skipping a malformed head set in %s: %s", path, e)
                continue
            found.append((source != "user", -level, _method_rank(hs.method), hs))
    found.sort(key=lambda t: t[-1].date, reverse=True)  # newest first, then (stable) the ranks
    found.sort(key=lambda t: t[:3])
    return [t[-1] for t in found]


_ENTRY_KEYS = {"name", "method", "heads", "scores", "data", "date", "params", "n_layers", "n_heads"}


def _method_rank(method: str) -> int:
    if method in METHOD_PREFERENCE:
        return METHOD_PREFERENCE.index(method)
    return len(METHOD_PREFERENCE) + (1 if method == "copy" else 0)


def _detect_hint(model_id: str) -> str:
    return (
        f"detect them with `attnrank heads detect --method qr --model {model_id} "
        "--dataset scifact --data DIR` (query-focused, QRHead) or `--method copy` "
        "(Wu et al. copy-paste), or pass explicit heads ('all', 'l-h,l-h' or a JSON file)"
    )


def resolve_heads(spec: str, llm: Any, *, root: Path | None = None) -> HeadList:
    """``"auto"`` or ``"auto:METHOD"`` → the preferred registered head set of ``llm`` (an
    :class:`~attnrank.llm.models.LLM` or anything with ``model_id`` and ``fingerprint``)."""
    kind, _, method = spec.strip().partition(":")
    if kind.lower() != "auto":
        raise InputError(f"head spec {spec!r} is not 'auto' or 'auto:METHOD'")
    every = load_head_sets(llm.model_id, llm.fingerprint, root=root)
    method = method.strip().lower()  # (a method's name in any case, as "auto" itself)
    sets = [s for s in every if s.method.lower() == method] if method else every
    if not sets:
        what = f"{method!r} head set" if method else "head set"
        registered = sorted({s.method for s in every})
        # (the sets there are, by method: `heads detect --method qr` registers qr-score, qr-ndcg and contrastive)
        hint = f"registered: {', '.join(f'auto:{m}' for m in registered)}" if registered else _detect_hint(llm.model_id)
        raise InputError(
            f"heads='{spec}': no {what} is registered for model {llm.model_id!r} "
            f"(fingerprint {llm.fingerprint[:12]}) in {root or user_dir()} or the "
            f"shipped sets; {hint}"
        )
    best = sets[0]
    logger.info(
        "heads='%s' -> %s set %r of %s (%s, %d heads)",
        spec,
        best.source,
        best.name,
        llm.model_id,
        best.method,
        len(best.heads),
    )
    return best.pairs


def load_artifact(
    kind: str,
    model_id: str,
    fingerprint: str,
    *,
    root: Path | None = None,
    user_only: bool = False,
    shipped_only: bool = False,
) -> dict[str, Any] | None:
    """The ``kind`` payload registered for this model (user before shipped, exact fingerprint
    before ``"*"``, then the newest), or None; ``user_only``: a user's, never a shipped one;
    ``shipped_only``: a shipped one (the user registry is not read, nor warned of)."""
    best = None
    for source, level, _, doc in _documents(
        model_id, fingerprint, root, shipped_only, lambda d: kind in d.get("artifacts", {})
    ):
        if user_only and source != "user":
            continue
        item = doc.get("artifacts", {}).get(kind)
        if isinstance(item, dict) and "payload" in item:
            key, date = (source != "user", -level), str(item.get("date", ""))
            # the same weights may be registered under several ids (paths): the newest wins
            if best is None or key < best[0] or (key == best[0] and date > best[1]):
                best = (key, date, item["payload"])
    return None if best is None else best[2]


def load_user_artifacts(
    kind: str, model_id: str, fingerprint: str, *, root: Path | None = None
) -> list[dict[str, Any]]:
    """Every ``kind`` payload the user registered for this model, under each id it was saved with
    (one set of weights saved as ``models/m`` and as ``/work/models/m``), in the order of
    :func:`load_artifact`'s choice reversed: ``"*"`` entries before exact ones, older before newer
    (a caller merging them lets the later win)."""
    found = []
    for source, level, _, doc in _documents(
        model_id, fingerprint, root, holds=lambda d: kind in d.get("artifacts", {})
    ):
        item = doc.get("artifacts", {}).get(kind)
        if source == "user" and isinstance(item, dict) and "payload" in item:
            found.append((level, str(item.get("date", "")), item["payload"]))
    return [payload for _, _, payload in sorted(found, key=lambda f: (f[0], f[1]))]


def registered_artifacts(model_id: str, fingerprint: str, *, root: Path | None = None) -> list[dict[str, Any]]:
    """Every artifact registered for this model (user and shipped, any kind), each as ``{"kind",
    "source", "date", "trained_on"}``, by kind and then in :func:`load_artifact`'s preference (the
    first of a kind is the one read): what ``attnrank heads show`` lists beside the head sets."""
    found = []
    for source, level, _, doc in _documents(model_id, fingerprint, root, holds=lambda d: bool(d.get("artifacts"))):
        for kind, item in (doc.get("artifacts") or {}).items():
            if not isinstance(item, dict) or "payload" not in item:
                continue
            payload = item["payload"]
            trained = payload.get("trained_on", "") if isinstance(payload, dict) else ""
            date = str(item.get("date", ""))
            found.append(((str(kind), source != "user", -level), date, str(kind), source, str(trained or "")))
    found.sort(key=lambda f: f[1], reverse=True)  # newest first within a key (a stable sort keeps it)
    found.sort(key=lambda f: f[0])
    return [{"kind": k, "source": src, "date": d, "trained_on": t} for _, d, k, src, t in found]


def shipped_artifact(kind: str, model_id: str) -> dict[str, Any] | None:
    """The ``kind`` payload shipped with attnrank for a model named ``model_id`` (any weights),
    or None: a fallback for models that have none of their own."""
    for path in sorted(SHIPPED_DIR.glob("*.json")) if SHIPPED_DIR.is_dir() else []:
        for doc in _read_docs(path):
            item = doc.get("artifacts", {}).get(kind)
            if _base(doc.get("model_id", "")) == _base(model_id) and isinstance(item, dict) and "payload" in item:
                return item["payload"]
    return None


_FUSED = "fused-weights"  # (FusedWeights.KIND, of a layer above this one)


def registry_digest(model_id: str, fingerprint: str, *, root: Path | None = None) -> str:
    """SHA-256 of everything the registry holds for this model (its head sets and artifacts, user
    and shipped, the shipped fallbacks for its name, and the packaged model's shipped fused weights
    where it has none of its own, which it is scored with then): what a reranker without explicit heads and
    weights reads. A batch resume compares it, so rows scored with other registered heads or
    weights are never mixed with new ones."""
    held: list[Any] = [(source, path.name, doc) for source, _, path, doc in _documents(model_id, fingerprint, root)]
    for path in sorted(SHIPPED_DIR.glob("*.json")) if SHIPPED_DIR.is_dir() else []:
        held += [
            ("fallback", path.name, d) for d in _read_docs(path) if _base(d.get("model_id", "")) == _base(model_id)
        ]
    if load_artifact(_FUSED, model_id, fingerprint, root=root) is None:  # what fused weights it reads then
        held.append(("fallback fused weights", shipped_artifact(_FUSED, config.DEFAULT_LLM)))
    return hashlib.sha256(json.dumps(held, sort_keys=True, default=str).encode()).hexdigest()
