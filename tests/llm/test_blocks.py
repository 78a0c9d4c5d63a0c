"""Block attention: rows equal an eager reference with an explicit block mask; cached states
equal recomputed ones; the prompt's blocks do not depend on their neighbours."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from _tiny import tiny_model, tiny_tokenizer
from transformers import DynamicCache

from attnrank.errors import InputError
from attnrank.llm.attention import AttentionCapturer
from attnrank.llm.blocks import ENTRY_OVERHEAD, BlockMemo, build_block_prompts, memo_key
from attnrank.llm.capture import capture_blocks
from attnrank.llm.context import ContextLayer, assemble
from attnrank.llm.recording import attn_implementation
from attnrank.llm.states import StateCache, encode_blocks
from attnrank.types import Document

DOCS = [
    "Paris is the capital of France.",
    "Berlin is the capital of Germany and its largest city.",
    "Bananas are rich in potassium.",
]
QUERY = "What is the capital of France?"


def block_mask(prompt, positions: str, suffix: list[int]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Ids, position ids and a 4-D additive mask of the whole block-attention sequence, built by hand."""
    n_prefix = len(prompt.prefix_ids)
    ids = prompt.context_ids + suffix
    owner = [-1] * n_prefix  # -1: prefix
    for i in prompt.order:
        owner += [i] * len(prompt.blocks[i])
    starts = prompt.starts(positions)
    pos = list(range(n_prefix))
    for i in prompt.order:
        pos += list(range(starts[i], starts[i] + len(prompt.blocks[i])))
    s0 = prompt.suffix_start(positions)
    pos += list(range(s0, s0 + len(suffix)))
    owner += [-2] * len(suffix)  # -2: suffix
    n = len(ids)
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for q in range(n):
        for k in range(q + 1):
            oq, ok = owner[q], owner[k]
            allowed[q, k] = oq == -2 or ok == -1 or oq == ok
    mask = torch.zeros(1, 1, n, n).masked_fill(~allowed, float("-inf"))
    return torch.tensor([ids]), torch.tensor([pos]), mask


def eager_rows(model, ids, pos, mask, query_start: int, heads) -> torch.Tensor:
    with torch.inference_mode(), attn_implementation(model.get_decoder().config, "eager"):
        att = model(input_ids=ids, position_ids=pos, attention_mask=mask, output_attentions=True).attentions
    return torch.stack([att[layer][0, head, query_start:].float().mean(0) for layer, head in heads])


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "gemma"])
@pytest.mark.parametrize("positions", ["shared", "sequential"])
def test_block_rows_equal_eager_block_mask(family, positions):
    model = tiny_model(family, layers=3, heads=4, kv_heads=2, max_positions=4096)
    tok = tiny_tokenizer()
    heads = [(0, 1), (1, 3), (2, 0)]
    capturer = AttentionCapturer(model, heads)
    prompt = build_block_prompts(tok, QUERY, DOCS)
    prefix = capturer.prefill(prompt.prefix_ids)
    rows = capture_blocks(capturer, prompt, prefix, fingerprint="t", positions=positions, calibrate=False)
    ids, pos, mask = block_mask(prompt, positions, prompt.real_suffix_ids)
    n_ctx = len(prompt.context_ids)
    ref = eager_rows(model, ids, pos, mask, n_ctx, heads)[:, :n_ctx].double().numpy()
    assert rows.real.shape == ref.shape
    err = abs(rows.real - ref).max()
    assert err < 1e-5
    # Block attention differs from the full prompt: a block does not see the blocks before it.
    full_mask = torch.zeros_like(mask).masked_fill(torch.ones_like(mask, dtype=torch.bool).triu(1), float("-inf"))
    full = eager_rows(model, ids, pos, full_mask, n_ctx, heads)[:, :n_ctx].double().numpy()
    assert abs(rows.real - full).max() > 20 * max(err, 1e-9)


