"""Positional calibration of attention scores: the model's per-slot attention profile.

Attention Basin / AttnRank (Yi et al., arXiv 2508.05128): an LLM reading a list of items gives
more attention to those near the start and end of the list (the "basin"), whatever their
content. AttnRank profiles this once per model on a calibration set and then places the most
relevant documents at the highest-attention slots before generation. No code or exact
aggregation of that paper is public; what follows is our reconstruction:

- :func:`~attnrank.rerank.profile.measure_slot_profile`: prompts of ``n_slots`` documents drawn at random from a pool,
  with a content-free query; per prompt slot (position ``0..n_slots−1``, 0 = first document in
  the prompt), the mean and std over trials of the reranker's document score. With random
  documents in random slots, content averages out and what remains is what a slot gets for
  being that slot. A reranker with ``calibrate=False`` (and no token filter) measures the raw
  attention each slot receives: the basin itself (``SlotProfile.calibrated`` False). A
  calibrated one measures what is left of it after ICR's calibration (the "N/A" pass shares
  most of the positional bias and cancels it): the residual bias its scores carry.
- :func:`slot_correct`: subtract each slot's bias (profile value at the slot minus the mean over
  slots) from the scores of a window (found-in-the-middle style calibration), from a profile
  measured as the reranker scores (calibrated or not).
- :func:`reorder_for_generation`: AttnRank's basin permutation of a best-first list, from a raw
  attention profile (a calibrated one is refused: its residual is not the basin).

A profile measured at ``n_slots`` is applied to a prompt of ``K`` documents by linear
interpolation: slot ``k`` of ``K`` reads the profile at fractional slot ``k·(n_slots−1)/(K−1)``
(first and last slots map onto each other). This is an approximation: score magnitudes shrink
as ``K`` grows (the query's attention is shared by more documents), so measure the profile at
the ``K`` actually used where possible. Profiles are stored with the head registry
(:mod:`attnrank.registry`, artifact ``"slot-profiles"``, one entry per ``n_slots`` and calibration): the
default model's ship inside the package, :func:`store_profile` writes user ones, and
``load_profile("auto", model_id, fingerprint, n_slots=K)`` picks the registered profile whose
``n_slots`` is closest to ``K``. A profile can also be saved to / loaded from its own JSON file.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..files import atomic_path, check_file_target, refuse_replacing
from ..registry import load_artifact, load_user_artifacts
from ..registry_save import update_artifact
from ..types import is_count, refuse_one_passage

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1


@dataclass(frozen=True)
class SlotProfile:
    """Mean (and std) document score per prompt slot, for one model.

    ``mean_score[k]``/``std[k]``: over ``n_trials`` random prompts, of the score of the document
    at prompt position ``k`` (0 = first in the prompt). ``date``: ISO-8601 UTC time of measuring.
    ``adapter``: the head adapter merged into the model it was measured on (``LLM.adapter``; such a
    profile is saved to a file and used, never registered as the base weights'). ``calibrated``:
    measured on calibrated scores (real − "N/A"), else on raw attention (the basin that
    :func:`reorder_for_generation` reads). A profile saved before the field existed reads as
    calibrated, as the reranker's default and every shipped one was; one measured with
    ``calibrate=False`` before then must be measured again. ``heads``: the heads whose scores it
    measured (``"all"``, or ``"l-h,l-h"``): a slot bias is on the scale of a sum over those heads
    (a profile saved before the field existed reads as all heads, as every shipped one was measured).
    """

    n_slots: int
    mean_score: tuple[float, ...]
    std: tuple[float, ...]
    model_id: str
    fingerprint: str
    n_trials: int
    date: str
    adapter: str = ""
    calibrated: bool = True
    heads: str = "all"

    def __post_init__(self) -> None:
        for name in ("n_slots", "n_trials"):  # ("3" raised a TypeError at the comparison, -1 trials passed)
            if not is_count(getattr(self, name)):
                raise InputError(f"slot profile {name}={getattr(self, name)!r} must be an integer >= 1")
        object.__setattr__(self, "mean_score", tuple(float(x) for x in self.mean_score))
        object.__setattr__(self, "std", tuple(float(x) for x in self.std))
        if self.n_slots < 1 or len(self.mean_score) != self.n_slots or len(self.std) != self.n_slots:
            raise InputError(
                f"slot profile has n_slots={self.n_slots} but {len(self.mean_score)} means and "
                f"{len(self.std)} stds; all three must agree (n_slots >= 1)"
            )
        if not isinstance(self.calibrated, bool):  # (JSON "false" as a string would read as True)
            raise InputError(f"slot profile calibrated={self.calibrated!r} is not true or false; measure it again")
        if not all(math.isfinite(x) for x in self.mean_score + self.std):
            raise InputError("slot profile holds non-finite values; measure it again")
        if any(x < 0 for x in self.std):
            raise InputError(f"slot profile std={self.std!r} holds a negative deviation; measure it again")

    def curve(self, k: int) -> np.ndarray:
        """The mean score per slot resampled to ``k`` slots (linear interpolation)."""
        return resample_profile(self.mean_score, k)

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT_VERSION, **asdict(self)}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> SlotProfile:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(f"slot profile is not valid JSON ({e}); measure and save it again") from e
        if not isinstance(data, dict) or data.pop("format", None) != FORMAT_VERSION:
            raise InputError(f"slot profile is not of format version {FORMAT_VERSION}; measure and save it again")
        try:
            return cls(**data)
        except (TypeError, ValueError) as e:  # (ValueError: a value that is no number, e.g. ["x"])
            raise InputError(f"slot profile fields are wrong ({e}); measure and save it again") from e

    def save(self, path: str | Path) -> Path:
        """Write the profile's JSON to ``path`` atomically; a file there that is not a slot
        profile is refused, never replaced."""
        path = Path(path)
        check_file_target(path, "slot profile path")
        refuse_replacing(path, _is_profile, "a slot profile", "slot profile path")
        with atomic_path(path) as tmp:
            tmp.write_text(self.to_json(), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> SlotProfile:
        path = Path(path)
        if not path.is_file():
            raise InputError(f"slot profile file {str(path)!r} does not exist; measure one with measure_slot_profile")
        return cls.from_json(path.read_text(encoding="utf-8"))


def _is_profile(path: Path) -> bool:
    try:
        SlotProfile.load(path)
    except (InputError, OSError, UnicodeDecodeError):
        return False
    return True


ARTIFACT = "slot-profiles"


def load_profile(
    profile: SlotProfile | str | Path,
    model_id: str = "",
    fingerprint: str = "",
    *,
    n_slots: int | None = None,
    root: Path | None = None,
    calibrated: bool = True,
) -> SlotProfile:
    """A profile given as an object, the path of its JSON file, or ``"auto"``: the one registered
    for ``model_id``/``fingerprint`` with ``n_slots`` closest to ``n_slots`` (the largest when
    None), of calibrated scores or raw attention (``calibrated``)."""
    if isinstance(profile, SlotProfile):
        return profile
    if str(profile) == "auto":
        return load_stored_profile(model_id, fingerprint, n_slots=n_slots, root=root, calibrated=calibrated)
    return SlotProfile.load(profile)


def store_profile(profile: SlotProfile, *, root: Path | None = None) -> Path:
    """Register ``profile`` with its model's head-registry entry (replacing one of the same
    ``n_slots`` and calibration, with a warning where that one was measured on other heads); ``root``: the registry folder (default: the user registry). Returns the file."""
    if profile.adapter:  # the registry keys it by the fingerprint, which the adapted copy keeps
        raise InputError(
            f"this slot profile was measured on {profile.model_id} with head adapter {profile.adapter} merged in; "
            "the registry keys profiles by the base weights, so save it to a file (profile.save) and pass that, "
            "or measure it on the model without the adapter to register it"
        )

    key = _key(profile.n_slots, profile.calibrated)

    def with_this_one(stored: dict[str, Any] | None) -> dict[str, Any]:
        profiles = dict((stored or {}).get("profiles", {}))
        replaced = profiles.pop(key, None)
        heads = replaced.get("heads", "all") if isinstance(replaced, dict) else None
        if heads is not None and heads != profile.heads:  # (one profile per slot count: the other heads' goes)
            logger.warning(
                "replacing the registered %d-slot %s profile of %s measured on heads %s by this one of heads %s; "
                "a reranker reading the other heads is warned that it corrects on another scale (save one of them to "
                "a file to keep both)",
                profile.n_slots,
                "calibrated" if profile.calibrated else "raw",
                profile.model_id,
                heads,
                profile.heads,
            )
        profiles[key] = json.loads(profile.to_json())
        return {"profiles": profiles}

    return update_artifact(ARTIFACT, profile.model_id, profile.fingerprint, with_this_one, root=root)


_RAW = "-raw"  # the registry key's suffix of a raw attention profile (calibrated ones: the slot count alone)


def _key(n_slots: int, calibrated: bool) -> str:
    return f"{n_slots}{'' if calibrated else _RAW}"


def load_stored_profile(
    model_id: str,
    fingerprint: str,
    *,
    n_slots: int | None = None,
    root: Path | None = None,
    calibrated: bool = True,
) -> SlotProfile:
    """The registered profile of this model closest to ``n_slots`` slots, of calibrated scores or
    of raw attention (``calibrated``); a user's profile of a slot count before the shipped one
    (the two registries' profiles together); ties go to the larger profile."""
    # the shipped entries under the user's (a user registry written before the raw-attention
    # profiles shipped holds only calibrated ones, and hid the shipped raw ones entirely)
    # the user's under every id the same weights were saved with, the newer over the older (the
    # newest file alone was read: a profile of 5 slots saved under a second id hid every other size)
    stored = dict((load_artifact(ARTIFACT, model_id, fingerprint, shipped_only=True) or {}).get("profiles", {}))
    for registered in load_user_artifacts(ARTIFACT, model_id, fingerprint, root=root):
        stored.update(registered.get("profiles", {}))
    mine = {int(k.removesuffix(_RAW)): v for k, v in stored.items() if k.endswith(_RAW) != calibrated}
    if not mine:
        what = "calibrated-score" if calibrated else "raw-attention"
        how = "a reranker" if calibrated else "a reranker with calibrate=False, token_filter=False"
        raise InputError(
            f"no {what} slot profile is registered for model {model_id!r} (fingerprint {fingerprint[:12]}); "
            f"measure one with measure_slot_profile({how}, ...) and store_profile(profile)"
        )
    target = max(mine) if n_slots is None else n_slots
    best = min(mine, key=lambda k: (abs(k - target), -k))
    return SlotProfile.from_json(json.dumps(mine[best]))


def resample_profile(values: Sequence[float], k: int) -> np.ndarray:
    """``values`` (one per slot) linearly interpolated to ``k`` slots, end slots aligned."""
    arr = np.asarray(values, dtype=np.float64)
    if k < 1:
        raise InputError(f"cannot resample a slot profile to k={k} slots; k must be >= 1")
    n = arr.shape[0]
    if n == k:
        return arr.copy()
    if k == 1 or n == 1:  # one slot: nothing to interpolate (a single slot has no bias)
        return np.full(k, arr[0])
    return np.interp(np.arange(k) * (n - 1) / (k - 1), np.arange(n), arr)


def prompt_slots(spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """Prompt position (0-based) of each document: the rank of its span start among ``spans``."""
    starts = np.asarray([s for s, _ in spans])
    return np.argsort(np.argsort(starts, kind="stable"), kind="stable")


def slot_correct(scores: np.ndarray, slots: Sequence[int] | np.ndarray, profile: SlotProfile) -> np.ndarray:
    """``scores[i] − (c[slots[i]] − mean(c))`` with ``c`` the profile resampled to ``len(scores)``.

    Removes the score each prompt slot gets regardless of content (units: calibrated
    attention score, as measured). ``slots``: prompt position 0..K−1 of each score.
    """
    scores = np.asarray(scores, dtype=np.float64)
    where = np.asarray(slots, dtype=np.int64)
    k = scores.shape[0]
    if where.shape != (k,) or (k and (where.min() < 0 or where.max() >= k)):
        raise InputError(f"slots {where.tolist()} must give one prompt position in 0..{k - 1} per score")
    curve = profile.curve(k) if k else np.zeros(0)
    return scores - (curve - curve.mean())[where] if k else scores.copy()


def check_basin(profile: SlotProfile) -> None:
    """Refuse a calibrated-score profile for placing passages: calibration cancels most of the
    positional bias, and its residual ranked SmolLM2's 5 slots best-first, the basin never."""
    if profile.calibrated:
        raise InputError(
            f"this {profile.n_slots}-slot profile of {profile.model_id} holds calibrated scores, not the raw "
            "attention each slot receives; measure one with measure_slot_profile(AttentionReranker(..., "
            "calibrate=False, token_filter=False), ...) to reorder by it"
        )


def reorder_for_generation(docs_best_first: Sequence[Any], profile: SlotProfile) -> list:
    """AttnRank's basin permutation: the best document at the highest-attention slot, the
    second best at the next highest, and so on; returns the documents in prompt order.
    ``profile``: of raw attention (``calibrated`` False). Ties between slots go to the earlier slot.
    """
    if not isinstance(profile, SlotProfile):  # (None: an AttributeError on .calibrated)
        raise InputError(
            f"profile is a {type(profile).__name__}, not a SlotProfile; pass one (load_profile, or "
            "measure_slot_profile with calibrate=False)"
        )
    check_basin(profile)
    refuse_one_passage(docs_best_first, "docs_best_first is", "passages")  # (a str was split into characters)
    docs = list(docs_best_first)
    if not docs:
        return []
    slot_order = np.argsort(-profile.curve(len(docs)), kind="stable")
    out: list[Any] = [None] * len(docs)
    for doc, slot in zip(docs, slot_order):
        out[int(slot)] = doc
    return out
