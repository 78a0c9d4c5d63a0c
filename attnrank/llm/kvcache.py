"""What a transformers KV cache keeps, layer by layer, and how a forward is handed one.

:func:`is_recurrent` tells the layers that hold a convolution or recurrent state (hybrid models:
LFM2), updated in place and in order; :func:`has_sliding_layers` and :func:`sliding_window` those
that keep only a window of recent tokens (sliding or chunked attention); :func:`cache_argument`
names the forward argument a cache is passed in.
"""

from __future__ import annotations

import inspect
from typing import Any

from transformers import DynamicCache

try:  # the transformers releases with hybrid caches; before, no cache layer held such a state
    from transformers.cache_utils import LinearAttentionCacheLayerMixin as _RecurrentLayer
except ImportError:  # pragma: no cover - older transformers 5
    _RecurrentLayer = None  # type: ignore[assignment,misc]


def is_recurrent(layer: Any) -> bool:
    """Whether a cache layer holds a convolution or recurrent state (updated in place, in order)."""
    if _RecurrentLayer is None:  # pragma: no cover - older transformers 5
        return hasattr(layer, "conv_states") or hasattr(layer, "recurrent_states")
    return isinstance(layer, _RecurrentLayer)


def has_sliding_layers(cache: DynamicCache) -> bool:
    """Whether any layer of ``cache`` keeps only a sliding window of recent tokens."""
    return any(getattr(layer, "is_sliding", False) for layer in cache.layers)


def layer_window(layer: Any) -> int | None:
    """The window of a cache layer that keeps only its latest tokens (sliding or chunked
    attention), None for one that keeps every token (or declares no window)."""
    size = getattr(layer, "sliding_window", None) if getattr(layer, "is_sliding", False) else None
    return None if size is None else int(size)


def sliding_window(cache: DynamicCache) -> int | None:
    """The smallest window of ``cache``'s sliding-window layers (:func:`layer_window`), None
    without such layers."""
    return min((w for w in map(layer_window, cache.layers) if w is not None), default=None)


def cache_argument(module: Any) -> str:
    """The forward argument of ``module`` (a decoder or a causal LM) that takes a cache:
    transformers 5.x renamed ``past_key_values`` to ``cache``."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"