def test_cached_states_equal_recomputed(llm):
    capturer = AttentionCapturer(llm.model, [(1, 0), (3, 2)])
    prompt = build_block_prompts(llm.tokenizer, QUERY, DOCS)
    prefix = capturer.prefill(prompt.prefix_ids)
    cache = StateCache(1 << 30)
    cold = capture_blocks(capturer, prompt, prefix, fingerprint=llm.fingerprint, states=cache)
    assert (cache.hits, cache.misses, len(cache)) == (0, 3, 3)
    # Another query over two of the same passages and a new one: two hits, one miss.
    other = build_block_prompts(llm.tokenizer, "Which city is in Germany?", [DOCS[1], "Rome is in Italy.", DOCS[0]])
    capture_blocks(capturer, other, prefix, fingerprint=llm.fingerprint, states=cache)
    assert (cache.hits, cache.misses) == (2, 4)
    warm = capture_blocks(capturer, prompt, prefix, fingerprint=llm.fingerprint, states=cache)
    fresh = capture_blocks(capturer, prompt, prefix, fingerprint=llm.fingerprint, states=None)
    assert abs(warm.rows - fresh.rows).max() < 1e-5
    assert abs(cold.rows - fresh.rows).max() < 1e-5


def test_state_cache_budget_evicts_least_recent(llm, caplog):
    capturer = AttentionCapturer(llm.model, [(1, 0)])
    prompt = build_block_prompts(llm.tokenizer, QUERY, DOCS)
    prefix = capturer.prefill(prompt.prefix_ids)
    probe = StateCache(1 << 30)
    with caplog.at_level("WARNING", logger="attnrank.llm.states"):
        capture_blocks(capturer, prompt, prefix, fingerprint="f", states=probe)
    assert not [r for r in caplog.records if r.name.startswith("attnrank")]  # one query's blocks fit: nothing to say
    sizes = sorted(s.nbytes for s in probe._items.values())
    small = StateCache(sizes[-1] + sizes[-2])  # room for two of the three blocks
    with caplog.at_level("WARNING", logger="attnrank.llm.states"):
        capture_blocks(capturer, prompt, prefix, fingerprint="f", states=small)
        capture_blocks(capturer, prompt, prefix, fingerprint="f", states=small)
    assert len(small) == 2 and small.nbytes <= small.max_bytes
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "the 3 passages of one block-attention query" in warned[0]  # once per cache
    with pytest.raises(InputError, match="must be >= 0"):
        StateCache(-1)


def test_blocks_do_not_depend_on_neighbours(llm):
    a = build_block_prompts(llm.tokenizer, QUERY, DOCS)
    b = build_block_prompts(llm.tokenizer, "another query", [DOCS[2], DOCS[0]], order="forward")
    assert a.prefix_ids == b.prefix_ids
    assert a.blocks[0] == b.blocks[1] and a.blocks[2] == b.blocks[0]
    text = llm.tokenizer.decode(a.blocks[0][: a.text_lengths[0]])
    assert text == DOCS[0]
    assert llm.tokenizer.decode(a.blocks[0][a.text_lengths[0] :]) == "\n\n"
    # reverse order: rank 1 (input 0) is the last block, nearest the query
    assert a.order == [2, 1, 0]
    spans = a.doc_spans
    assert llm.tokenizer.decode(a.context_ids[spans[1][0] : spans[1][1]]) == DOCS[1]


def test_position_schemes():
    tok = tiny_tokenizer()
    p = build_block_prompts(tok, QUERY, DOCS, order="forward")
    n = len(p.prefix_ids)
    lengths = [len(b) for b in p.blocks]
    assert p.starts("shared") == [n, n, n]
    assert p.suffix_start("shared") == n + max(lengths)
    assert p.starts("sequential") == [n, n + lengths[0], n + lengths[0] + lengths[1]]
    assert p.suffix_start("sequential") == n + sum(lengths)
    with pytest.raises(InputError, match="block_positions"):
        p.starts("diagonal")


def _moved_block(model, head: tuple[int, int], shift: int):
    """A 5-token block encoded after a 3-token prefix at position 3 (``at``), at ``3 + shift``
    (``there``), and ``at`` rotated by ``shift`` (``moved``): (capturer, prefix, at, there, moved)."""
    from attnrank.llm.states import encode_blocks, rotate_keys

    capturer = AttentionCapturer(model, [head])
    prefix = capturer.prefill([5, 6, 7])
    block = [[10, 11, 12, 13, 14]]
    at = encode_blocks(capturer, prefix, block, [3])[0]
    there = encode_blocks(capturer, prefix, block, [3 + shift])[0]
    return capturer, prefix, at, there, rotate_keys(capturer, at, shift)


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "gemma"])
def test_rotated_keys_equal_keys_computed_there(family):
    """Rotating a block's cached first-layer keys by δ gives the keys computed δ positions on."""
    from attnrank.llm.states import check_rotation

    model = tiny_model(family, layers=2, heads=4, kv_heads=2, max_positions=4096)
    capturer, prefix, at, there, moved = _moved_block(model, (1, 0), 40)
    assert torch.allclose(moved.keys[0], there.keys[0], atol=1e-5)
    assert not torch.allclose(at.keys[0], there.keys[0], atol=1e-3)
    assert torch.equal(moved.values, at.values)
    check_rotation(capturer, prefix)  # passes: standard rotary


