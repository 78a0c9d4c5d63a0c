"""Benchmark plots (matplotlib: ``pip install 'attnrank[plot]'``)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..errors import InputError, require
from ..files import PNG_SOFTWARE, atomic_path, foreign_file, has_png_mark, replace_guard

logger = logging.getLogger(__name__)


def recall_curves(
    rows: Sequence[dict[str, Any]],
    methods: Sequence[str],
    path: Path,
    *,
    solid: Iterable[str] = (),
    target: tuple[float, float] | None = None,
) -> Path | None:
    """Supporting-fact recall vs compression, one panel per recall column present; ``solid``:
    methods drawn with solid lines (the rest dashed); ``target``: (compression, recall) guides.
    Writes ``path`` (PNG) and returns where it went (:func:`save_png`: beside a file there that
    is not attnrank's plot, which a page must not link as this one); None (nothing written) when
    no recall column has a value."""
    require("matplotlib", "plot", "Benchmark plots")
    solid = set(solid)

    from matplotlib import ticker
    from matplotlib.figure import Figure  # (not pyplot: a caller's backend, e.g. a notebook's, stays)

    panels = [
        (c, t)
        for c, t in (
            ("sent recall (labelled)", "sentence-level recall (labelled questions)"),
            ("para recall (others)", "paragraph-level recall (other questions)"),
        )
        if any(r[c] == r[c] for r in rows)
    ]
    if not panels:
        return None
    fig = Figure(figsize=(6 * len(panels), 4.5))
    axes = fig.subplots(1, len(panels), squeeze=False)
    for ax, (col, title) in zip(axes[0], panels):
        for m in methods:
            pts = sorted((r["compression"], r[col]) for r in rows if r["method"] == m and r[col] == r[col])
            if pts:
                ax.plot(*zip(*pts), marker="o", label=m, linestyle="-" if m in solid else "--")
        if target:
            ax.axvline(target[0], color="grey", lw=0.8)
            ax.axhline(target[1], color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(ticker.FixedLocator([2, 3, 4, 5, 6, 8, 10, 15, 20]))
        ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%gx"))
        ax.xaxis.set_minor_locator(ticker.NullLocator())
        ax.set_xlabel("compression (sentence tokens / kept tokens)")
        ax.set_ylabel("supporting-fact recall")
        ax.set_ylim(0, 1.02)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_png(fig, path)


def slot_profiles(profiles: dict[int, Any], path: Path) -> Path:
    """One panel per slot count ``k``: a slot profile's mean calibrated document score per prompt
    slot ± its std over trials (``profiles``: ``{k: SlotProfile}``, read through ``mean_score``,
    ``std``, ``n_trials``, ``model_id``); writes ``path`` (PNG) and returns where it went
    (:func:`save_png`)."""
    if not profiles:
        raise InputError("no slot profiles to plot; give at least one {k: SlotProfile}")
    require("matplotlib", "plot", "Benchmark plots")
    import numpy as np
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(max(8, 6 * len(profiles)), 4.5))
    axes = fig.subplots(1, len(profiles), squeeze=False)
    for ax, (k, p) in zip(axes[0], sorted(profiles.items())):
        x = np.arange(1, k + 1)
        m, s = np.array(p.mean_score), np.array(p.std)
        ax.plot(x, m, "o-", ms=3, label="mean")
        ax.fill_between(x, m - s, m + s, alpha=0.25, label="± std over trials")
        ax.axhline(m.mean(), color="grey", lw=0.8, ls="--", label="mean over slots")
        ax.set(
            title=f"{k} slots, {p.n_trials} trials",
            xlabel="prompt slot (1 = first in prompt, last = next to the query)",
            ylabel="calibrated document score",
        )
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=8)
    fig.suptitle(f"Slot profile of {p.model_id} (all heads, plain ICR, random DL19 passages)", fontsize=10)
    fig.tight_layout()
    return save_png(fig, path)


def save_png(fig: Any, path: Path) -> Path:
    """Write ``fig`` to ``path`` atomically, marked as attnrank's (its PNG "Software" text), and
    return where it went: a file there that is not a plot attnrank wrote stays, and the plot goes
    beside it as ``<name>.attnrank-new.png`` with a warning (a benchmark's ``--name`` once wrote
    over any PNG of that name, and a killed run left half an image; plots written before the
    mark are such files: move them, or delete them, to write in their place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if foreign_file(path, has_png_mark):
        new = path.with_name(f"{path.stem}.attnrank-new.png")
        logger.warning("%s exists and is no plot attnrank marked as its own; the plot is written to %s", path, new)
        path = new
    with atomic_path(path, guard=replace_guard(has_png_mark, "a plot", "the plot path")) as tmp:
        fig.savefig(tmp, dpi=120, format="png", metadata={"Software": f"{PNG_SOFTWARE} plot"})
    return path
