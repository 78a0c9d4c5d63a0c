"""The report of the fused scorer's held-out benchmark (``scripts/bench_fusion.py``): targets,
leave-one-dataset-out and in-domain tables, the ablations and the shipped weights, as markdown."""

from __future__ import annotations

from typing import Any

import numpy as np

from .report import md_table


def variant_title(p: dict[str, Any]) -> str:
    """What sets this run apart from the float32 full-attention headline, for its title."""
    parts = [p.get("dtype", "float32"), f"{p.get('attention', 'full')} attention"]
    parts += [f"{k}={v}" for k, v in (p.get("prompt") or {}).items()]
    parts += [f"ablation {p['ablation']}"] if p.get("ablation") else []
    kept = [x for x in parts if x not in ("float32", "full attention")]
    return f": {', '.join(kept)}" if kept else ""


def fusion_markdown(p: dict[str, Any], command: str) -> str:
    """The report of one ``scripts/bench_fusion.py`` run: its payload ``p`` (the JSON it writes)
    as markdown, headed by the ``command`` that produced it."""
    env = p["environment"]
    cols = ["method", "nDCG@10", "R@2", "R@5", "Δ", "wins", "losses", "p"]
    fmt = {"Δ": "+.1f", "p": ".3f"}
    out = [
        f"# The fused scorer, held out{variant_title(p)} ({env['date']}, {env['cpus']} CPUs)",
        "",
        f"Command: `{command}`",
        "",
        "Queries: "
        + ", ".join(f"{g} {n}" for g, n in p["sizes"].items())
        + f". SmolLM2-135M-Instruct, {p.get('dtype', 'float32')}, {p.get('attention', 'full')} attention"
        + "".join(f", {k}={v}" for k, v in (p.get("prompt") or {}).items())
        + ".",
        "",
        "## Targets (leave-one-dataset-out, nDCG@10 points)",
        "",
        md_table(
            p["targets"],
            [
                "held out",
                "best first stage",
                "its nDCG@10",
                "default preset nDCG@10",
                "Δ vs best first stage",
                "wins/losses",
                "p",
                "preset fused nDCG@10",
                "attention's contribution",
                "attention wins/losses",
                "attention p",
                "fused − default",
            ],
            {
                "Δ vs best first stage": "+.1f",
                "attention's contribution": "+.1f",
                "p": ".3f",
                "attention p": ".3f",
                "fused − default": "+.1f",
            },
        ),
        "",
        "Preset `signals` (the default until 2026-12-04; since then `likelihood`, docs/results/likelihood.md): z-scored dense cosine plus z-scored BM25 per query, equal weights, nothing "
        "trained (`attnrank.rerank.fused.equal_weights`). Best first stage: the best single first-stage signal on "
        "the held-out dataset itself (flatters the baseline). Wins/losses per query against it; p: two-sided sign "
        "test. Attention's contribution: preset `fused` (the trained fusion with attention, gated) minus the same "
        "fusion trained without attention (its fallback); its wins/losses per query against that fallback. "
        "fused − default: preset `fused` minus the default.",
        "",
        "## Leave-one-dataset-out (trained on the other three datasets)",
        "",
        "Ablations (heads chosen and weights trained on the other datasets only): top-N heads by their own "
        "nDCG@10 (QRHead's selection); 'heads chosen for what they add to the signals': the 16 heads whose "
        "score, added alone to the signals' fusion, gains most nDCG@10 on the training datasets "
        "(attnrank.benchmarks.complementary_heads); 'heads chosen by their weakest training dataset': the 16 heads "
        "whose lowest per-dataset mean nDCG@10 over the training datasets is highest (a head that ranks well on "
        "every dataset it was tried on, rather than very well on one); 'mean / highest token score': a passage's "
        "attention as the "
        "mean of its kept tokens or its single highest token instead of ICR's sum; 'features as within-query "
        "ranks': every feature replaced by its rank among the query's candidates (with and without attention: "
        "their difference is attention's contribution under that scale).",
        "",
    ]
    for g in p["sizes"]:
        out += [f"### {g} held out", "", md_table([r for r in p["lodo"] if r["held out"] == g], cols, fmt), ""]
    nested = [r for r in p["lodo"] if "head count" in r]
    if nested:
        out += [
            "Head count of the row 'head count chosen by an inner leave-one-dataset-out', per held-out dataset "
            "(chosen by the mean nDCG@10 of a leave-one-dataset-out among the training datasets alone; "
            "inner means in brackets): "
            + "; ".join(
                f"{r['held out']} {r['head count']} ("
                + ", ".join(f"{n}: {v:.4f}" for n, v in r["inner nDCG@10"].items())
                + ")"
                for r in nested
            )
            + ".",
            "",
        ]
    if p.get("fixed_vs_default"):
        out += [
            "## Against the default, per query (held out)",
            "",
            f"Each fusion against `{p.get('default_preset', 'signals')}` on the same held-out queries: Δ in "
            "nDCG@10 points (pooled: the mean of the four datasets' Δ), per-query wins/losses and two-sided sign test; "
            "the pooled row sums the wins and losses over the four datasets.",
            "",
            md_table(
                p["fixed_vs_default"],
                ["held out", "method", "nDCG@10", "Δ", "wins", "losses", "p"],
                {"Δ": "+.2f", "p": ".3f"},
            ),
            "",
        ]
    if p.get("order_agreement"):
        agree = [{"dataset": g, **v} for g, v in p["order_agreement"].items()]
        names = list(next(iter(p["order_agreement"].values())))
        full = p.get("attention", "full") == "full"
        shared = (p.get("prompt") or {}).get("block_positions") == "shared"
        slot = (
            "the prompt lists the candidates in reverse, so the first stage's best sits next to the query. Where "
            "attention follows the first-stage order more closely than BM25 and the dense cosine do, though the "
            "order was made from such signals, it echoes the slot more than the text. Then it adds little that "
            "the fusion does not already have. The order=forward record (`fusion_bfloat16_order-forward.md`) "
            "points the same way: with the best candidate farthest from the query, attention alone (all heads) "
            "fell from 0.7252 to 0.2485 nDCG@10 on SciFact and from 0.5015 to 0.4146 on DL19 (bfloat16)."
            if full
            else "here the passages are blocks"
            + (
                " at one shared position, so no passage sits nearer the query than another: agreement with the "
                "order is not a slot's echo here."
                if shared
                else " at their positions in the prompt's (reverse) order."
            )
        )
        out += [
            "## How much of attention is the candidate's slot",
            "",
            "Mean within-query Spearman correlation of each score with the first-stage order (1 = the same order; "
            f"`attnrank.benchmarks.order_agreement`). Attention is every head's calibrated ICR score; {slot}",
            "",
            md_table(agree, ["dataset", *names], {n: ".2f" for n in names}),
            "",
        ]
    out += ["## In-domain k-fold (heads and weights from the training folds)", ""]
    for g in p["sizes"]:
        out += [f"### {g}", "", md_table([r for r in p["in_domain"] if r["dataset"] == g], cols, fmt), ""]
    if p.get("coarse_to_fine"):
        out += [
            "## Coarse-to-fine (CAFE-style), held out",
            "",
            "The preset `fused` trained on the other datasets ranks the candidates; its top 10 are re-scored in a "
            "second prompt holding only them and reordered above the rest. Δ, wins/losses and sign test against "
            "the one-pass `fused`.",
            "",
        ]
        for g in p["sizes"]:
            part = [r for r in p["coarse_to_fine"] if r["held out"] == g]
            out += [f"### {g} held out", "", md_table(part, cols, fmt), ""]
    if p.get("precision"):
        out += [
            f"## Precision: the preset fused on {p['dtype']} rows against float32 rows",
            "",
            "Registered qrhead heads and shipped fused weights (both from float32), applied to rows captured in "
            "each precision; every query of each dataset (in-domain for the weights: this isolates the precision). "
            "Wins/losses and sign test per query against the same method in float32; Spearman: mean per-query rank "
            "correlation of the attention scores; capture s/query: mean seconds to capture every head's rows "
            "(row cache; the two precisions were captured at different times).",
            "",
            md_table(
                p["precision"],
                [
                    "dataset",
                    "method",
                    "nDCG@10",
                    "Δ vs float32",
                    "wins",
                    "losses",
                    "p",
                    "Spearman vs float32",
                    "capture s/query",
                ],
                {"Δ vs float32": "+.1f", "p": ".3f", "Spearman vs float32": ".4f", "capture s/query": ".2f"},
            ),
            "",
        ]
    if p["shipped"]:
        s = p["shipped"]
        out += [
            "## Shipped weights",
            "",
            f"Features {s['features']}, weights {np.round(s['weights'], 3).tolist()}, gate {s['gate']} (preset "
            f"`fused`); without attention (`fused`'s fallback) {[f for f in s['features'] if f != 'attention']} weights "
            f"{np.round(s.get('base_weights') or [], 3).tolist()}; trained on {s['trained_on']}. Attention: heads "
            f"{_heads_text(s.get('heads'))}, captured as {s.get('capture') or 'not recorded'}.",
            "",
        ]
    return "\n".join(out)


def _heads_text(heads: Any) -> str:
    if heads is None:
        return "not recorded"
    return heads if isinstance(heads, str) else ", ".join(heads)
