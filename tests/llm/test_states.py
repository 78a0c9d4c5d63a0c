"""Block states: the per-model verdict of the rotation check."""

from __future__ import annotations

import gc

from _tiny import tiny_model

from attnrank.llm import states
from attnrank.llm.attention import AttentionCapturer


def test_rotation_verdict_is_not_inherited_through_a_reused_id(monkeypatch):
    """CPython reuses a freed object's id: a verdict keyed by id() would pass one model's result to
    the next model allocated at that address (a model whose rotary embedding does not compose
    would then pass unchecked). Every decoder is probed itself."""
    probes = []
    encode = states.encode_blocks
    monkeypatch.setattr(states, "encode_blocks", lambda *a, **k: probes.append(1) or encode(*a, **k))
    monkeypatch.setattr(states, "id", lambda obj: 1, raising=False)  # every object at "one address"
    for _ in range(2):
        capturer = AttentionCapturer(tiny_model("llama", layers=2, max_positions=256), [(1, 0)])
        states.check_rotation(capturer, capturer.prefill([5, 6, 7]))
        del capturer
        gc.collect()
    assert len(probes) == 4  # two probe encodings per model
