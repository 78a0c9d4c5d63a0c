"""Plots shared by the benchmark scripts (matplotlib, the ``bench`` extra)."""

from __future__ import annotations

from pathlib import Path


def recall_curves(rows: list[dict], methods: list[str], path: Path, *, solid=(), target=None) -> bool:
    """Supporting-fact recall vs compression, one panel per recall column present; ``solid``:
    methods drawn with solid lines (the rest dashed); ``target``: (compression, recall) guides."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    panels = [(c, t) for c, t in (("sent recall (labelled)", "sentence-level recall (labelled questions)"),
                                  ("para recall (others)", "paragraph-level recall (other questions)"))
              if any(r[c] == r[c] for r in rows)]
    if not panels:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, (col, title) in zip(axes[0], panels):
        for m in methods:
            pts = sorted((r["compression"], r[col]) for r in rows if r["method"] == m and r[col] == r[col])
            if pts:
                ax.plot(*zip(*pts), marker="o", label=m, linestyle="-" if m in solid else "--")
        if target:
            ax.axvline(target[0], color="grey", lw=0.8)
            ax.axhline(target[1], color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator([2, 3, 4, 5, 6, 8, 10, 15, 20]))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%gx"))
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel("compression (sentence tokens / kept tokens)")
        ax.set_ylabel("supporting-fact recall")
        ax.set_ylim(0, 1.02)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
