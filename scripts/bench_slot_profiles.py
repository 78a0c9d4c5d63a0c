"""Raw-attention slot profiles of the default model, for reordering passages before generation
(Attention Basin / AttnRank, Yi et al., arXiv 2508.05128; :mod:`attnrank.rerank.position`).

    python scripts/bench_slot_profiles.py [--slots 5,20] [--trials 40] [--ship]

For each slot count K: ``--trials`` prompts of K HotpotQA distractor paragraphs drawn at random
(paragraphs of the questions without sentence-level labels; ``bench_ask.py`` evaluates those
only with ``--include-unlabelled``, as its record ``ask`` did: the shipped profile had seen their
paragraphs, never their labels or questions) with a content-free question; per prompt slot, the mean attention the document there
receives from the question (every head, no calibration, no token filter:
:func:`attnrank.rerank.profile.measure_slot_profile`). Beside it, the registered profile of
calibrated scores at the same K (what ``reorder_for_generation`` read before 2026-12-05), and the
placement each gives a best-first list. ``--ship`` registers the raw profiles in the package.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import numpy as np
from _common import positive_int, positive_ints

from attnrank.config import set_torch_threads
from attnrank.eval.datasets import data_root, hotpotqa_rows
from attnrank.eval.report import environment, md_table, write_outputs
from attnrank.types import Document

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "docs" / "results"
log = logging.getLogger("bench_slot_profiles")


def pool(root: Path) -> list[Document]:
    """Paragraphs of the HotpotQA questions without sentence-level labels (evaluated by
    ``bench_ask.py --include-unlabelled`` only)."""
    return [
        Document(f"{r['id']}_{p['pid']}", p["text"], p["title"])
        for r in hotpotqa_rows(root)
        if not r.get("has_sentence_level_sf")
        for p in r["paragraphs"]
    ]


def placement(k: int, profile) -> str:
    """Where the best-first list's documents go: prompt slot of rank 1, 2, ... (0 = first)."""
    order = np.argsort(-profile.curve(k), kind="stable")
    return ", ".join(str(int(s)) for s in order)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slots", type=positive_ints, default=[5, 20], help="slot counts K (default 5,20)")
    ap.add_argument("--trials", type=positive_int, default=40, help="random prompts per K (default 40)")
    ap.add_argument("--data", default=None, help="shared data folder (default ../shared/data, ATTNRANK_DATA)")
    ap.add_argument("--ship", action="store_true", help="register the profiles in attnrank/heads/data")
    ap.add_argument("--out-dir", default=str(OUT))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    set_torch_threads()

    from attnrank.llm.models import load_llm
    from attnrank.rerank.attention import AttentionReranker
    from attnrank.rerank.position import load_stored_profile, store_profile
    from attnrank.rerank.profile import measure_slot_profile

    docs = pool(data_root(args.data, default=REPO.parent / "shared" / "data"))
    llm = load_llm(None)
    reranker = AttentionReranker(llm, config="icr", calibrate=False, token_filter=False)
    rows, profiles = [], {}
    for k in args.slots:
        start = time.perf_counter()
        raw = measure_slot_profile(reranker, docs, n_slots=k, n_trials=args.trials, seed=0)
        seconds = time.perf_counter() - start
        profiles[k] = raw
        try:
            calibrated = load_stored_profile(llm.model_id, llm.fingerprint, n_slots=k)
        except Exception as e:  # (none registered for this model)
            log.info("no calibrated profile to compare with: %s", e)
            calibrated = None
        rows.append(
            {
                "K": k,
                "trials": args.trials,
                "raw attention per slot": ", ".join(f"{x:.4f}" for x in raw.mean_score),
                "raw: slot of rank 1, 2, ...": placement(k, raw),
                "calibrated (registered) per slot": ""
                if calibrated is None
                else ", ".join(f"{x:.4f}" for x in calibrated.curve(k)),
                "calibrated: slot of rank 1, 2, ...": "" if calibrated is None else placement(k, calibrated),
                "seconds": seconds,
            }
        )
        log.info("K=%d: %s (%.0f s)", k, rows[-1]["raw attention per slot"], seconds)
        if args.ship:
            store_profile(raw, root=REPO / "attnrank" / "heads" / "data")
    env = environment()
    command = env["command"]  # (as this process ran: a retyped line dropped options)
    md = "\n".join(
        [
            "# Slot profiles: raw attention per prompt slot (Attention Basin / AttnRank)",
            "",
            f"Command: `{command}`. Date: {env['date']}. Machine: {env['cpu']}, {env['threads']} threads. "
            f"Model: {llm.model_id} ({str(llm.dtype).removeprefix('torch.')}).",
            "",
            "Per K: the mean attention (every head, uncalibrated, unfiltered) that the document at each prompt "
            "slot (0 = first) receives from a content-free question, over random prompts of HotpotQA distractor "
            "paragraphs (questions without sentence labels); and the registered profile of calibrated scores "
            "(real minus 'N/A'), which reordering read before. 'slot of rank i': where "
            "reorder_for_generation puts the i-th best passage.",
            "",
            md_table(rows, list(rows[0]), {"seconds": ".0f"}),
            "",
        ]
    )
    payload = {"environment": env, "command": command, "rows": rows}
    for path in write_outputs("slot_profiles", payload, md, args.out_dir):
        log.info("wrote %s", path)


if __name__ == "__main__":
    main()
