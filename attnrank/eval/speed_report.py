"""The block-attention section of the benchmarks page (``scripts/bench_rerank.py --blocks``):
the speed cells of :mod:`attnrank.speed`, their speed-ups, the issue's targets, the passage-state
stores and the quality comparison, as markdown."""

from __future__ import annotations

from typing import Any

from .report import md_table

MODES = ("full", "block-cold", "block-warm")  # the speed cells' modes (attnrank.speed), in table order
# Issue 15's targets: warm s/query at K=20 and K=100; cold speed-up over the full prompt at K=20.
WARM_TARGETS = {20: 0.3, 100: 1.0}
COLD_SPEEDUP = 1.5


def _row(
    rows: list[dict[str, Any]], dataset: str, k: int, mode: str, dtype: str, like: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """The speed cell of (dataset, K, mode, dtype), if measured; with ``like``, only one measured
    on the same machine the same day (:func:`_comparable`)."""
    return next(
        (
            r
            for r in rows
            if (r["dataset"], r["K"], r["mode"], r["dtype"]) == (dataset, k, mode, dtype)
            and (like is None or _comparable(r, like))
        ),
        None,
    )


def _comparable(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two cells whose times may be divided: the same CPU and the same day. A resumed run keeps
    its earlier cells, and the machines are shared and differ: a ratio of cells of two machines
    or days measures them, not the modes."""
    return a.get("cpu") == b.get("cpu") and a.get("measured") == b.get("measured")


def _cell(
    rows: list[dict[str, Any]], dataset: str, k: int, mode: str, dtype: str, like: dict[str, Any] | None = None
) -> float | None:
    hit = _row(rows, dataset, k, mode, dtype, like)
    return None if hit is None else hit.get("s/query")


def _target_rows(
    dataset: str,
    warm: dict[int, float],
    colds: list[tuple[str, float, str]],
    per_candidate: dict[int, float],
    ks: str,
) -> list[dict[str, Any]]:
    """One dataset's target rows: warm s/query by K (for the K of ``WARM_TARGETS``), cold K=20
    speed-ups ``(full prompt's dtype, speed-up, note after it)``, and cold s per candidate by K
    (``ks``: the K the row names)."""
    out = [
        {
            "dataset": dataset,
            "target": f"warm K={k} <= {limit} s",
            "measured": f"{warm[k]:.2f} s",
            "met": _met(warm[k] <= limit),
        }
        for k, limit in WARM_TARGETS.items()
        if k in warm
    ]
    out += [
        {
            "dataset": dataset,
            "target": f"cold K=20 >= {COLD_SPEEDUP}x the {base} full prompt",
            "measured": f"{up:.2f}x{note}",
            "met": _met(up >= COLD_SPEEDUP),
        }
        for base, up, note in colds
    ]
    if len(per_candidate) > 1:
        out.append(
            {
                "dataset": dataset,
                "target": f"cold grows linearly in K (s per candidate, K={ks})",
                "measured": " / ".join(f"{v:.3f}" for v in per_candidate.values()),
                "met": "",
            }
        )
    return out


def _met(ok: bool) -> str:
    return "yes" if ok else "no"


def block_targets(rows: list[dict[str, Any]], dtype: str) -> list[dict[str, Any]]:
    """Per dataset, each target's measured value (``dtype``'s cells; the cold speed-up also against
    the float32 full prompt, the capture before block attention) and whether it is met."""
    out: list[dict[str, Any]] = []
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        warm = {k: s for k in WARM_TARGETS if (s := _cell(rows, dataset, k, "block-warm", dtype)) is not None}
        cold_row = _row(rows, dataset, 20, "block-cold", dtype)
        cold = None if cold_row is None else cold_row.get("s/query")
        # the full prompt of the same machine and day only (a ratio across them measures the machines)
        fulls = {base: _cell(rows, dataset, 20, "full", base, cold_row) for base in dict.fromkeys((dtype, "float32"))}
        colds = [(base, full / cold, "") for base, full in fulls.items() if cold and full]
        per = {k: s / k for k in (10, 20, 50, 100) if (s := _cell(rows, dataset, k, "block-cold", dtype))}
        out += _target_rows(dataset, warm, colds, per, "10/20/50/100")
    return out


def row_positions(row: dict[str, Any]) -> str:
    """The block positions an interleaved row was timed with (rows from before they were
    recorded: ``"rotated"``, the reranker's default then as now)."""
    return str(row.get("positions", "rotated"))


def interleaved_targets(rows: list[dict[str, Any]], dtype: str, positions: str = "rotated") -> list[dict[str, Any]]:
    """The targets of :func:`block_targets` from the interleaved rows of ``dtype`` and block
    ``positions`` (:func:`attnrank.speed.measure_interleaved`: the modes timed in turn on each query)."""
    out: list[dict[str, Any]] = []
    rows = [r for r in rows if r["dtype"] == dtype and row_positions(r) == positions]
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        mine = {r["K"]: r for r in sorted(rows, key=lambda r: r["K"]) if r["dataset"] == dataset}
        warm = {k: mine[k]["block-warm s/query"] for k in WARM_TARGETS if k in mine}
        colds = []
        if 20 in mine:
            spread = mine[20]["cold speed-up per query (min-max)"]
            colds.append((dtype, mine[20]["cold speed-up"], f" (per query {spread})"))
        per = {k: r["block-cold s/query"] / k for k, r in mine.items()}
        out += _target_rows(dataset, warm, colds, per, "/".join(map(str, mine)))
    return out


def interleaved_markdown(rows: list[dict[str, Any]], dtype: str) -> list[str]:
    """The interleaved timing's targets (per block positions) and table (none if it has no rows
    of ``dtype``)."""
    mine = [{**r, "positions": row_positions(r)} for r in rows if r["dtype"] == dtype]
    if not mine:
        return []
    cols = ["dataset", "positions", "K", "queries", *(f"{m} s/query" for m in MODES), "cold speed-up"]
    cols += ["cold speed-up per query (min-max)", "probe GFLOP/s", "measured", "cpu"]
    fmt = {f"{m} s/query": ".2f" for m in MODES} | {"cold speed-up": ".2f", "probe GFLOP/s": ".0f"}
    out = []
    for positions in dict.fromkeys(r["positions"] for r in mine):
        out += [
            f"Targets (issue 15), {dtype}, blocks at {positions} positions, the three modes timed in turn on "
            "each query in one process (attnrank.speed.measure_interleaved: one model shared by a full-prompt "
            "and a block reranker; the order alternates per query; block-warm follows block-cold and reuses "
            "its states), so that a speed-up is not a drift of the shared machine's rate between two cells:",
            "",
            md_table(interleaved_targets(mine, dtype, positions), ["dataset", "target", "measured", "met"]),
            "",
        ]
    return out + [
        "Interleaved timing (`scripts/bench_rerank.py --blocks [--blocks-positions P]`; cold speed-up = mean "
        "full s/query over mean block-cold s/query; probe GFLOP/s = the machine's bfloat16 matrix-product "
        "rate around the row's queries):",
        "",
        md_table(mine, cols, fmt),
        "",
    ]


def targets_markdown(rows: list[dict[str, Any]], dtype: str, beside_interleaved: bool = False) -> list[str]:
    targets = block_targets(rows, dtype)
    if not targets:
        return []
    title = (
        f"The same targets from the {dtype} cells below (each in a fresh process, minutes apart):"
        if beside_interleaved
        else f"Targets (issue 15), {dtype} cells:"
    )
    return [title, "", md_table(targets, ["dataset", "target", "measured", "met"]), ""]


def blocks_markdown(
    speed_rows: list[dict[str, Any]],
    q_rows: list[dict[str, Any]],
    stores: dict[str, Any],
    env: dict[str, Any],
    interleaved: list[dict[str, Any]] | None = None,
) -> str:
    """The block-attention section of the benchmarks page (cells by dtype, dataset, K and mode;
    the issue's targets on the first dtype's interleaved rows, and on its cells)."""
    dtypes = list(dict.fromkeys(r["dtype"] for r in [*speed_rows, *(interleaved or [])]))
    datasets = list(dict.fromkeys(r["dataset"] for r in speed_rows))
    speed_rows = sorted(
        speed_rows,
        key=lambda r: (dtypes.index(r["dtype"]), datasets.index(r["dataset"]), r["K"], MODES.index(r["mode"])),
    )
    out = [
        f"# Block attention: speed and quality ({env['date']}, {env['cpus']} CPUs, torch {env['torch']})",
        "",
        f"CPU: {env.get('cpu', 'not recorded')}.",
        "",
        "Preset qrhead (attention alone: 16 registered heads, deepest layer 23), SmolLM2-135M-Instruct. "
        "Speed: each cell in a fresh process; block-cold = no cached passage state; block-warm = every "
        "candidate's state in memory (only the query's suffix runs); peak extra MB = peak RSS growth "
        "during the query; SciFact candidates are random abstracts (300-word cap). Cold blocks are "
        "encoded packed, up to 4,096 tokens a sequence, each block attending to the prefix and itself "
        "only (llm.layouts.segmented_forward). Candidates past one window (about 8,000 positions) are "
        "cut into windows, assembled side by side and read by one suffix pass (llm.context; its kept "
        "memory is in peak extra MB only the first time). In bfloat16 the blocks and suffixes attend "
        f"by this CPU's default kernel, {env.get('attention kernel', 'few-rows')} (llm.kernels.default_kernel: "
        "SDPA on a CPU with AMX, else llm.kernels.few_rows_attention; docs/results/rerank_kernels*.md). A resumed "
        "run keeps the cells it already has; `measured` says when each ran: compare cells measured the same day "
        "(the machines are shared and differ between days). probe GFLOP/s: the machine's matrix-product rate "
        "around the cell's queries (attnrank.speed.probe_gflops; bfloat16 for bfloat16 cells, else float32): "
        "a shared machine's rate varies, and a cell timed at a low rate is slow for that reason.",
        "",
        *interleaved_markdown(interleaved or [], dtypes[0] if dtypes else ""),
        *targets_markdown(speed_rows, dtypes[0] if dtypes else "", bool(interleaved)),
    ]
    if not speed_rows:  # (an interleaved timing alone: no cells, no empty tables)
        return "\n".join([*out, *_stores_and_quality(stores, q_rows)]) + "\n"
    out += [
        md_table(
            speed_rows,
            [
                "dataset",
                "dtype",
                "K",
                "mode",
                "queries",
                "s/query",
                "peak extra MB",
                "cached MB",
                "probe GFLOP/s",
                "measured",
                "cpu",
                "error",
            ],
            {"s/query": ".2f", "peak extra MB": ".0f", "cached MB": ".0f", "probe GFLOP/s": ".0f"},
        ),
        "",
    ]

    ratio_rows = []
    for r in speed_rows:
        if "s/query" not in r:
            continue
        same = _row(speed_rows, r["dataset"], r["K"], "full", r["dtype"], r)
        f32 = _row(speed_rows, r["dataset"], r["K"], "full", "float32", r)
        row = {**r}
        if r.get("mode") != "full" and same and "s/query" in same:
            row["speed-up vs full"] = same["s/query"] / r["s/query"]
        if f32 is not None and f32 is not r and "s/query" in f32:
            row["speed-up vs float32 full"] = f32["s/query"] / r["s/query"]
        if len(row) > len(r):
            ratio_rows.append(row)
    out += [
        "Speed-ups against the full-prompt capture of the same dtype, and against the float32 full-prompt "
        "capture (the capture before block attention), each from cells of the same machine and day (blank "
        "where there is none):",
        "",
    ]
    cols = ["dataset", "dtype", "K", "mode", "speed-up vs full", "speed-up vs float32 full"]
    out += [md_table(ratio_rows, cols, {c: ".1f" for c in cols[4:]}), ""]
    return "\n".join([*out, *_stores_and_quality(stores, q_rows)]) + "\n"


def _stores_and_quality(stores: dict[str, Any], q_rows: list[dict[str, Any]]) -> list[str]:
    """The block section's store sizes and quality comparison, where the run has them."""
    out: list[str] = []
    if stores:
        per_token = stores["sizes"][0]["bytes/token"]
        out += [
            "## Passage-state stores",
            "",
            "Bytes per passage token (keys and values of layers 0..23): "
            + ", ".join(f"{k} {v:,}" for k, v in per_token.items())
            + ". Sizes from the block token counts (300-word cap):",
            "",
            md_table(
                stores["sizes"][1:],
                ["passages", "count", "tokens", *[f"{k} GiB" for k in per_token]],
                {f"{k} GiB": ".2f" for k in per_token},
            ),
            "",
            "Stores built for real (`attnrank.llm.statestore_write.write_store`, default preset):",
            "",
            md_table(
                stores["built"],
                ["passages", "storage", "count", "tokens", "build s", "MiB on disk", "bytes/token"],
                {"build s": ".1f", "MiB on disk": ".0f", "bytes/token": ".0f"},
            ),
            "",
        ]
    if q_rows:
        out += [
            "## Quality: full vs block attention (nDCG@10, each query cold)",
            "",
            "Its s/query column comes from the comparison run (one thread, lowest priority, beside other "
            "jobs): read speed from the table above. `measured`: the day each mode's run was captured "
            "(a resumed comparison reuses earlier runs).",
            "",
            md_table(
                q_rows,
                ["setting", "mode", "nDCG@10", "wins/losses vs full", "sign test p", "s/query", "measured"],
                {"nDCG@10": ".4f", "sign test p": ".3f", "s/query": ".2f"},
            ),
        ]
    return out