def test_nope_layers_keep_their_keys_when_a_block_moves():
    """SmolLM3 and Llama 4 skip the rotary embedding in some layers (``no_rope_layers``, 0 = none):
    those keys never see a position, so rotated positions must leave them as encoded; rotating
    them as well (what a first-layer probe could not see) moved them to no position at all."""
    from attnrank.llm.context import assemble
    from attnrank.llm.states import check_rotation

    model = tiny_model(
        "SmolLM3", layers=2, heads=4, kv_heads=2, max_positions=4096, no_rope_layers=[1, 0], pad_token_id=0
    )
    capturer, prefix, at, there, moved = _moved_block(model, (1, 0), 40)
    check_rotation(capturer, prefix)  # layer 0 has rotary embeddings: the probe passes
    assert torch.allclose(moved.keys[0], there.keys[0], atol=1e-5)
    assert torch.equal(moved.keys[1], at.keys[1])
    context = assemble(capturer, prefix, [at], shifts=[40])
    k1 = context.cache.layers[1].keys
    assert torch.equal(k1[0, :, 3:8], at.keys[1])


@pytest.mark.parametrize("no_rope", [[1, 1], [0, 1]])  # SmolLM3's 0: a NoPE layer (layer 0 here, then layer 1)
def test_a_scaled_rotary_embedding_is_refused_whichever_layer_has_it_first(no_rope):
    """YaRN scales cosines and sines, which rotating kept keys applies twice; the probe compared
    layer 0's keys only, so a model whose layer 0 is NoPE passed with YaRN in the layers after it."""
    from attnrank.llm.states import check_rotation

    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512, "rope_theta": 10000.0}
    model = tiny_model(
        "SmolLM3", layers=2, max_positions=2048, no_rope_layers=no_rope, pad_token_id=0, rope_parameters=rope
    )
    capturer = AttentionCapturer(model, [(1, 0)])
    prefix = capturer.prefill([5, 6, 7])
    with pytest.raises(InputError, match="does not compose as standard RoPE"):
        check_rotation(capturer, prefix)


def test_rotated_positions_on_a_model_without_positions_equal_sequential():
    """A model whose every layer is NoPE: no key has a position, so rotated positions are exactly
    sequential ones (they were refused: the first-layer probe saw its rotated keys differ)."""
    model = tiny_model(
        "SmolLM3", layers=2, heads=4, kv_heads=2, max_positions=4096, no_rope_layers=[0, 0], pad_token_id=0
    )
    capturer = AttentionCapturer(model, [(0, 1), (1, 2)])
    prompt = build_block_prompts(tiny_tokenizer(), QUERY, DOCS)
    prefix = capturer.prefill(prompt.prefix_ids)
    rows = {
        p: capture_blocks(capturer, prompt, prefix, fingerprint="t", positions=p).rows
        for p in ("rotated", "sequential")
    }
    assert abs(rows["rotated"] - rows["sequential"]).max() < 1e-6


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_rotation_equals_float32(dtype):
    """The half-precision path (one matmul with the rotation matrix) rotates as float32 does,
    to the half type's rounding."""
    from attnrank.llm.rotary import rotate_into

    torch.manual_seed(0)
    k = torch.randn(2, 3, 7, 16)
    angles = torch.rand(8) * 6
    cos, sin = torch.cat([angles.cos()] * 2), torch.cat([angles.sin()] * 2)
    exact = torch.empty_like(k)
    rotate_into(exact, k, cos, sin)
    half = torch.empty(2, 3, 9, 16, dtype=dtype)[:, :, 1:8]  # a strided view, as in the context buffer
    rotate_into(half, k.to(dtype), cos, sin)
    eps = torch.finfo(dtype).eps
    assert torch.allclose(half.float(), exact, rtol=4 * eps, atol=4 * eps)
    assert not torch.allclose(exact, k, atol=1e-2)


