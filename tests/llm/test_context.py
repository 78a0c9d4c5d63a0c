"""Block attention's windows assembled side by side: one suffix pass over a batch of padded
contexts gives each window the rows it gets alone, whatever the kept memory held before."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tiny import tiny_model, tiny_tokenizer

from attnrank.errors import InputError
from attnrank.llm.attention import AttentionCapturer
from attnrank.llm.blocks import build_block_prompts
from attnrank.llm.capture import _batches, capture_block_windows, capture_blocks
from attnrank.llm.context import ContextBuffer, assemble_windows, one_window_per_pass, windows_shape
from attnrank.llm.states import StateCache, encode_blocks

TEXTS = [
    "Paris is the capital of France.",
    "Kiwis are flightless birds of New Zealand. " * 3,
    "Rome is in Italy.",
    "Bananas are yellow and rich in potassium.",
    "Berlin is the capital of Germany.",
]
GROUPS = [[0, 3], [1, 4, 2], [2]]  # windows of different lengths: the shorter ones are padded


def windows(tok, query="Where is Paris?"):
    whole = build_block_prompts(tok, query, TEXTS)
    return [whole.select(g, "forward") for g in GROUPS]


@pytest.mark.parametrize(
    ("family", "positions"),
    [
        ("llama", "rotated"),
        ("llama", "sequential"),
        ("qwen2", "shared"),
        ("gemma", "rotated"),
        ("Gemma3Text", "shared"),
    ],
)
def test_windows_in_one_pass_equal_each_window_alone(family, positions):
    """Gemma 3 has sliding-window layers: its windows run one per pass, with the same result."""
    capturer = AttentionCapturer(tiny_model(family, layers=3, max_positions=2048), [(0, 1), (1, 3), (2, 0)])
    prompts = windows(tiny_tokenizer())
    prefix = capturer.prefill(prompts[0].prefix_ids)
    together = capture_block_windows(capturer, prompts, prefix, fingerprint="t", positions=positions)
    assert len(together) == len(prompts)
    for prompt, rows in zip(prompts, together, strict=True):
        alone = capture_blocks(capturer, prompt, prefix, fingerprint="t", positions=positions)
        assert rows.real.shape == alone.real.shape == (3, len(prompt.context_ids))
        np.testing.assert_allclose(rows.real, alone.real, rtol=0, atol=1e-6)
        np.testing.assert_allclose(rows.null, alone.null, rtol=0, atol=1e-6)
        assert (rows.real.sum(axis=1) > 0.1).all()  # real rows over the context, not padding
        assert not rows.labelled and not alone.labelled  # blocks carry no [i] slot label


def test_padding_is_never_read_even_where_the_kept_memory_held_nan():
    """The kept memory is uninitialised between queries: padding left as found (here NaN) would
    reach every row of a shorter window through the softmax."""
    capturer = AttentionCapturer(tiny_model("llama", layers=3, max_positions=2048), [(1, 0), (2, 3)])
    prompts = windows(tiny_tokenizer())
    prefix = capturer.prefill(prompts[0].prefix_ids)
    fresh = capture_block_windows(capturer, prompts, prefix, fingerprint="t", positions="rotated")
    buffer = ContextBuffer()
    like = prefix.cache.layers[0].keys
    with buffer.take((1 << 20,), like) as (keys, values):  # more than the windows need: it is reused
        keys.fill_(float("nan"))
        values.fill_(float("nan"))
    poisoned = buffer._memory[0].data_ptr()
    kept = capture_block_windows(capturer, prompts, prefix, fingerprint="t", positions="rotated", buffer=buffer)
    assert buffer._memory[0].data_ptr() == poisoned  # the NaN memory was what the windows were assembled in
    for a, b in zip(kept, fresh, strict=True):
        assert np.isfinite(a.real).all() and np.array_equal(a.real, b.real) and np.array_equal(a.null, b.null)


def test_a_small_batch_budget_runs_the_windows_in_several_passes_with_the_same_rows():
    capturer = AttentionCapturer(tiny_model("llama", layers=3, max_positions=2048), [(1, 0), (2, 3)])
    prompts = windows(tiny_tokenizer())
    prefix = capturer.prefill(prompts[0].prefix_ids)
    cache = StateCache(1 << 30)
    one = capture_block_windows(capturer, prompts, prefix, fingerprint="t", states=cache)
    assert len(cache) == len(TEXTS)  # each block encoded once (block 2 sits in two windows)
    each = capture_block_windows(capturer, prompts, prefix, fingerprint="t", states=cache, batch_bytes=1)
    for a, b in zip(one, each, strict=True):
        np.testing.assert_allclose(a.real, b.real, rtol=0, atol=1e-6)


def test_windows_of_other_queries_are_refused_together():
    capturer = AttentionCapturer(tiny_model("llama", layers=2), [(1, 0)])
    tok = tiny_tokenizer()
    a, b = windows(tok)[0], windows(tok, "Where is Rome?")[1]
    prefix = capturer.prefill(a.prefix_ids)
    with pytest.raises(InputError, match="share their prefix and suffixes"):
        capture_block_windows(capturer, [a, b], prefix, fingerprint="t")


def test_assembled_windows_hold_each_context_then_zeros():
    capturer = AttentionCapturer(tiny_model("llama", layers=2), [(1, 0)])
    prompts = windows(tiny_tokenizer())
    prefix = capturer.prefill(prompts[0].prefix_ids)
    placed = [
        encode_blocks(capturer, prefix, [p.blocks[i] for i in p.order], [prefix.length] * len(p.blocks))
        for p in prompts
    ]
    context = assemble_windows(capturer, prefix, placed)
    lengths = [prefix.length + sum(s.n_tokens for s in states) for states in placed]
    assert context.lengths == tuple(lengths) and context.length == max(lengths) and context.batch == 3
    assert windows_shape(capturer, prefix, placed)[1:4:2] == (3, max(lengths))
    keys = context.cache.layers[1].keys
    for w, states in enumerate(placed):
        expected = torch.cat([prefix.cache.layers[1].keys[0]] + [s.keys[1] for s in states], dim=1)
        assert torch.equal(keys[w, :, max(lengths) - lengths[w] :], expected)
        assert not keys[w, :, : max(lengths) - lengths[w]].any()


def test_batches_are_sized_padded_to_their_longest_window():
    """Windows of 3, 1 and 1 (units) take 3 each side by side: a budget of 5 holds one of them."""
    sizes = {"a": 3, "b": 1, "c": 1}
    runs = list(_batches(["a", "b", "c"], sizes.get, 5, False))
    assert runs == [["a"], ["b", "c"]]
    assert list(_batches(["a", "b", "c"], sizes.get, 9, False)) == [["a", "b", "c"]]
    assert list(_batches(["b", "c"], sizes.get, 9, True)) == [["b"], ["c"]]


def test_rotary_frequencies_that_follow_the_batch_run_one_window_per_pass():
    """Dynamic NTK rotary frequencies follow the longest position of the pass: windows side by
    side would move each other's positions; they run alone, with the rows they get alone. The
    model's original context sits between the windows' lengths, so that the longest one's pass
    switches frequencies and the others' do not; each reference is a fresh model (dynamic NTK keeps
    frequencies it grew from one pass to the next)."""
    prompts = windows(tiny_tokenizer())
    extents = sorted(p.suffix_start("sequential") + len(p.real_suffix_ids) for p in prompts)

    def fresh() -> tuple[AttentionCapturer, object]:
        rope = {"rope_type": "dynamic", "factor": 2.0}
        model = tiny_model("llama", layers=3, max_positions=(extents[0] + extents[-1]) // 2, rope_parameters=rope)
        capturer = AttentionCapturer(model, [(1, 0), (2, 3)])
        return capturer, capturer.prefill(prompts[0].prefix_ids)

    capturer, prefix = fresh()
    assert one_window_per_pass(capturer, prefix)
    plain = AttentionCapturer(tiny_model("llama", layers=3), [(1, 0)])
    assert not one_window_per_pass(plain, plain.prefill(prompts[0].prefix_ids))
    together = capture_block_windows(capturer, prompts, prefix, fingerprint="t", positions="sequential")
    for prompt, rows in zip(prompts, together, strict=True):
        capturer, prefix = fresh()
        alone = capture_blocks(capturer, prompt, prefix, fingerprint="t", positions="sequential")
        np.testing.assert_array_equal(rows.real, alone.real)


def test_a_batched_context_is_refused_by_single_captures():
    capturer = AttentionCapturer(tiny_model("llama", layers=2), [(1, 0)])
    prompts = windows(tiny_tokenizer())
    prefix = capturer.prefill(prompts[0].prefix_ids)
    placed = [encode_blocks(capturer, prefix, p.blocks, [prefix.length] * len(p.blocks)) for p in prompts]
    context = assemble_windows(capturer, prefix, placed)
    with pytest.raises(InputError, match="holds 3 contexts"):
        capturer.capture([5, 6], prefix=context)
    with pytest.raises(InputError, match="holds 3 contexts"):
        capturer.capture_suffixes([[5, 6]], [0], prefix=context)


def test_rotary_that_follows_the_pass_captures_the_query_without_the_calibration_suffix_beside_it():
    """LongRoPE frequencies follow the pass's longest position: the real query and "N/A" packed
    in one pass gave each the frequencies of the longer one (the calibration row moved with the
    query's length)."""
    from _tiny import tiny_longrope_model

    from attnrank.llm.capture import capture_window
    from attnrank.llm.prompts import CALIBRATION_QUERY, build_rerank_prompts

    docs = ["Paris is in France.", "Rome."]
    pair = build_rerank_prompts(tiny_tokenizer(), "Where is Paris, the capital city?", docs)
    n_prefix, n_real, n_null = len(pair.prefix_ids), len(pair.real_suffix_ids), len(pair.calibration_suffix_ids)
    assert n_null < n_real
    # the frequencies switch between the two suffixes' ends: packed, "N/A" got the query's long set
    model = tiny_longrope_model(max_positions=n_prefix + n_real + 64, switch=n_prefix + (n_real + n_null) // 2)
    capturer = AttentionCapturer(model, [(1, 0), (1, 3)])
    calibrated = capture_window(capturer, pair, calibrate=True, query_span="full")
    alone = capture_window(capturer, pair, calibrate=False, query_span="full")
    np.testing.assert_array_equal(calibrated.real, alone.real)
    na = build_rerank_prompts(tiny_tokenizer(), CALIBRATION_QUERY, docs)  # its real suffix: the "N/A" one
    assert na.real_suffix_ids == pair.calibration_suffix_ids and na.prefix_ids == pair.prefix_ids
    np.testing.assert_array_equal(
        calibrated.null, capture_window(capturer, na, calibrate=False, query_span="full").real
    )
