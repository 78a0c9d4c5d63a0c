"""``attnrank heads``: the sub-app, and ``show`` (the registered sets, weights and profiles);
``detect`` in :mod:`attnrank.cli.heads_detect`, ``train`` in :mod:`attnrank.cli.heads_train`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import AttnrankError
from . import _setup, app

heads_app = typer.Typer(
    help="Detect, register and inspect retrieval heads (per model and weights).",
    no_args_is_help=True,
    rich_markup_mode=None,  # as the main app: plain one-line errors
)
app.add_typer(heads_app, name="heads")


@heads_app.command("show")
def heads_show(
    model: Optional[str] = typer.Option(None, help="LLM: HF id, local path or .gguf (default: packaged SmolLM2-135M)."),
    png: Optional[Path] = typer.Option(
        None, "--png", help="Write a layer x head heat map of the best scored set (needs attnrank[plot])."
    ),
) -> None:
    """List the head sets registered for a model (user registry first, then shipped sets), and its weights and profiles."""
    from ..llm.models import unloaded_model
    from ..registry import load_head_sets, registered_artifacts

    _setup(True)
    if png is not None:
        from ..files import has_png_mark
        from .outputs import check_output_path, check_replaceable

        check_output_path(png, "--png")
        check_replaceable(png, has_png_mark, "a heat map", "--png")
    model_id, fingerprint = unloaded_model(model)  # a model that cannot load is named, not fingerprinted
    sets = load_head_sets(model_id, fingerprint)
    typer.echo(f"{model_id} (fingerprint {fingerprint[:12]}): {len(sets)} head set(s), preferred first")
    for i, s in enumerate(sets, start=1):
        typer.echo(
            f"{i:>2}. {s.name} [{s.method}, {s.source}] {len(s.heads)} heads, {s.date}: {','.join(s.heads)}\n"
            f"    data: {s.data}"
        )
    artifacts = registered_artifacts(model_id, fingerprint)  # (heads train's weights were listed nowhere)
    if artifacts:
        typer.echo(f"{len(artifacts)} registered weight file(s) and profile(s), the one read of each kind first:")
    for a in artifacts:
        trained = f", trained on {a['trained_on']}" if a["trained_on"] else ""
        typer.echo(f"  - {a['kind']} [{a['source']}] {a['date'] or 'undated'}{trained}")
    if png is not None:
        scored = next((s for s in sets if s.scores), None)
        if scored is None:
            raise AttnrankError(
                f"no registered head set of {model_id} has a score matrix to plot; "
                "detect one with `attnrank heads detect`"
            )
        _heat_map(scored, png)
        typer.echo(f"wrote {png}")


def _heat_map(head_set, path: Path) -> None:
    from ..errors import require
    from ..files import PNG_SOFTWARE, atomic_path, has_png_mark, replace_guard

    require("matplotlib", "plot", "The head heat map")
    import numpy as np
    from matplotlib.figure import Figure  # (not pyplot: the backend of a caller in-process stays)

    m = np.array([[np.nan if v is None else v for v in row] for row in head_set.scores], dtype=float)
    fig = Figure(figsize=(max(4, m.shape[1] * 0.3), max(3, m.shape[0] * 0.25)))
    ax = fig.subplots()
    im = ax.imshow(m, aspect="auto", cmap="viridis", origin="lower")
    ax.set(xlabel="head", ylabel="layer", title=f"{head_set.model_id}: {head_set.method} ({head_set.name})")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    # a PNG whatever the suffix (--png), marked so that a later run recognises it as its own; written
    # aside and renamed, so that a write that fails never leaves a cut image that passes for one
    guard = replace_guard(has_png_mark, "a heat map", "--png")
    with atomic_path(path, fsync=False, guard=guard) as tmp:
        fig.savefig(tmp, dpi=120, format="png", metadata={"Software": f"{PNG_SOFTWARE} heads show"})
