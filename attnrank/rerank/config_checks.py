"""The checks a stage's configuration runs when it is made, before any model loads: the prompt
options the reranker and the pruner share, what needs no model among the attention options (a head
list's syntax, re-weighting, the slot profile), and option names."""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..config import check_precision_names
from ..errors import InputError
from ..llm.headspec import parse_heads
from ..types import is_count
from .position import SlotProfile
from .reweight import Reweighting

ORDERS = ("reverse", "forward")
AUTO_OR_ALL = "auto-or-all"  # heads: the registered set, else all


def check_prompt_options(order: str, instruction: str) -> None:
    """The prompt options the reranker and the pruner share: a known ``order``, a non-empty ``instruction``."""
    if order not in ORDERS:
        raise InputError(f"order={order!r} is not one of {ORDERS}")
    if not isinstance(instruction, str):  # (str(None) is "None": it was found after the model loaded)
        raise InputError(f"instruction={instruction!r} is not a text; use 'ie', 'qa' or a custom instruction text")
    if not instruction.strip():
        raise InputError("instruction is empty; use 'ie', 'qa' or a custom instruction text")


def check_attention_inputs(heads: Any, reweight: Any, slot_profile: Any) -> None:
    """What needs no model among the attention options, checked when they are configured (the
    reranker found them after loading the model): a head list's syntax (or its file), the
    re-weighting object, and the slot profile that slot correction reads."""
    if isinstance(heads, (str, Path)) and str(heads).strip().lower() not in ("all", "auto", AUTO_OR_ALL):
        if not str(heads).strip().lower().startswith("auto:"):
            parse_heads(heads)
    elif isinstance(heads, (list, tuple)):
        parse_heads(heads)
    if reweight is not None and not isinstance(reweight, Reweighting):  # (an AttributeError, model loaded)
        raise InputError(
            f"reweight={reweight!r} is not a Reweighting or None; give e.g. Reweighting(sink=True) (--reweight sink)"
        )
    if reweight is not None and reweight.slot_correction and slot_profile is None:
        raise InputError(
            "reweight.slot_correction=True (--reweight slot) needs slot_profile= (--slot-profile): 'auto' (the "
            "registered profile), a SlotProfile or its JSON file; measure one with "
            "attnrank.rerank.profile.measure_slot_profile"
        )
    if slot_profile is not None and (reweight is None or not reweight.slot_correction):
        # (read by nothing else: it was warned of only after the model loaded, and picked preset fused)
        raise InputError(
            f"slot_profile={str(slot_profile)[:60]!r} (--slot-profile) is read only by slot correction, which is off; "
            "add reweight=Reweighting(slot_correction=True) (--reweight slot), or drop the profile"
        )
    if isinstance(slot_profile, (str, Path)) and str(slot_profile) != "auto" and not Path(slot_profile).is_file():
        raise InputError(
            f"slot_profile {str(slot_profile)!r} (--slot-profile) is not a file; give 'auto' or a profile JSON file"
        )
    if isinstance(slot_profile, (str, Path)) and str(slot_profile) != "auto":
        try:  # its content too (was found wrong only after the model loaded)
            SlotProfile.load(slot_profile)
        except (InputError, OSError, UnicodeDecodeError) as e:
            raise InputError(
                f"slot_profile {str(slot_profile)!r} (--slot-profile) holds no slot profile ({e}); give 'auto' or a "
                "profile saved with SlotProfile.save"
            ) from None


def check_fields(cls: type, values: dict[str, Any]) -> None:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        # (the command line's --preset is config= in Python: the one spelling a user brings from it)
        named = "preset" in unknown and hasattr(cls, "preset")  # (PruneConfig has no presets)
        hint = "; a preset is named by config='NAME' (the command line's --preset NAME)" if named else ""
        raise InputError(f"unknown {cls.__name__} option(s) {unknown}; known: {sorted(known - {'name'})}{hint}")


def check_model_field(cfg: Any) -> None:
    """A frozen configuration's ``model``: None (the packaged default), a name or a path. Why:
    ``model=123`` (or a loaded model object) reached the registry lookups as a bare TypeError."""
    if cfg.model is not None and not isinstance(cfg.model, (str, os.PathLike)):
        raise InputError(
            f"{type(cfg).__name__}(model=...) is a {type(cfg.model).__name__}, not a model name or folder; pass "
            "its name or path (a loaded attnrank LLM goes to the reranker or pruner, not to its configuration)"
        )


def store_precision_names(cfg: Any) -> None:
    """Check a frozen configuration's ``device`` and ``dtype`` names, and store them lower-cased
    (checked in any case, "CPU" reached the embedder as typed)."""
    check_precision_names(cfg.device, cfg.dtype)
    object.__setattr__(cfg, "device", str(cfg.device).strip().lower())
    object.__setattr__(cfg, "dtype", str(cfg.dtype).strip().lower())


def checked_likelihood_depth(depth: Any, read: bool, name: str) -> int | None:
    """``likelihood_depth`` as an int, or None (every candidate); :class:`InputError` unless it is
    a positive integer, and where ``read`` is False (the query likelihood is not fused without
    attention: nothing shortlists) unless it is None, the field's default."""
    if depth is None:
        return None
    if not is_count(depth):
        raise InputError(f"likelihood_depth={depth!r} must be a positive integer or None (every candidate)")
    if not read:
        raise InputError(
            f"likelihood_depth={depth!r} shortlists candidates for the query likelihood fused without attention "
            f"(preset likelihood), which this reranker ({name}) does not compute; drop it (--likelihood-depth)"
        )
    return int(depth)