def test_rotated_equals_sequential_in_the_first_layer():
    """With heads of layer 0 only, rotated positions are exactly sequential positions."""
    model = tiny_model("llama", layers=2, heads=4, kv_heads=2, max_positions=4096)
    capturer = AttentionCapturer(model, [(0, 1), (0, 2)])
    prompt = build_block_prompts(tiny_tokenizer(), QUERY, DOCS)
    prefix = capturer.prefill(prompt.prefix_ids)
    rows = {
        p: capture_blocks(capturer, prompt, prefix, fingerprint="t", positions=p).rows
        for p in ("rotated", "sequential", "shared")
    }
    assert abs(rows["rotated"] - rows["sequential"]).max() < 1e-6
    assert abs(rows["rotated"] - rows["shared"]).max() > 1e-7


def test_suffix_passes_run_in_the_room_after_the_context(llm):
    """A context assembled with room: each suffix pass writes after it (no copy of the context) and
    sees exactly what a plainly concatenated cache gives, pass after pass; too long a suffix
    falls back to concatenation."""
    capturer = AttentionCapturer(llm.model, [(1, 0), (3, 2)])
    prompt = build_block_prompts(llm.tokenizer, QUERY, DOCS)
    prefix = capturer.prefill(prompt.prefix_ids)
    states = encode_blocks(capturer, prefix, prompt.blocks, prompt.starts("shared"))
    ordered, shifts = [states[i] for i in prompt.order], [0, 5, 9]
    roomy = assemble(capturer, prefix, ordered, shifts, room=160)
    plain = assemble(capturer, prefix, ordered, shifts)
    layer = roomy.cache.layers[0]
    assert isinstance(layer, ContextLayer) and not isinstance(plain.cache.layers[0], ContextLayer)
    context = layer.keys.clone()
    at = prompt.suffix_start("sequential")
    long = prompt.real_suffix_ids * 4  # longer than the room
    assert len(long) > 160 >= len(prompt.real_suffix_ids)
    for ids in (prompt.real_suffix_ids, prompt.calibration_suffix_ids, prompt.real_suffix_ids, long):
        got = capturer.capture(ids, prefix=roomy, position_start=at)
        want = capturer.capture(ids, prefix=plain, position_start=at)
        assert torch.equal(got, want)
    assert torch.equal(layer.keys, context) and layer.keys.data_ptr() == layer.buffer_keys.data_ptr()
    for k, v in zip(plain.cache.layers[: capturer.deepest_layer + 1], roomy.cache.layers, strict=True):
        assert torch.equal(k.keys, v.keys) and torch.equal(k.values, v.values)
    assert plain.length == roomy.length == len(prompt.context_ids)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_packed_blocks_equal_padded_batches(family):
    """Blocks packed into sequences under a block-diagonal mask get the states that padded
    batches give, whatever the pack size (one pack, several packs, never packed)."""
    model = tiny_model(family, layers=3, heads=4, kv_heads=2, max_positions=4096)
    assert not any(getattr(x, "is_sliding", False) for x in DynamicCache(config=model.config).layers)  # packs
    capturer = AttentionCapturer(model, [(2, 1)])
    prompt = build_block_prompts(tiny_tokenizer(), QUERY, DOCS)
    prefix = capturer.prefill(prompt.prefix_ids)
    starts = prompt.starts("sequential")  # distinct positions per block
    padded = encode_blocks(capturer, prefix, prompt.blocks, starts, pack_tokens=0)
    for pack in (10_000, len(prompt.blocks[0]) + 1):
        packed = encode_blocks(capturer, prefix, prompt.blocks, starts, pack_tokens=pack)
        for a, b in zip(padded, packed, strict=True):
            assert a.keys.shape == b.keys.shape
            assert torch.allclose(a.keys, b.keys, atol=1e-5) and torch.allclose(a.values, b.values, atol=1e-5)


@pytest.mark.parametrize("order", ["reverse", "forward"])
def test_selected_blocks_equal_a_prompt_built_of_them(order):
    tok = tiny_tokenizer()
    docs = [Document(f"d{i}", text * (3 if i == 1 else 1), f"T{i}") for i, text in enumerate(DOCS + ["Kiwis too."])]
    whole = build_block_prompts(tok, QUERY, docs, order=order, max_doc_words=6)
    picked = [3, 1]
    direct = build_block_prompts(tok, QUERY, [docs[i] for i in picked], order=order, max_doc_words=6)
    sub = whole.select(picked, order)
    assert sub.context_ids == direct.context_ids and sub.order == direct.order
    assert (sub.blocks, sub.text_lengths, sub.doc_ids) == (direct.blocks, direct.text_lengths, direct.doc_ids)
    assert sub.offsets == direct.offsets and sub.doc_spans == direct.doc_spans
    assert sub.truncated == direct.truncated and [t.doc_id for t in sub.truncated] == ["d1"]


