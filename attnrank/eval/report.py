"""Benchmark reports: the run's environment, a JSON payload and a markdown page per result
(``<out_dir>/<name>.json`` and ``.md``), and markdown tables."""

from __future__ import annotations

import datetime as _dt
import json
import math
import numbers
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config import available_cpus
from ..files import atomic_path


def environment() -> dict[str, Any]:
    """Date, Python and torch versions, CPUs this process may use, torch threads, machine."""
    import torch

    return {
        "date": _dt.date.today().isoformat(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": available_cpus(),
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
    }


def _atomic_write(path: Path, text: str) -> None:
    with atomic_path(path, fsync=False) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_outputs(name: str, payload: Mapping[str, Any], markdown: str, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``payload`` as ``<out_dir>/<name>.json`` (indent 1) and ``markdown`` as ``.md``
    (each atomically); returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / f"{name}.json", out / f"{name}.md"
    _atomic_write(js, json.dumps(payload, indent=1))
    _atomic_write(md, markdown)
    return js, md


def md_table(rows: Sequence[Mapping[str, Any]], cols: Sequence[str], fmt: Mapping[str, str] | None = None) -> str:
    """A markdown table of ``rows`` over ``cols``; floats formatted by ``fmt[col]`` (default
    ``.4f``; NumPy floats too), NaN shown as "—" (not measured), missing cells empty."""
    fmt = fmt or {}
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c, "")
            if isinstance(v, numbers.Real) and not isinstance(v, numbers.Integral):  # NumPy floats too
                cells.append("—" if math.isnan(v) else format(v, fmt.get(c, ".4f")))
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
