"""The fused scorer benchmark's report (attnrank.eval.fusion_report)."""

from __future__ import annotations

from typing import Any

from attnrank.eval.fusion_report import fusion_markdown, variant_title


def _payload(**over: Any) -> dict[str, Any]:
    row = {"nDCG@10": 0.5, "best first stage": "dense alone", "Δ": -1.25, "wins": 3, "losses": 5, "p": 0.727}
    p: dict[str, Any] = {
        "environment": {"date": "2026-12-04", "cpus": 2},
        "dtype": "bfloat16",
        "attention": "block",
        "prompt": {"block_positions": "shared"},
        "ablation": "",
        "sizes": {"DL19": 43, "LoCoMo": 400},
        "targets": [
            {
                "held out": "DL19",
                "best first stage": "first stage: dense alone",
                "its nDCG@10": 0.5932,
                "default preset nDCG@10": 0.579,
                "Δ vs best first stage": -1.42,
                "wins/losses": "19/20",
                "p": 1.0,
                "preset fused nDCG@10": 0.5681,
                "attention's contribution": -0.66,
                "attention wins/losses": "16/16",
                "attention p": 1.0,
                "fused − default": -1.09,
            }
        ],
        "fixed_vs_default": [],
        "lodo": [{"held out": g, "method": f"{g} method", **row} for g in ("DL19", "LoCoMo")],
        "in_domain": [{"dataset": g, "method": f"{g} k-fold method", **row} for g in ("DL19", "LoCoMo")],
        "order_agreement": {"DL19": {"attention vs order": 0.2, "bm25 vs order": 0.54}},
        "shipped": {
            "features": ["attention", "bm25"],
            "weights": [0.4791, 0.5702],
            "base_weights": [0.856],
            "gate": 1.9,
            "heads": ["2-4", "7-7"],
            "capture": "block:shared",
            "trained_on": "DL19 (43) + LoCoMo (400)",
        },
        "coarse_to_fine": None,
        "precision": None,
    }
    return p | over


def test_report_has_the_targets_every_dataset_and_the_shipped_weights():
    md = fusion_markdown(_payload(), "python scripts/bench_fusion.py --ship")
    lines = md.splitlines()
    assert (
        lines[0]
        == "# The fused scorer, held out: bfloat16, block attention, block_positions=shared (2026-12-04, 2 CPUs)"
    )
    assert "Command: `python scripts/bench_fusion.py --ship`" in lines
    assert "Queries: DL19 43, LoCoMo 400." in md
    assert "| DL19 | first stage: dense alone | 0.5932 | 0.5790 | -1.4 | 19/20 | 1.000 | 0.5681 | -0.7 |" in md
    for g in ("DL19", "LoCoMo"):  # a held-out and an in-domain section each, with that dataset's rows only
        held = md.index(f"### {g} held out")
        section = md[held : md.index("\n#", held + 1)]
        assert f"| {g} method | 0.5000 |" in section and section.count(" method | 0.5000 |") == 1
        assert f"| {g} k-fold method | 0.5000 |  |  | -1.2 | 3 | 5 | 0.727 |" in md.split("## In-domain")[1]
    assert "weights [0.479, 0.57], gate 1.9" in md and "heads 2-4, 7-7, captured as block:shared" in md
    assert "## Coarse-to-fine" not in md and "## Precision" not in md and "## Equal weights" not in md


def test_title_names_only_what_differs_from_the_float32_full_attention_headline():
    assert variant_title({}) == ""
    assert variant_title({"dtype": "float32", "attention": "full", "ablation": "fixed-weights"}) == (
        ": ablation fixed-weights"
    )
    assert variant_title({"dtype": "bfloat16", "prompt": {"order": "forward"}}) == ": bfloat16, order=forward"
    shipped = _payload(shipped={**_payload()["shipped"], "heads": None, "capture": None})
    assert "heads not recorded, captured as not recorded" in fusion_markdown(shipped, "c")


def test_the_nested_head_count_is_named_per_held_out_dataset():
    p = _payload()
    p["lodo"][1] |= {"head count": 8, "inner nDCG@10": {"4": 0.7291, "8": 0.73}}  # as read back from the JSON
    md = fusion_markdown(p, "c")
    assert "inner means in brackets): LoCoMo 8 (4: 0.7291, 8: 0.7300)." in md
    assert "inner leave-one-dataset-out, per held-out" not in fusion_markdown(_payload(), "c")


def test_the_slot_explanation_fits_how_attention_was_captured():
    """Block records at shared positions said the first stage's best sits next to the query; there
    no passage sits nearer the query than another."""
    agreement = {"DL19": {"attention vs order": 0.5, "bm25 vs order": 0.4}}
    full = fusion_markdown(_payload(order_agreement=agreement, attention="full", prompt={}), "c")
    shared = fusion_markdown(
        _payload(order_agreement=agreement, attention="block", prompt={"block_positions": "shared"}), "c"
    )
    assert "sits next to the query" in full and "sits next to the query" not in shared
    assert "no passage sits nearer the query than another" in shared
