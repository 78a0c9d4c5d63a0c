"""Rendering explanations: a self-contained HTML heat-map page (no scripts, no external files)
and a PNG of per-passage token-score strips (matplotlib, extra ``plot``).

Colours: red = the query attended to the token more than the content-free "N/A" query did
(positive calibrated score), blue = less; intensity is relative to the largest |score| on the
page. Tokens the μ − 2σ filter left out are struck through and do not count.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import InputError, require
from ..files import atomic_path
from .tokens import PassageExplanation

_CSS = """body{font-family:system-ui,sans-serif;max-width:60rem;margin:1.5rem auto;color:#222}
h1{font-size:1.3rem}.p{border:1px solid #ddd;border-radius:6px;padding:.6rem .9rem;margin:.9rem 0}
.h{font-weight:600;margin-bottom:.4rem}.s{color:#555;font-weight:400;font-size:.9rem}
.t{white-space:pre-wrap;line-height:1.7;font-family:ui-monospace,monospace;font-size:.85rem}
.t span{border-radius:2px}.x{text-decoration:line-through;color:#999}
.legend span{padding:0 .4rem;margin-right:.4rem}"""


def _colour(score: float, scale: float) -> str:
    a = min(1.0, abs(score) / scale) if scale > 0 else 0.0
    rgb = "220,40,40" if score >= 0 else "40,90,220"
    return f"rgba({rgb},{0.85 * a:.3f})"


def _scale(explanations: Sequence[PassageExplanation]) -> float:
    return max((abs(t.score) for e in explanations for t in e.tokens if t.counted), default=0.0)


def to_html(
    query: str,
    explanations: Sequence[PassageExplanation],
    *,
    model: str = "",
    fused: bool | None = None,
    set_aside: bool = False,
) -> str:
    """The page: one block per passage (rank, id, attention score = sum of its counted token scores);
    ``fused``: the ranking fused attention with the first-stage signals (False: it is attention
    alone; None, not known: the page says it may have);
    ``set_aside``: the fused weights' confidence gate set attention aside for this query, so the
    first-stage signals alone ranked it (:meth:`~attnrank.rerank.fused.FusedWeights.confident`)."""
    scale = _scale(explanations)
    ranked_by = (
        "attention was set aside for this query (its confidence is below the fused weights' gate): the "
        "passages are ranked by the first-stage signals alone (BM25, dense, rank)"
        if set_aside and fused is not False
        else "the passages are ranked by the reranker's score, which fuses it with the first-stage signals "
        "(BM25, dense, rank), so a lower attention score can rank higher"
        if fused
        else "the passages are ranked by it"
        if fused is False
        else "the passages are in the reranker's order, whose score may fuse it with the first-stage signals "
        "(BM25, dense, rank)"
    )
    parts = [
        (
            f"<!doctype html><html><head><meta charset='utf-8'><title>attnrank explain</title>"
            f"<style>{_CSS}</style></head><body>"
        ),
        f"<h1>Why these passages? <span class='s'>query: {html.escape(query)}</span></h1>",
        (
            "<p class='legend s'>Calibrated attention per token (query minus content-free query, summed over "
            f"the scoring heads{', ' + html.escape(model) if model else ''}): "
            f"<span style='background:{_colour(scale, scale)}'>more</span>"
            f"<span style='background:{_colour(-scale, scale)}'>less</span>"
            "<span class='x'>left out by the μ−2σ filter</span>. A passage's attention score is the sum "
            f"of its counted token scores; {ranked_by}.</p>"
        ),
    ]
    for e in explanations:
        parts.append(
            f"<div class='p' id='p{e.rank}'><div class='h'>{e.rank}. {html.escape(e.id)} "
            f"<span class='s'>attention score {e.score:+.6f} = Σ {len(e.tokens) - e.filtered} counted tokens "
            f"({e.token_sum:+.6f}); {e.filtered} filtered</span></div><div class='t'>"
        )
        for t in e.tokens:
            tip = f"{t.score:+.6f}" + ("" if t.counted else " (filtered)")
            cls = "" if t.counted else " class='x'"
            parts.append(
                f"<span{cls} style='background:{_colour(t.score, scale) if t.counted else 'none'}' "
                f"title='{tip}'>{html.escape(t.text)}</span>"
            )
        parts.append("</div></div>")
    parts.append("</body></html>")
    return "".join(parts)


PNG_SOFTWARE = "attnrank explain"  # the PNG "Software" text: a later run recognises its own image


def write_html(
    path: str | Path,
    query: str,
    explanations: Sequence[PassageExplanation],
    *,
    model: str = "",
    fused: bool | None = None,
    set_aside: bool = False,
    guard: Callable[[Path], None] | None = None,
) -> Path:
    """The page (:func:`to_html`, ``fused`` and ``set_aside`` as there) at ``path``; ``guard``:
    checked just before the file is replaced (:func:`attnrank.files.atomic_path`)."""
    path = Path(path)
    with atomic_path(path, fsync=False, guard=guard) as tmp:
        page = to_html(query, explanations, model=model, fused=fused, set_aside=set_aside)
        tmp.write_text(page, encoding="utf-8")
    return path


def write_png(
    path: str | Path,
    query: str,
    explanations: Sequence[PassageExplanation],
    *,
    guard: Callable[[Path], None] | None = None,
) -> Path:
    """One strip per passage: its token scores along the passage (same colours as the page), the
    five highest-scoring tokens named; ``guard`` as for :func:`write_html`."""
    require("matplotlib", "plot", "the explanation PNG")
    import numpy as np
    from matplotlib.figure import Figure  # (not pyplot: a caller's backend, e.g. a notebook's, stays)

    path = Path(path)
    if not explanations:
        raise InputError("no explanations to draw; explain at least one passage")
    scale = _scale(explanations) or 1.0
    fig = Figure(figsize=(10, 0.9 + 0.8 * len(explanations)))
    axes = fig.subplots(len(explanations), 1, squeeze=False)
    for ax, e in zip(axes[:, 0], explanations):
        vals = np.array([[t.score if t.counted else 0.0 for t in e.tokens]])
        ax.imshow(vals, aspect="auto", cmap="bwr", vmin=-scale, vmax=scale, interpolation="nearest")
        ax.set_yticks([])
        ax.set_xticks([])
        ax.set_ylabel(
            f"{e.rank}. {e.id[:18]}\n{e.score:+.4f}", rotation=0, ha="right", va="center", fontsize=8, parse_math=False
        )
        top = ", ".join(repr(t.text.strip()) for t in e.top_tokens(5))
        ax.set_title(f"top tokens: {top}", fontsize=7, loc="left", parse_math=False)  # (a "$" is text)
    fig.suptitle(f"attnrank explain: {query[:90]}", fontsize=9, parse_math=False)
    fig.tight_layout()
    with atomic_path(path, fsync=False, guard=guard) as tmp:
        fig.savefig(tmp, dpi=110, format="png", metadata={"Software": PNG_SOFTWARE})
    return path
