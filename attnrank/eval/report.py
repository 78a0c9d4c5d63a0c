"""Benchmark reports: the run's environment, a JSON payload and a markdown page per result
(``<out_dir>/<name>.json`` and ``.md``), and markdown tables."""

from __future__ import annotations

import datetime as _dt
import json
import math
import numbers
import platform
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config import available_cpus
from ..errors import InputError
from ..files import atomic_path, foreign_file


def environment() -> dict[str, Any]:
    """Date, Python and torch versions, CPUs this process may use, torch threads, machine, CPU
    model, and the command line that ran (a record's own provenance: a command retyped into a
    page by hand dropped flags)."""
    import torch

    return {
        "date": _dt.date.today().isoformat(),
        "command": command_line(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": available_cpus(),
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
    }


def command_line(argv: Sequence[str] | None = None) -> str:
    """``python <script> <args>`` as this process was started (``argv``: :data:`sys.argv`), the
    script's path relative to the working folder where it lies inside it, quoted for a shell."""
    args = list(sys.argv if argv is None else argv)
    if args:
        script = Path(args[0])
        try:
            args[0] = str(script.resolve().relative_to(Path.cwd().resolve()))
        except ValueError:
            args[0] = str(script)
    return shlex.join(["python", *args])


def cpu_model() -> str:
    """The CPU's model name, and whether it multiplies bfloat16 in hardware (AMX or AVX-512 BF16).

    Why in every report: the shared machines differ between days (an Intel CPU with AMX one day,
    an AMD one without it the next), and bfloat16 speed depends on it far more than on noise."""
    try:
        info = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor() or "unknown"
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "unknown")
    flags = next((set(ln.split(":", 1)[1].split()) for ln in info.splitlines() if ln.startswith("flags")), set())
    bf16 = [f for f in ("amx_bf16", "avx512_bf16") if f in flags]
    return f"{name} ({', '.join(bf16)})" if bf16 else name


def _atomic_write(path: Path, text: str) -> None:
    with atomic_path(path, fsync=False) as tmp:
        tmp.write_text(text, encoding="utf-8")


RECORD_MARK = "attnrank_record"  # the key write_outputs adds to every record it writes
# What a record written before the mark holds (its machine), and no other JSON of a project does
_LEGACY_KEYS = ("environment", "env")


def is_record_json(path: Path) -> bool:
    """Whether ``path`` holds what :func:`write_outputs` writes as JSON: one JSON object with its
    mark (:data:`RECORD_MARK`), or, written before the mark, with the machine it ran on (any JSON
    object passed: a project's ``package.json`` beside a benchmark name was replaced)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and (RECORD_MARK in data or any(k in data for k in _LEGACY_KEYS))


def is_record_page(path: Path) -> bool:
    """Whether ``path`` is a record's markdown page: a "# " title, beside its JSON record (a page
    is always written with one)."""
    try:
        with path.open(encoding="utf-8") as f:
            titled = f.readline().startswith("# ")
    except (OSError, ValueError):
        return False
    return titled and is_record_json(path.with_suffix(".json"))


def write_outputs(name: str, payload: Mapping[str, Any], markdown: str, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``payload`` as ``<out_dir>/<name>.json`` (indent 1) and ``markdown`` as ``.md``
    (each atomically); returns both paths. They replace only a record (:func:`is_record_json`,
    :func:`is_record_page`): where a file of another kind has the name, the record is written as
    ``<name>.attnrank-new.json``/``.md`` instead and :class:`InputError` raised naming both, so that
    neither the file nor a finished benchmark's figures are lost."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / f"{name}.json", out / f"{name}.md"
    foreign = [p for p, ours in ((js, is_record_json), (md, is_record_page)) if foreign_file(p, ours)]
    if foreign:
        js, md = out / f"{name}.attnrank-new.json", out / f"{name}.attnrank-new.md"
    _atomic_write(js, json.dumps({RECORD_MARK: 1, **payload}, indent=1))
    _atomic_write(md, markdown)
    if foreign:
        raise InputError(
            f"{', '.join(map(str, foreign))} exist(s) and is no benchmark record attnrank wrote; the record "
            f"was written to {js} and {md} instead; move one or the other"
        )
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
