"""Objects stored as one per-model artifact of the head registry (:mod:`attnrank.registry`):
the :class:`RegistryArtifact` mixin that learned head weights, fused weights and the sentence
probe share, and the check that the settings they were fitted with are the ones they score with."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar

from .errors import InputError
from .registry import load_artifact
from .registry_save import save_artifact

logger = logging.getLogger(__name__)


def warn_if_scored_otherwise(label: str, recorded: int | None, moved: bool, current: int, retrain: str) -> None:
    """Log a warning where the ``label`` were fitted to scores of version ``recorded`` of attnrank's
    scoring, and the scores they read have ``moved`` since (:func:`attnrank.rerank.versions.scores_moved`;
    ``current``: :data:`attnrank.rerank.versions.SCORING_VERSION`): they still score, but not as they measured."""
    if not moved:
        return
    logger.warning(
        "the %s were fitted to scores of version %d of attnrank's scoring; this attnrank computes version %d "
        "(attnrank.rerank.versions.SCORING_VERSION), whose scores they read moved since, so they do not score as "
        "they measured; retrain them with %s",
        label,
        recorded,
        current,
        retrain,
    )


def warn_if_set_otherwise(label: str, recorded: dict[str, Any] | None, now: dict[str, Any], retrain: str) -> None:
    """Log a warning naming each setting in ``recorded`` (how the ``label``, e.g. ``"fused weights"``,
    were fitted: the attention prompt and how it is read) that ``now`` (a reranker's) gives otherwise:
    they still score, but not as they measured. Nothing recorded (fitted before it was): not checked."""
    changed = [
        f"{k}={v!r} (this reranker: {now[k]!r})"
        for k, v in sorted((recorded or {}).items())
        if k in now and now[k] != v
    ]
    if changed:
        logger.warning(
            "the %s were fitted with %s, so they do not score as they measured; use those options, or retrain them with %s",
            label,
            ", ".join(changed),
            retrain,
        )


def _plain(value: Any) -> Any:
    """``value`` with numpy arrays and numbers (``.tolist()``/``.item()``) made Python's, in lists,
    tuples and dict values too."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class RegistryArtifact:
    """Mixin for a per-model object stored as one registry artifact: a subclass sets ``KIND``
    (the artifact key), ``LABEL`` and ``HINT`` (for the error when none is registered), is a
    dataclass, and implements ``from_json(data)``."""

    KIND: ClassVar[str] = ""
    LABEL: ClassVar[str] = ""
    HINT: ClassVar[str] = ""
    RENAMED: ClassVar[dict[str, str]] = {}  # a field's stored name in an earlier release -> its name now

    @classmethod
    def current_fields(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Stored ``data`` with the fields an earlier release wrote under another name (``RENAMED``)
        under their name now, so that artifacts registered before a rename still load."""
        out = dict(data)
        for old, new in cls.RENAMED.items():
            if old in out and new not in out:
                out[new] = out.pop(old)
        return out

    def to_json(self) -> dict[str, Any]:
        """The dataclass fields as JSON-ready values: numpy arrays and numbers, at any depth (in
        a list of weights, in ``metrics``), as Python's lists and numbers. Why at any depth: the
        numbers a trainer computes are often numpy's, which ``json`` refuses, and the save failed
        after the whole training."""
        return {k: _plain(v) for k, v in asdict(self).items()}  # type: ignore[call-overload]

    def save(self, model_id: str, fingerprint: str, *, root: Path | None = None) -> Path:
        """Register this object for the model (user registry, or ``root``); returns the file."""
        return save_artifact(self.KIND, model_id, fingerprint, self.to_json(), root=root)

    @classmethod
    def load(cls, model_id: str, fingerprint: str, *, root: Path | None = None) -> Any:
        """The object registered for this model (user before shipped, exact fingerprint first)."""
        data = load_artifact(cls.KIND, model_id, fingerprint, root=root)
        if data is None:
            # (the 12 characters that file names and messages show were taken for the fingerprint)
            short = len(fingerprint) < 64 and fingerprint != "*"
            raise InputError(
                f"no {cls.LABEL} in the head registry for model {model_id!r} (fingerprint "
                f"{fingerprint[:12]}); {cls.HINT}"
                + (
                    f" (a fingerprint is the 64 hex characters of LLM.fingerprint, not {fingerprint!r}, the start "
                    "shown in file names)"
                    if short
                    else ""
                )
            )
        return cls.from_json(data)  # type: ignore[attr-defined]
