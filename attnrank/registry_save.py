"""Writing to the user registry (:mod:`attnrank.registry`): head sets and per-model artifacts,
each model's document rewritten atomically under a lock, and only a file attnrank wrote for that
model (a user's own JSON of that name is refused, never replaced)."""

from __future__ import annotations

import datetime as _dt
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import InputError
from .files import atomic_path, check_file_target, held_lock
from .llm.headspec import check_head_range, format_heads, parse_heads
from .registry import FORMAT, HeadSet, user_file, well_formed

logger = logging.getLogger("attnrank.registry")  # (the registry's own, as before the split)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    with atomic_path(path) as tmp:  # fsynced: the file holds detections and trained artifacts
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")


_USER_KEYS = {"format", "model_id", "fingerprint", "sets", "artifacts"}  # what a user file attnrank wrote holds


def _load_user_doc(path: Path, model_id: str, fingerprint: str) -> dict[str, Any]:
    """The user registry document at ``path`` for this model (a new one if there is none), to be
    rewritten with one more set or artifact. Refused (InputError) unless the file is one that
    attnrank wrote for this model and weights: rewriting anything else would lose or re-key it."""
    if not path.exists() or (path.is_file() and path.stat().st_size == 0):  # an empty file holds nothing
        return {"format": FORMAT, "model_id": model_id, "fingerprint": fingerprint, "sets": [], "artifacts": {}}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        doc, why = None, f"is not readable JSON ({e})"
    else:
        why = _foreign(doc, model_id, fingerprint)
    if why:
        raise InputError(
            f"the head registry file {path} {why}, so saving to it would lose or re-key what it holds; "
            "move it away (or delete it) and save again"
        )
    return {"sets": [], "artifacts": {}, **doc}  # a file may hold only one of the two


def _foreign(doc: Any, model_id: str, fingerprint: str) -> str:
    """Why ``doc`` is not a user registry document attnrank wrote for this model ("" if it is)."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return f"is not one {FORMAT} document"
    extra = sorted(set(doc) - _USER_KEYS)
    if extra:
        return f"holds keys attnrank does not write ({', '.join(map(str, extra))})"
    if not well_formed(doc):
        return "is malformed (model_id, fingerprint, sets or artifacts of the wrong type)"
    # (a file may hold no sets yet; a save read .get of each entry: a traceback)
    if not all(isinstance(s, dict) for s in doc.get("sets", [])):
        return "holds a head set entry that is not an object"
    if (doc["model_id"], doc["fingerprint"]) != (model_id, fingerprint):
        return f"belongs to {doc['model_id']!r} with fingerprint {doc['fingerprint'][:12]}…, not to {model_id!r}"
    return ""


@contextmanager
def _updated_user_doc(model_id: str, fingerprint: str, root: Path | None) -> Iterator[tuple[Path, dict[str, Any]]]:
    """The user registry document of this model (:func:`_load_user_doc`), written back after the
    block changed it, with the file locked from the read to the write. Why the lock: two saves
    (``heads detect`` and ``train`` finishing together) each read the file and renamed their own
    version over it, and the first one's entry was lost."""
    path = user_file(model_id, fingerprint, root)
    check_file_target(path, "the head registry file")  # (a root that is a file: FileExistsError at the lock)
    with held_lock(path.with_name(f".{path.name}.lock")):
        doc = _load_user_doc(path, model_id, fingerprint)
        yield path, doc
        _write_json(path, doc)


def check_saveable(model_id: str, fingerprint: str, *, root: Path | None = None) -> None:
    """Raise InputError now if saving a head set or artifact for this model would be refused
    (an unreadable or foreign user registry file) or could not be written (a read-only folder, a
    file where a folder would be): a command that trains first checks this before it spends the time."""
    path = user_file(model_id, fingerprint, root)
    _load_user_doc(path, model_id, fingerprint)
    check_file_target(path, "the head registry file")


