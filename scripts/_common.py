"""Argument types shared by the benchmark scripts (imported as ``from _common import ...``: a script's
own folder is on ``sys.path`` when it runs).

A count option is sliced (``items[:n]``, ``items[skip:]``): a negative value would cut from the
end and 0 would keep nothing, and the table would be named for a set it did not score. argparse
turns the :class:`argparse.ArgumentTypeError` into one error line naming the option, the value,
the limit and the fix, and exit status 2.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter


def _count(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= {minimum}; give {minimum} or more")
    return value


def positive_int(text: str) -> int:
    """A count of at least 1 (questions, candidates, folds, ...)."""
    return _count(text, 1)


def fold_count(text: str) -> int:
    """Cross-validation folds: at least 2 (a fold needs a training set); the scripts check the upper
    bound, the smallest set's queries, once the sets are read."""
    return _count(text, 2)


def non_negative_int(text: str) -> int:
    """A count of at least 0: an offset or skip, or a limit whose 0 means "all"."""
    return _count(text, 0)


def positive_ints(text: str) -> list[int]:
    """A comma-separated list of counts of at least 1 (``"20,50"``: candidate depths)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"{text!r} holds no number; give counts >= 1, comma-separated (e.g. 20,50)")
    return [_count(p, 1) for p in parts]


def measured_on(env: dict) -> str:
    """The run a per-question cache entry is timed in: its start (UTC, to the second: two runs of one
    day on one machine differ) and CPU (from :func:`attnrank.eval.report.environment`), stored in
    the entry as ``"measured"``. Call it once per run."""
    return f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, {env.get('cpu', 'CPU not recorded')}"


def timing_sources(timed: Counter[str], now: str, what: str = "model results") -> str:
    """One line saying where a table's seconds come from: ``timed`` counts the ``what`` by the
    run that timed them (``now`` = this run's :func:`measured_on`; ``""`` = a cached entry that
    recorded none). Why: a per-question cache serves results, seconds included, from earlier runs
    on other machines and hours, which a table of this run's seconds would otherwise pass as its own."""
    total = sum(timed.values())
    here = timed.get(now, 0)
    if here == total:
        return f"Seconds: {total} of {total} {what} were timed in this run."
    earlier = ", ".join(
        f"{n} timed {'in a run that recorded no date or CPU' if tag == '' else 'on ' + tag}"
        for tag, n in sorted(timed.items(), key=lambda kv: -kv[1])
        if tag != now
    )
    return (
        f"Seconds: {here} of {total} {what} were timed in this run; the others were read from the "
        f"per-question cache of earlier runs ({earlier}), so their seconds are those runs' (other times, "
        "maybe other machines). `--cache-dir ''` times everything afresh."
    )
