"""Block states: the per-model verdict of the rotation check."""

from __future__ import annotations

import gc

import pytest
from _tiny import tiny_model, tiny_tokenizer

from attnrank.errors import InputError
from attnrank.llm import states
from attnrank.llm.attention import AttentionCapturer
from attnrank.llm.blocks import build_block_prompts
from attnrank.llm.capture import capture_blocks


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


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("Phi", {"partial_rotary_factor": 0.5}),  # rotary over half of each head (Phi-4-mini: 0.75)
        ("StableLm", {"partial_rotary_factor": 0.25}),
        ("Gemma3Text", {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 512}),
    ],
)
def test_rotary_that_one_rotation_cannot_serve_is_refused_in_one_line(name, extra):
    """Partial rotary crashed the rotation (a shape error), Gemma 3's rotary per layer type (local
    and global bases) a TypeError; "rotated" positions are refused with an InputError instead, and
    the other schemes still run."""
    model = tiny_model(name, **extra)
    capturer = AttentionCapturer(model, [(1, 0)])
    prompt = build_block_prompts(tiny_tokenizer(), "Where is Paris?", ["Paris is in France.", "Kiwis."])
    prefix = capturer.prefill(prompt.prefix_ids)
    with pytest.raises(InputError, match="block_positions='rotated'.*use 'shared' or 'sequential'"):
        capture_blocks(capturer, prompt, prefix, fingerprint="t", positions="rotated")
    rows = capture_blocks(capturer, prompt, prefix, fingerprint="t", positions="sequential")
    assert rows.real.shape == (1, len(prompt.context_ids))