def save_head_set(
    model_id: str,
    fingerprint: str,
    method: str,
    heads: Any,
    *,
    name: str | None = None,
    scores: Any = None,
    data: str = "",
    params: dict[str, Any] | None = None,
    date: str | None = None,
    n_layers: int | None = None,
    n_heads: int | None = None,
    root: Path | None = None,
) -> Path:
    """Add (or replace, by ``name``, default = ``method``) a head set in the user registry.

    ``heads``: anything :func:`parse_heads` accepts; ``scores``: optional ``L×H`` array (NaN =
    not measured). Returns the registry file written."""
    if not fingerprint:
        raise InputError(
            f"model {model_id!r} has an empty fingerprint; a head set must be keyed "
            "by the weights it was detected on (use LLM.fingerprint)"
        )
    pairs = parse_heads(heads)
    if not pairs:
        raise InputError(f"no heads to save for {model_id!r} ({method}); pass at least one 'layer-head'")
    matrix = None
    if scores is not None:
        matrix = [[None if v is None or v != v else float(v) for v in row] for row in scores]  # NaN -> null
        n_layers, n_heads = len(matrix), len(matrix[0]) if matrix else 0
    if n_layers and n_heads:  # a head the model does not have failed only when a reranker read the set
        check_head_range(pairs, n_layers, n_heads)
    entry = HeadSet(
        method=method,
        heads=format_heads(pairs).split(","),
        model_id=model_id,
        fingerprint=fingerprint,
        name=name or method,
        scores=matrix,
        data=data,
        date=date or _dt.datetime.now().isoformat(timespec="microseconds"),
        params=dict(params or {}),
        n_layers=n_layers,
        n_heads=n_heads,
    )
    with _updated_user_doc(model_id, fingerprint, root) as (path, doc):
        replaced = [s for s in doc["sets"] if s.get("name") == entry.name]
        doc["sets"] = [s for s in doc["sets"] if s.get("name") != entry.name] + [entry.to_json()]
    for old in replaced:  # (sets are named after their method: a second detection replaced the first silently)
        logger.warning(
            "head set %r of %s replaced: the one detected %s%s; give another name to keep both",
            entry.name,
            model_id,
            old.get("date", "at an unknown date"),
            f" on {old['data']}" if old.get("data") else "",
        )
    logger.info("saved %d %s heads of %s to %s", len(pairs), method, model_id, path)
    return path


def save_artifact(
    kind: str, model_id: str, fingerprint: str, payload: dict[str, Any], *, root: Path | None = None
) -> Path:
    """Store a per-model JSON ``payload`` under ``kind`` (e.g. ``"head-weights"``,
    ``"likelihood-weights"``) in the user registry, replacing the previous one of that kind (with a
    warning naming it: the user's earlier weights are gone)."""

    def replacing(current: dict[str, Any] | None) -> dict[str, Any]:
        if current is not None and current != payload:
            trained = current.get("trained_on") if isinstance(current, dict) else None
            # (a user's weights are gone: warned; a registry folder given, as the benchmarks re-ship to
            # the package's, is replaced on purpose: logged)
            logger.log(
                logging.WARNING if root is None else logging.INFO,
                "replacing the %s registered for %s in %s%s",
                kind,
                model_id,
                user_file(model_id, fingerprint, root),
                f" (trained on {trained})" if trained else "",
            )
        return payload

    return update_artifact(kind, model_id, fingerprint, replacing, root=root)


def update_artifact(
    kind: str,
    model_id: str,
    fingerprint: str,
    update: Callable[[dict[str, Any] | None], dict[str, Any]],
    *,
    root: Path | None = None,
) -> Path:
    """Store ``update(current)`` under ``kind`` in the user registry, ``current`` being the payload
    this model's user registry file holds now (None if none), read and replaced with the file
    locked, so that two updates (e.g. slot profiles of two sizes) keep each other's. Never the
    shipped payload: copied into the user's file, it would hide what a later release ships under a
    frozen copy; nor another file's (another id of the same weights), which it would copy here."""
    if not kind or not fingerprint:
        raise InputError(f"artifact kind {kind!r} and fingerprint {fingerprint!r} must be non-empty")
    with _updated_user_doc(model_id, fingerprint, root) as (path, doc):
        item = doc["artifacts"].get(kind)
        payload = update(item.get("payload") if isinstance(item, dict) else None)  # (a malformed one: replaced)
        doc["artifacts"][kind] = {"date": _dt.datetime.now().isoformat(timespec="microseconds"), "payload": payload}
    return path
