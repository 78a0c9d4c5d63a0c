"""Timing one call and the memory it takes: :func:`timed_peak` (the benchmarks' s/query and peak MB)."""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Callable
from typing import Any


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _reset_peak_rss() -> bool:
    """Reset this process's resident-set high-water mark (Linux: ``5`` into
    ``/proc/self/clear_refs``); False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_mb() -> float:
    """The resident-set high-water mark (``VmHWM``) since the last reset, in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise OSError("/proc/self/status has no VmHWM line")


def timed_peak(fn: Callable[[], Any]) -> tuple[float, float]:
    """Run ``fn()``; (seconds, peak RSS in MB above the RSS at the start).

    The peak is the kernel's high-water mark, reset before the call: exact, and nothing runs
    beside ``fn``. Where it cannot be reset, a thread samples the RSS every ms instead (torch
    releases the GIL in its kernels, so it sees the intermediate peaks).

    Why not always the sampler: its wake-ups take the GIL from the timed pass every ms, which
    made a warm default-preset query of 20 SciFact abstracts 11 % slower (0.328 -> 0.365 s)."""
    if _reset_peak_rss():
        # (the baseline read after the reset: memory freed between a reading before it and the
        # reset, by another thread, lowered the mark below that reading and hid the call's peak)
        start = _peak_rss_mb()
        t = time.perf_counter()
        fn()
        secs = time.perf_counter() - t
        return secs, max(_peak_rss_mb() - start, 0.0)
    start = _rss_mb()
    peak, done = [0.0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mb())
            time.sleep(0.001)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        t = time.perf_counter()
        fn()
        secs = time.perf_counter() - t
    finally:  # (a call that raised left the sampler running, slowing every later timing)
        done.set()
        th.join()
    return secs, max(peak[0], _rss_mb()) - start
