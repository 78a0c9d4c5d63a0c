from __future__ import annotations

import sys

import pytest

from attnrank.errors import MissingExtraError
from attnrank.eval.plot import recall_curves

ROWS = [
    {"method": m, "compression": c, "sent recall (labelled)": r, "para recall (others)": float("nan")}
    for m, pts in {"query": [(2, 0.9), (4, 0.8)], "random": [(2, 0.5), (4, 0.25)]}.items()
    for c, r in pts
]


def test_recall_curves_without_matplotlib_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtraError, match=r"attnrank\[plot\]"):
        recall_curves(ROWS, ["query", "random"], tmp_path / "r.png")


def test_recall_curves_draws_only_measured_columns(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "sub" / "r.png"
    assert recall_curves(ROWS, ["query", "random"], png, solid=["query"], target=(4, 0.8))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    empty = [dict(r, **{"sent recall (labelled)": float("nan")}) for r in ROWS]
    assert not recall_curves(empty, ["query"], tmp_path / "none.png") and not (tmp_path / "none.png").exists()


def test_no_slot_profiles_is_one_input_error(tmp_path):
    """It crashed inside matplotlib (a figure of 0 panels) instead."""
    from attnrank.errors import InputError
    from attnrank.eval.plot import slot_profiles

    with pytest.raises(InputError, match="no slot profiles to plot"):
        slot_profiles({}, tmp_path / "p.png")
    assert not (tmp_path / "p.png").exists()


def test_a_plot_replaces_only_a_plot_attnrank_wrote(tmp_path):
    """savefig wrote over any PNG of the name (bench_prune --name X wrote X_recall.png over a user's)."""
    pytest.importorskip("matplotlib")
    from attnrank.files import png_software

    png = tmp_path / "r.png"
    assert recall_curves(ROWS, ["query"], png) == png and png_software(png) == "attnrank plot"
    assert recall_curves(ROWS, ["random"], png) == png  # its own: replaced
    theirs = tmp_path / "mine.png"
    theirs.write_bytes(b"\x89PNG\r\n\x1a\n" + b"a user's image")
    # (a long benchmark's plot is not lost either, and where it went is returned: a page linked
    # the user's image as the plot)
    assert recall_curves(ROWS, ["query"], theirs) == tmp_path / "mine.attnrank-new.png"
    assert theirs.read_bytes().endswith(b"a user's image")
    assert png_software(tmp_path / "mine.attnrank-new.png") == "attnrank plot"