class CountingTokenizer:
    """The tiny tokenizer, counting the texts it is asked to encode."""

    def __init__(self):
        self.inner, self.texts = tiny_tokenizer(), []

    def __call__(self, text, **kw):
        self.texts.append(text)
        return self.inner(text, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_memo_skips_tokenizing_known_passages_and_changes_nothing():
    tok = CountingTokenizer()
    memo = BlockMemo()
    first = build_block_prompts(tok, QUERY, DOCS, memo=memo, max_doc_words=4)
    plain = build_block_prompts(tok, QUERY, DOCS, max_doc_words=4)
    assert len(memo) == 3
    tok.texts.clear()
    again = build_block_prompts(tok, "Another question?", [DOCS[2], "New text.", DOCS[0]], memo=memo, max_doc_words=4)
    assert not any(d in t for t in tok.texts for d in (DOCS[0][:10], DOCS[2][:10]))  # only the new one
    assert any("New text." in t for t in tok.texts)
    assert first.blocks == plain.blocks and first.truncated == plain.truncated and first.offsets == plain.offsets
    assert again.blocks[0] == first.blocks[2] and again.blocks[2] == first.blocks[0]
    assert [(t.doc_index, t.doc_id) for t in again.truncated] == [(0, "0"), (2, "2")]  # cuts re-indexed and re-named
    # other truncation limits are other entries
    build_block_prompts(tok, QUERY, DOCS[:1], memo=memo, max_doc_words=None)
    assert len(memo) == 5


def test_memo_keeps_to_its_byte_budget():
    tok = tiny_tokenizer()
    probe = BlockMemo()
    build_block_prompts(tok, QUERY, DOCS, memo=probe)
    keys = [memo_key(Document(str(i), d), None, None) for i, d in enumerate(DOCS)]
    sizes = [probe.get(k).nbytes + ENTRY_OVERHEAD for k in keys]
    assert probe.nbytes == sum(sizes)
    memo = BlockMemo(max_bytes=sizes[1] + sizes[2])
    build_block_prompts(tok, QUERY, DOCS, memo=memo)
    assert len(memo) == 2 and memo.nbytes <= memo.max_bytes
    assert memo.get(keys[0]) is None and memo.get(keys[2]) is not None  # the least recently used went first


def test_memo_shared_by_threads_keeps_its_entries_and_count():
    """Rerankers' rank() runs in server and framework threads: a get racing a put's eviction raised
    KeyError, and a drifted count left the memo raising on every later put."""
    import sys
    import threading
    from types import SimpleNamespace

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: races show within the test
    try:
        memo = BlockMemo(max_bytes=320 + 4 * ENTRY_OVERHEAD)
        errors: list[BaseException] = []

        def work(seed: int) -> None:
            try:
                for i in range(20000):
                    key = ((i * 7 + seed) % 13,)
                    if memo.get(key) is None:
                        memo.put(key, SimpleNamespace(nbytes=40 + key[0]))
            except BaseException as e:  # any error of a thread fails the test
                errors.append(e)

        threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[:1]
    assert memo.nbytes == sum(e.nbytes + ENTRY_OVERHEAD for e in memo._entries.values()) <= memo.max_bytes


def test_the_memo_counts_what_its_entries_hold_in_memory():
    """Counted by their arrays alone, short passages' entries held about twice their count."""
    import tracemalloc

    import numpy as np

    from attnrank.rerank.likelihood import PromptIds

    docs = [Document(str(i), f"passage {i} " * 5) for i in range(2000)]
    tracemalloc.start()
    try:
        memo = BlockMemo(max_bytes=1 << 40)
        for d in docs:
            memo.put(memo_key(d, 300, None), PromptIds(np.arange(80, dtype=np.int32)))
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert 0.8 < memo.nbytes / held < 1.25, (memo.nbytes, held)


def test_a_passage_cut_twice_reports_both_cuts_with_or_without_the_memo():
    """A text cut to max_doc_words and then to max_doc_tokens has two cuts: the block prompt
    reports both, as the full prompt does, whether tokenized now or read from the memo."""
    from attnrank.llm.prompts import build_rerank_prompts

    tok = tiny_tokenizer()
    docs = [Document("long", "one two three four five six seven eight", "T"), Document("short", "Kiwis.")]
    kw = dict(max_doc_words=6, max_doc_tokens=10)
    full = build_rerank_prompts(tok, QUERY, docs, **kw).truncated
    assert [(t.doc_id, t.unit) for t in full] == [("long", "words"), ("long", "tokens")]
    memo = BlockMemo()
    assert build_block_prompts(tok, QUERY, docs, **kw).truncated == full
    assert build_block_prompts(tok, QUERY, docs, memo=memo, **kw).truncated == full
    assert build_block_prompts(tok, QUERY, docs, memo=memo, **kw).truncated == full  # from the memo
    assert build_block_prompts(tok, QUERY, docs, **kw).select([1, 0], "reverse").truncated == [
        replace(t, doc_index=1) for t in full
    ]
    both = [Document("a", "one two three four five six seven eight"), Document("b", "nine ten eleven twelve thirteen")]
    direct = build_block_prompts(tok, QUERY, both[::-1], max_doc_words=4).truncated
    assert build_block_prompts(tok, QUERY, both, max_doc_words=4).select([1, 0], "reverse").truncated == direct


def _reversed_tokenizer():
    """The tiny byte tokenizer with its byte ids reversed: the same texts, other ids."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers import models as tok_models
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(tok_models.BPE(vocab={c: len(alphabet) - 1 - i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_memo_serves_one_tokenizer():
    """A memo handed another tokenizer must not return the first one's ids for the same text."""
    ours, other = tiny_tokenizer(), _reversed_tokenizer()
    memo = BlockMemo()
    build_block_prompts(ours, QUERY, DOCS, memo=memo)
    theirs = build_block_prompts(other, QUERY, DOCS, memo=memo)
    plain = build_block_prompts(other, QUERY, DOCS)
    assert plain.blocks != build_block_prompts(ours, QUERY, DOCS).blocks
    assert theirs.blocks == plain.blocks and theirs.offsets == plain.offsets
    keys = [memo_key(Document(str(i), d), None, None) for i, d in enumerate(DOCS)]
    assert len(memo) == 3 and memo.nbytes == sum(memo.get(k).nbytes + ENTRY_OVERHEAD for k in keys)


def test_exaone4_full_attention_layers_keep_their_keys_when_a_block_moves():
    """EXAONE 4 applies no rotary embedding in its full-attention layers when it has sliding ones;
    rotated positions rotated their keys too, moving them to a position they never had."""

    model = tiny_model(
        "Exaone4",
        layers=3,
        heads=4,
        kv_heads=2,
        max_positions=4096,
        sliding_window=64,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        pad_token_id=0,
    )
    _, _, at, there, moved = _moved_block(model, (2, 0), 20)
    torch.testing.assert_close(moved.keys[0], there.keys[0], atol=1e-5, rtol=0)  # a rotary layer: rotated
    assert torch.equal(moved.keys[2], at.keys[2])  # the full-attention layer: as encoded (it was rotated)


def test_a_passage_with_no_text_is_refused_by_both_prompt_builders():
    """Through windows() (and the block builder, used by detection and the state store) an empty
    passage was scored by its bare slot label (full attention) or blamed on the tokenizer (block)."""
    from attnrank.errors import InputError
    from attnrank.llm.prompts import build_rerank_prompts

    for build in (build_block_prompts, build_rerank_prompts):
        with pytest.raises(InputError, match=r"document #1 \('1'\) has no text"):
            build(tiny_tokenizer(), QUERY, ["alpha beta", "   "])


def test_sentence_spans_are_not_taken_for_slot_labelled_document_spans():
    """capture_window marked the pruner's sentence spans as beginning with a slot label "[i]",
    which a reader of the flag drops as the label's tokens."""
    from attnrank.llm.capture import capture_window
    from attnrank.llm.prompts import build_rerank_prompts

    capturer = AttentionCapturer(tiny_model("llama", layers=2, max_positions=4096), [(1, 0)])
    pair = build_rerank_prompts(tiny_tokenizer(), QUERY, DOCS)
    assert capture_window(capturer, pair).labelled
    s, e = pair.real.doc_spans[0]
    assert not capture_window(capturer, pair, doc_index=[0], spans=[(s + 4, e)]).labelled
