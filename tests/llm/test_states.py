"""Block states: the per-model verdict of the rotation check, and the memory contexts are assembled in."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from _tiny import tiny_model, tiny_tokenizer

from attnrank.errors import InputError
from attnrank.llm import states
from attnrank.llm.attention import AttentionCapturer
from attnrank.llm.blocks import build_block_prompts
from attnrank.llm.capture import capture_blocks
from attnrank.llm.context import ContextBuffer


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


def test_windows_assembled_in_kept_memory_equal_fresh_ones():
    """A context buffer lent from window to window (larger, smaller, larger again, with cached
    states) gives the rows fresh memory gives, and is kept (grown only when a window needs more)."""
    capturer = AttentionCapturer(tiny_model("llama", layers=3, max_positions=1024), [(1, 0), (2, 3)])
    tok = tiny_tokenizer()
    texts = ["Paris is the capital of France.", "Kiwis are birds. " * 6, "Rome is in Italy.", "Bananas are yellow."]
    prompts = [build_block_prompts(tok, "Where is Paris?", texts[:n]) for n in (4, 1, 3, 4)]
    prefix = capturer.prefill(prompts[0].prefix_ids)
    buffer, cache = ContextBuffer(), states.StateCache(1 << 30)
    sizes = []
    for prompt in prompts:
        fresh = capture_blocks(capturer, prompt, prefix, fingerprint="t", positions="rotated")
        kept = capture_blocks(
            capturer, prompt, prefix, fingerprint="t", positions="rotated", states=cache, buffer=buffer
        )
        assert np.array_equal(kept.real, fresh.real) and np.array_equal(kept.null, fresh.null)
        sizes.append(buffer.nbytes)
    assert sizes[0] > 0 and sizes == [sizes[0]] * 4  # the first (largest) window's memory served them all


def test_a_lent_context_buffer_gives_a_second_user_fresh_memory():
    """Two threads assembling at once must not share memory: while lent, take() allocates."""
    buffer = ContextBuffer()
    like = torch.zeros(1, dtype=torch.bfloat16)
    with buffer.take((2, 3), like) as (k1, v1), buffer.take((2, 3), like) as (k2, v2):
        pointers = {t.untyped_storage().data_ptr() for t in (k1, v1, k2, v2)}
        assert len(pointers) == 4 and k2.dtype == torch.bfloat16 and k2.shape == (2, 3)
    with buffer.take((4, 3), like) as (k3, _):  # larger: grown; the memory is kept for the next window
        assert k3.shape == (4, 3) and buffer.nbytes == 2 * 12 * 2


def test_blocks_under_rotary_that_follows_the_pass_are_encoded_alone():
    """Dynamic NTK frequencies follow the longest position of the pass: a block packed beside one
    at later positions got other states than alone, kept under the same key."""
    model = tiny_model("llama", layers=2, max_positions=64, rope_parameters={"rope_type": "dynamic", "factor": 2.0})
    capturer = AttentionCapturer(model, [(1, 0)])
    prefix = capturer.prefill([1, 2, 3])
    near, far = [5, 6, 7, 8], [9, 10, 11, 12]
    together = states.encode_blocks(capturer, prefix, [near, far], [3, 100])
    alone = states.encode_blocks(capturer, prefix, [near], [3])
    torch.testing.assert_close(together[0].keys, alone[0].keys, rtol=0, atol=0)
    torch.testing.assert_close(together[1].keys, states.encode_blocks(capturer, prefix, [far], [100])[0].keys)


def test_a_block_past_a_sliding_window_is_refused_before_any_state_is_kept():
    """Batched with a longer block, a short block's states came from a sliding-window cache that had
    dropped the early tokens (another block's keys, or padding); they were kept and reused by a
    later query that the window did not refuse (scores off by 8.5e-4, exit 0)."""
    capturer = AttentionCapturer(tiny_model("mistral", layers=2, sliding_window=80), [(1, 0)])
    tok = tiny_tokenizer()
    query, short, other = "Where is Paris?", "Paris is in France.", "Rome is in Italy."
    long = "Kiwis are small birds of New Zealand. " * 6
    cache = states.StateCache(1 << 30)
    both = build_block_prompts(tok, query, [short, long])
    prefix = capturer.prefill(both.prefix_ids)
    with pytest.raises(InputError, match=r"reaches this model's sliding window of 80"):
        capture_blocks(capturer, both, prefix, fingerprint="t", positions="shared", states=cache)
    assert len(cache) == 0
    later = build_block_prompts(tok, query, [short, other])
    warm = capture_blocks(capturer, later, prefix, fingerprint="t", positions="shared", states=cache)
    cold = capture_blocks(capturer, later, prefix, fingerprint="t", positions="shared")
    assert np.array_equal(warm.real, cold.real)


def test_a_model_whose_layers_differ_in_head_size_scores_in_full_and_refuses_block_attention():
    """Gemma 4: its full-attention layers have another head size than its sliding ones. Block
    attention stacked every layer's states and failed with a raw "stack expects each tensor to be
    equal size" after encoding the blocks; the query likelihood with a state cache failed reading
    the config's head_dim (a RuntimeError for a head size set per layer)."""
    from attnrank.errors import ModelError
    from attnrank.llm.models import LLM
    from attnrank.rerank.attention import AttentionReranker
    from attnrank.types import Document

    try:
        model = tiny_model(
            "Gemma4Text",
            layers=3,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            sliding_window=512,
            global_head_dim=16,
            vocab_size_per_layer_input=259,
            hidden_size_per_layer_input=8,
        )
    except (AttributeError, TypeError, ValueError) as e:  # a transformers without Gemma 4
        pytest.skip(f"no Gemma 4 in this transformers: {e}")
    llm = LLM(model=model, tokenizer=tiny_tokenizer(), model_id="tiny-gemma4", fingerprint="g" * 64)
    docs = [Document("a", "Paris is in France."), Document("b", "Rome is in Italy.")]
    scores = AttentionReranker(llm, config="likelihood").score("Where is Paris?", docs)
    assert np.isfinite(scores).all()
    block = AttentionReranker(llm, heads=[(0, 1), (2, 0)], attention="block", block_positions="shared", signals=None)
    with pytest.raises(ModelError, match="layer 2 has 2 key/value heads of size 16 .* use attention='full'"):
        block.score("Where is Paris?", docs)
