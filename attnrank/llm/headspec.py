"""Head lists: ``(layer, head)`` pairs, 0-indexed, written ``"layer-head"`` as in QRHead's configs."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Union

import numpy as np

from ..errors import InputError

HeadList = list[tuple[int, int]]
HeadsArg = Union[None, str, Path, Sequence[Union[tuple[int, int], Sequence[int], str]]]


def _index(value) -> int:
    """A layer or head index: an int, digits, or a whole number of another type (13.0, numpy
    floats); 13.5 is refused, not cut to 13."""
    if isinstance(value, (bool, np.bool_)):  # ((True, False) was read as head 1-0)
        raise ValueError(value)
    if not isinstance(value, (str, int)) and not float(value).is_integer():
        raise ValueError(value)
    return int(value)


def head_pair(item) -> tuple[int, int]:
    """One ``(layer, head)`` pair from a pair or ``"l-h"`` text (whole numbers only: 13.5 is refused)."""
    try:
        if isinstance(item, str):
            layer, head = item.replace(":", "-").replace(",", "-").split("-")
        else:
            layer, head = item
        return _index(layer), _index(head)
    except (ValueError, TypeError):
        raise InputError(f"head {item!r} is not a (layer, head) pair; write it as 'layer-head', e.g. '13-18'") from None


def parse_heads(spec: HeadsArg) -> HeadList | None:
    """Normalise a head spec. ``None``/``"all"`` → None (every head); a list of pairs or
    ``"l-h"`` strings; a comma-separated string ``"13-18,14-2"``; or a JSON file holding such a
    list or ``{"heads": [...]}``. Returns sorted, de-duplicated pairs."""
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "all"):
        return None
    if isinstance(spec, Path) or (isinstance(spec, str) and spec.endswith(".json")):
        path = Path(spec)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise InputError(f"head file {str(path)!r} does not exist") from None
        except json.JSONDecodeError as e:
            raise InputError(f"head file {path} is not valid JSON ({e.msg})") from None
        except (OSError, UnicodeDecodeError) as e:  # a folder, no permission, a binary file
            raise InputError(
                f"head file {str(path)!r} cannot be read ({e.__class__.__name__}: {e}); "
                "give a UTF-8 JSON file of 'layer-head' pairs"
            ) from None
        spec = data.get("heads") if isinstance(data, dict) else data
        if not isinstance(spec, list):
            raise InputError(f"head file {path} must hold a list of 'layer-head' or {{\"heads\": [...]}}")
    elif isinstance(spec, str):
        spec = [s for s in spec.replace(" ", "").split(",") if s]
    heads = sorted({head_pair(x) for x in spec})
    if not heads:
        raise InputError("the head list is empty; give at least one 'layer-head' pair, or 'all'")
    if any(l < 0 or h < 0 for l, h in heads):
        raise InputError(f"negative layer/head index in {format_heads(heads)}; indices are 0-based")
    return heads


def check_head_range(
    heads: Iterable[tuple[int, int]], n_layers: int, n_heads: int, max_layer: int | None = None
) -> None:
    """Raise :class:`InputError` naming the pairs outside a model of ``n_layers`` layers of
    ``n_heads`` heads (layers above ``max_layer`` count as outside when it is given)."""
    limit = n_layers if max_layer is None else max_layer + 1
    bad = [(layer, head) for layer, head in heads if not (0 <= layer < limit and 0 <= head < n_heads)]
    if bad:
        raise InputError(
            f"head pairs {format_heads(bad)} are out of range: this model has {n_layers} layers and "
            f"{n_heads} heads per layer"
            + ("" if max_layer is None else f" (max_layer={max_layer})")
            + f"; give 'layer-head' pairs with 0 <= layer <= {limit - 1} and 0 <= head <= {n_heads - 1}"
        )


def format_heads(heads: Iterable[tuple[int, int]]) -> str:
    return ",".join(f"{l}-{h}" for l, h in heads)
