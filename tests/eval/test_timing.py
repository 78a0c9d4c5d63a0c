"""timed_peak: the seconds and the peak memory of one call."""

import mmap

from attnrank.eval.timing import timed_peak

PAGE = mmap.PAGESIZE


def _touch_fresh(mb: int) -> None:
    """Make ``mb`` MB resident in pages fresh from the kernel, then hand them back: an anonymous
    mapping, so that no free memory the allocator kept from earlier tests (still resident) can
    serve it, as it could an array's."""
    m = mmap.mmap(-1, mb * 2**20)
    try:
        for offset in range(0, mb * 2**20, PAGE):
            m[offset] = 1
    finally:
        m.close()


def test_timed_peak_sees_a_transient_allocation_and_not_an_earlier_one():
    _touch_fresh(400)  # 400 MB, freed before the timed call
    secs, peak = timed_peak(lambda: _touch_fresh(120))  # 120 MB, freed inside
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
