"""timed_peak: the seconds and the peak memory of one call."""

import numpy as np

from attnrank.eval.timing import timed_peak


def test_timed_peak_sees_a_transient_allocation_and_not_an_earlier_one():
    big = np.ones(400 * 2**20 // 8)  # 400 MB, freed before the timed call
    del big
    secs, peak = timed_peak(lambda: np.ones(120 * 2**20 // 8).sum())  # 120 MB, freed inside
    assert secs > 0
    assert 100 < peak < 300  # the call's own peak, not the earlier 400 MB
    _, quiet = timed_peak(lambda: None)
    assert quiet < 50


def test_a_call_that_raises_leaves_no_sampler_running(monkeypatch):
    """Where peak RSS cannot be reset, a thread samples memory; a call that raised left it running
    for the rest of the process (it took the GIL every millisecond)."""
    import threading

    import pytest

    from attnrank.eval import timing

    monkeypatch.setattr(timing, "_reset_peak_rss", lambda: False)
    before = threading.active_count()

    def fails():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        timed_peak(fails)
    assert threading.active_count() == before
