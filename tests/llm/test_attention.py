"""Selective attention capture vs. the eager ``output_attentions=True`` reference, on tiny random models."""

from __future__ import annotations

import pytest
import torch
from _tiny import tiny_latent_attention_model, tiny_model
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from attnrank.errors import InputError, ModelError
from attnrank.llm.attention import (
    ATTN_IMPLEMENTATION,
    AttentionCapturer,
    NonFiniteAttentionError,
    _common_start,
    naive_attention_rows,
)
from attnrank.llm.recording import PackedSegments

torch.set_num_threads(2)
ATOL = 1e-5
SUBSET = [(2, 7), (1, 3), (2, 0)]  # unsorted on purpose; heads 3, 0, 7 read KV heads 0, 0, 1


def _tiny(model_cls, config_cls, attn: str = "sdpa", **extra):
    config = config_cls(
        vocab_size=101,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=256,
        attn_implementation=attn,
        **extra,
    )
    torch.manual_seed(0)
    return model_cls(config).float().eval()


@pytest.fixture(scope="module")
def llama():
    return _tiny(LlamaForCausalLM, LlamaConfig)


@pytest.fixture(scope="module")
def llama_eager(llama):
    """The same weights with eager attention: the reference with output_attentions=True."""
    ref = _tiny(LlamaForCausalLM, LlamaConfig, attn="eager")
    ref.load_state_dict(llama.state_dict())
    return ref


def _ids(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 101, (1, n), generator=torch.Generator().manual_seed(seed))


def _reference(eager_model, ids: torch.Tensor, query_start: int, heads) -> torch.Tensor:
    with torch.no_grad():
        attentions = eager_model(input_ids=ids, output_attentions=True).attentions
    return torch.stack([attentions[layer][0, head, query_start:].mean(0) for layer, head in heads])


def _all_heads(n_layers: int = 4, n_heads: int = 8):
    return [(layer, head) for layer in range(n_layers) for head in range(n_heads)]


def test_all_heads_single_pass(llama, llama_eager):
    ids = _ids(40)
    capturer = AttentionCapturer(llama)
    assert capturer.heads == _all_heads() and capturer.deepest_layer == 3
    rows = capturer.capture(ids, query_start=25)
    assert rows.shape == (32, 40) and rows.dtype == torch.float32
    expected = _reference(llama_eager, ids, 25, _all_heads())
    torch.testing.assert_close(rows, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(rows.sum(-1), torch.ones(32), atol=ATOL, rtol=0)
    torch.testing.assert_close(naive_attention_rows(llama, ids, 25), expected, atol=ATOL, rtol=0)


def test_subset_with_gqa_stops_early(llama, llama_eager):
    ids = _ids(30)
    capturer = AttentionCapturer(llama, heads=SUBSET)
    assert capturer.heads == sorted(SUBSET) and capturer.deepest_layer == 2
    fired: list[str] = []
    watched = {
        "layer 3": llama.model.layers[3],
        "norm": llama.model.norm,
        # The deepest layer stops inside its attention: its output projection and MLP never run.
        "o_proj 2": llama.model.layers[2].self_attn.o_proj,
        "mlp 2": llama.model.layers[2].mlp,
    }
    handles = [m.register_forward_hook(lambda *_, name=name: fired.append(name)) for name, m in watched.items()]
    shallower = llama.model.layers[1].mlp.register_forward_hook(lambda *_: fired.append("mlp 1"))
    try:
        rows = capturer.capture(ids, query_start=10)
        prefix = capturer.prefill(ids[:, :12])
    finally:
        for handle in [*handles, shallower]:
            handle.remove()
    assert fired == ["mlp 1", "mlp 1"]
    torch.testing.assert_close(rows, _reference(llama_eager, ids, 10, sorted(SUBSET)), atol=ATOL, rtol=0)
    filled = [layer.is_initialized and layer.get_seq_length() == 12 for layer in prefix.cache.layers]
    assert filled == [True, True, True, False]


def test_prefix_reuse_two_suffixes(llama, llama_eager):
    prefix_ids, suffix_a, suffix_b = _ids(20, seed=2), _ids(9, seed=3), _ids(5, seed=4)
    for heads in (None, SUBSET):
        capturer = AttentionCapturer(llama, heads=heads)
        prefix = capturer.prefill(prefix_ids)
        for suffix in (suffix_a, suffix_b, suffix_a):  # A again: the prefix cache was not polluted by B
            rows = capturer.capture(suffix, prefix=prefix, query_start=1)
            full = torch.cat([prefix_ids, suffix], dim=1)
            assert rows.shape == (len(capturer.heads), full.shape[1])
            expected = _reference(llama_eager, full, 20 + 1, capturer.heads)
            torch.testing.assert_close(rows, expected, atol=ATOL, rtol=0)
        assert prefix.cache.get_seq_length() == 20


FAMILIES = [
    (LlamaForCausalLM, LlamaConfig, "sdpa", {}),
    (Qwen2ForCausalLM, Qwen2Config, "sdpa", {}),
    # Gemma 2: soft-capping and sliding-window layers (window 16 < the 20-token prefix).
    (Gemma2ForCausalLM, Gemma2Config, "eager", {"head_dim": 8, "sliding_window": 16, "query_pre_attn_scalar": 12}),
]


@pytest.mark.parametrize(("model_cls", "config_cls", "attn", "extra"), FAMILIES)
def test_suffixes_in_one_pass_equal_one_pass_each(model_cls, config_cls, attn, extra):
    model = _tiny(model_cls, config_cls, attn=attn, **extra)
    eager = _tiny(model_cls, config_cls, attn="eager", **extra)
    eager.load_state_dict(model.state_dict())
    prefix_ids, suffixes, starts = _ids(20, seed=2), [_ids(9, seed=3), _ids(5, seed=4)], [2, 4]
    capturer = AttentionCapturer(model, heads=SUBSET)
    prefix = capturer.prefill(prefix_ids)
    rows = capturer.capture_suffixes([s[0].tolist() for s in suffixes], starts, prefix=prefix)
    assert rows.shape == (2, len(SUBSET), 20)
    for i, (suffix, start) in enumerate(zip(suffixes, starts)):  # neither suffix saw the other
        expected = _reference(eager, torch.cat([prefix_ids, suffix], dim=1), 20 + start, capturer.heads)[:, :20]
        torch.testing.assert_close(rows[i], expected, atol=ATOL, rtol=0)
    moved = capturer.capture_suffixes([s[0].tolist() for s in suffixes], starts, prefix=prefix, position_start=33)
    for i, (suffix, start) in enumerate(zip(suffixes, starts)):  # block attention's later positions
        one = capturer.capture(suffix, prefix=prefix, query_start=start, position_start=33)[:, :20]
        torch.testing.assert_close(moved[i], one, atol=ATOL, rtol=0)
    assert not torch.allclose(moved, rows, atol=1e-3)  # the positions did matter
    assert prefix.cache.get_seq_length() == 20
    with pytest.raises(InputError, match="query_start=5"):
        capturer.capture_suffixes([[1, 2, 3, 4, 5]], [5], prefix=prefix)


@pytest.mark.parametrize(("model_cls", "config_cls", "attn", "extra"), FAMILIES)
def test_suffixes_sharing_their_beginning_equal_one_pass_each(model_cls, config_cls, attn, extra):
    """ICR's real and "N/A" suffixes begin with the same late instruction: its rows run once."""
    model = _tiny(model_cls, config_cls, attn=attn, **extra)
    eager = _tiny(model_cls, config_cls, attn="eager", **extra)
    eager.load_state_dict(model.state_dict())
    prefix_ids, common = _ids(20, seed=2), _ids(6, seed=7)[0].tolist()
    own = [_ids(n, seed=8 + n)[0].tolist() for n in (5, 3, 4)]
    suffixes = [common + o for o in own]
    starts = [0, 7, 6]  # inside the shared beginning, past it, right at its end
    capturer = AttentionCapturer(model, heads=SUBSET)
    prefix = capturer.prefill(prefix_ids)
    rows = capturer.capture_suffixes(suffixes, starts, prefix=prefix, position_start=25)
    for i, (suffix, start) in enumerate(zip(suffixes, starts)):
        one = capturer.capture(suffix, prefix=prefix, query_start=start, position_start=25)[:, :20]
        torch.testing.assert_close(rows[i], one, atol=ATOL, rtol=0)
    rows = capturer.capture_suffixes(suffixes, starts, prefix=prefix)
    for i, (suffix, start) in enumerate(zip(suffixes, starts)):
        full = torch.cat([prefix_ids, torch.tensor([suffix])], dim=1)
        expected = _reference(eager, full, 20 + start, capturer.heads)[:, :20]
        torch.testing.assert_close(rows[i], expected, atol=ATOL, rtol=0)
    same = capturer.capture_suffixes([common, common], [0, 0], prefix=prefix)  # each keeps a token of its own
    torch.testing.assert_close(same[0], same[1], atol=ATOL, rtol=0)


def test_common_start_leaves_each_suffix_a_token():
    assert _common_start([[1, 2, 3], [1, 2, 4, 5]]) == 2
    assert _common_start([[1, 2], [1, 2, 3]]) == 1
    assert _common_start([[9], [1, 2]]) == 0
    assert _common_start([[1, 2, 3], [1, 2, 3]]) == 2


def test_shallower_capturer_reuses_deeper_prefix(llama, llama_eager):
    prefix = AttentionCapturer(llama, heads=[(0, 0)], max_layer=3).prefill(_ids(12, seed=5))
    shallow = AttentionCapturer(llama, heads=[(1, 1)])
    rows = shallow.capture(_ids(4, seed=6), prefix=prefix)
    full = torch.cat([_ids(12, seed=5), _ids(4, seed=6)], dim=1)
    torch.testing.assert_close(rows, _reference(llama_eager, full, 12, [(1, 1)]), atol=ATOL, rtol=0)
    deep = AttentionCapturer(llama, heads=[(3, 1)])
    with pytest.raises(InputError, match="layers 0..2"):
        deep.capture(_ids(4), prefix=AttentionCapturer(llama, heads=[(2, 0)]).prefill(_ids(6)))


def test_no_leak_after_capture(llama):
    ids = _ids(25)
    with torch.no_grad():
        before = llama(input_ids=ids).logits
    AttentionCapturer(llama, heads=SUBSET).capture(ids, query_start=5)
    AttentionCapturer(llama).prefill(ids)
    assert llama.config._attn_implementation == "sdpa"
    with torch.no_grad():
        after = llama(input_ids=ids).logits
        # Left switched on by mistake, the registered function is still plain SDPA outside a capture.
        llama.config._attn_implementation_internal = ATTN_IMPLEMENTATION
        try:
            switched = llama(input_ids=ids).logits
        finally:
            llama.config._attn_implementation_internal = "sdpa"
    assert torch.equal(before, after)
    torch.testing.assert_close(switched, before, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    ("heads", "max_layer", "fragment"),
    [
        ([(4, 0)], None, "head pairs 4-0 are out of range"),
        ([(0, 8), (1, 1)], None, "head pairs 0-8 are out of range"),
        ([(-1, 0)], None, "head pairs -1-0 are out of range"),
        ([(2, 0)], 1, r"head pairs 2-0 are out of range: .*\(max_layer=1\)"),
        ([], None, "empty"),
        (None, 4, "max_layer=4"),
    ],
)
def test_bad_heads_raise(llama, heads, max_layer, fragment):
    with pytest.raises(InputError, match=fragment) as err:
        AttentionCapturer(llama, heads=heads, max_layer=max_layer)
    assert isinstance(err.value, ValueError)
    if heads:
        assert "4 layers and 8 heads" in str(err.value)


def test_bad_inputs_raise(llama):
    capturer = AttentionCapturer(llama, heads=[(0, 0)])
    with pytest.raises(InputError, match="query_start=10"):
        capturer.capture(_ids(10), query_start=10)
    with pytest.raises(InputError, match="one non-empty sequence"):
        capturer.capture(torch.zeros(2, 5, dtype=torch.long))


def test_non_finite_raises(llama):
    broken = _tiny(LlamaForCausalLM, LlamaConfig)
    broken.load_state_dict(llama.state_dict())
    with torch.no_grad():
        broken.model.layers[1].self_attn.q_proj.weight[3 * 8] = float("nan")  # head 3 of layer 1
    with pytest.raises(NonFiniteAttentionError, match="layer 1, head 3"):
        AttentionCapturer(broken, heads=[(0, 0), (1, 3)]).capture(_ids(10))
    # The argmax reduction too: a NaN row's "top-1 key" would be the NaN's index, silently.
    with pytest.raises(NonFiniteAttentionError, match="layer 1, head 3"):
        AttentionCapturer(broken, heads=[(0, 0), (1, 3)]).capture(_ids(10), reduce="argmax")


def test_heads_of_a_layer_without_attention_are_a_model_error():
    """A hybrid model (LFM2: convolution layers between attention layers) passes the load checks;
    heads of its convolution layers cannot be captured: one ModelError line, not a RuntimeError."""
    model = tiny_model("Lfm2", layer_types=["conv", "full_attention"])
    assert AttentionCapturer(model, heads=[(1, 2)]).capture(_ids(8)).shape == (1, 8)  # its attention layer
    with pytest.raises(ModelError, match="layer 0 of Lfm2Model computed no attention"):
        AttentionCapturer(model, heads=[(0, 1), (1, 2)]).capture(_ids(8))


@pytest.mark.parametrize(
    ("model_cls", "config_cls", "attn", "extra"),
    [
        (Qwen2ForCausalLM, Qwen2Config, "sdpa", {}),
        # Gemma 2 (eager only): logit soft-capping, custom query scaling, sliding-window layers.
        (Gemma2ForCausalLM, Gemma2Config, "eager", {"head_dim": 8, "sliding_window": 16, "query_pre_attn_scalar": 12}),
    ],
)
def test_other_families(model_cls, config_cls, attn, extra):
    model = _tiny(model_cls, config_cls, attn=attn, **extra)
    eager = _tiny(model_cls, config_cls, attn="eager", **extra)
    eager.load_state_dict(model.state_dict())
    heads = [(0, 5), (1, 1), (3, 6)]
    ids = _ids(32, seed=7)
    capturer = AttentionCapturer(model, heads=heads)
    torch.testing.assert_close(
        capturer.capture(ids, query_start=20), _reference(eager, ids, 20, heads), atol=ATOL, rtol=0
    )
    prefix = capturer.prefill(ids[:, :24])
    torch.testing.assert_close(
        capturer.capture(ids[:, 24:], prefix=prefix, query_start=0),
        _reference(eager, ids, 24, heads),
        atol=ATOL,
        rtol=0,
    )


def test_packed_segments_leave_layers_they_cannot_compute_to_the_mask():
    """Per-segment SDPA serves a plain layer whose keys are the prefix and the segments; a
    soft-capped layer (Gemma 2), attention sinks, or keys of another length (a sliding window's)
    fall back to the pass's mask."""
    segments = PackedSegments(n_prefix=5, lengths=[3, 4])
    key = torch.zeros(1, 2, 12, 8)
    assert segments.serves(key, None, {"dropout": 0.0})
    assert not segments.serves(key, 30.0, {})
    assert not segments.serves(key, None, {"s_aux": torch.zeros(2)})
    assert not segments.serves(key[:, :, 1:], None, {})


def test_a_hybrid_models_suffixes_do_not_see_each_other_and_its_prefix_stays_as_it_was():
    """LFM2's convolution layers run over the packed suffixes in order, so the second suffix (ICR's
    calibration query) read the first's tokens; and its convolution state, shared by a forked
    prefix, was updated in place, so a second capture over the same prefix read the first's."""
    model = tiny_model("Lfm2", layer_types=["conv", "full_attention"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "conv" in name:
                p.mul_(20)  # a convolution that matters
    cap = AttentionCapturer(model, heads=[(1, 0), (1, 3)])
    prefix_ids, s1, s2 = _ids(12, seed=1)[0].tolist(), _ids(6, seed=2)[0].tolist(), _ids(5, seed=3)[0].tolist()
    prefix = cap.prefill(prefix_ids)
    direct = [cap.capture(prefix_ids + s, query_start=12)[:, :12] for s in (s1, s2)]
    packed = cap.capture_suffixes([s1, s2], [0, 0], prefix=prefix)
    for i in range(2):
        torch.testing.assert_close(packed[i], direct[i], atol=1e-6, rtol=0)
    cap.capture(s1, prefix=prefix)
    torch.testing.assert_close(cap.capture(s2, prefix=prefix)[:, :12], direct[1], atol=1e-6, rtol=0)


def test_suffixes_over_a_prefix_of_a_model_whose_values_are_narrower_than_its_keys():
    """DeepSeek's latent attention: the packed suffix kernels sized their output by the query's
    head size and failed with a RuntimeError on every reranking over a prefix."""
    model = tiny_latent_attention_model()
    cap = AttentionCapturer(model, heads=[(1, 0), (1, 3)])
    prefix_ids, s1, s2 = _ids(12, seed=1)[0].tolist(), _ids(6, seed=2)[0].tolist(), _ids(5, seed=3)[0].tolist()
    packed = cap.capture_suffixes([s1, s2], [0, 0], prefix=cap.prefill(prefix_ids))
    for i, s in enumerate((s1, s2)):
        torch.testing.assert_close(packed[i], cap.capture(prefix_ids + s, query_start=12)[:, :12], atol=1e-6, rtol=0)


def test_a_model_with_attention_sinks_is_refused_not_read_wrong():
    """GPT-OSS adds a learned sink logit to each head's softmax: the rows summed to 1 where the
    model's own summed to 0.63, and every layer's output was computed without the sinks."""
    model = tiny_model("GptOss", num_local_experts=4, num_experts_per_tok=2, sliding_window=64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.fill_(3.0)
    with pytest.raises(ModelError, match="GptOssAttention has attention sinks"):
        AttentionCapturer(model, heads=[(1, 0)]).capture(_ids(10))


@pytest.mark.parametrize(
    "kwarg, fragment", [("sinks", "has attention sinks"), ("s_aux", "has attention sinks"), ("indices", "top-k")]
)
def test_attention_that_sdpa_would_compute_otherwise_is_refused_outside_a_capture_too(kwarg, fragment):
    """Only s_aux was refused: a model passing its sinks as sinks= (Inkling 2), or its sparse
    top-k keys as indices= (DeepSeek-V3.2), had its likelihood computed by dense SDPA without them."""
    from attnrank.llm.recording import capture_attention

    module = tiny_model().model.layers[0].self_attn
    q = k = v = torch.zeros(1, 4, 3, 8)
    assert capture_attention(module, q, k[:, :2], v[:, :2], None)[0].shape == (1, 3, 4, 8)
    with pytest.raises(ModelError, match=fragment):
        capture_attention(module, q, k[:, :2], v[:, :2], None, **{kwarg: torch.zeros(4)})


def test_a_model_with_a_relative_position_bias_is_refused_not_read_wrong():
    """Inkling passes a relative position bias to its attention function: SDPA ignored it and the
    captured rows never added it (off by 2.7e-4 at layer 0 on a tiny model, argmax moved with a
    larger bias)."""
    model = tiny_model("InklingText")
    with pytest.raises(ModelError, match="adds a relative position bias to its attention scores"):
        AttentionCapturer(model, heads=[(0, 0)]).capture(_ids(10))
    # a pass that records no rows is the model's own (transformers' SDPA adds the bias): its query
    # likelihood scores as a plain forward does
    from _tiny import tiny_tokenizer

    from attnrank.llm.likelihood import continuation_logprob
    from attnrank.llm.models import LLM

    llm = LLM(model, tiny_tokenizer(), "tiny-inkling", "i" * 64)
    ids = _ids(12)[0].tolist()
    got = continuation_logprob(llm, [ids[:8]], ids[8:])[0]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)
    want = torch.tensor([logits[7 + i, t].item() for i, t in enumerate(ids[8:])])
    torch.testing.assert_close(torch.from_numpy(got), want, atol=1e-5, rtol=0)


def test_a_model_with_its_layers_under_another_name_is_named_so():
    """GPT-2 was told to "pass a decoder-only causal LM", which it is: its layers are `h`, not `layers`."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=16, n_positions=16))
    with pytest.raises(InputError, match="keeps its decoder layers elsewhere than in a `layers` list"):
        AttentionCapturer(model)


def test_a_model_attention_cannot_read_is_refused_before_its_weights_load(tmp_path, monkeypatch):
    """GPT-2 (layers under `h`) passed every check made before the load, loaded whole, and was refused
    at the first query; its config alone, built on the meta device, says so now. The likelihood
    preset, which captures no attention, still takes it."""
    from _tiny import tiny_tokenizer
    from transformers import GPT2Config, GPT2LMHeadModel

    from attnrank.llm import models
    from attnrank.prune.config import PruneConfig
    from attnrank.prune.lookups import check_pruner_before_load
    from attnrank.rerank.attention import AttentionReranker

    folder = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=259, n_positions=64)).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    loads: list[object] = []
    monkeypatch.setattr(models, "_load_cached", lambda *a: loads.append(a))
    with pytest.raises(InputError, match="keeps its decoder layers elsewhere than in a `layers` list"):
        AttentionReranker(str(folder), config="icr")
    with pytest.raises(InputError, match="keeps its decoder layers elsewhere than in a `layers` list"):
        check_pruner_before_load(PruneConfig(model=str(folder)))
    assert loads == []
    from attnrank.rerank.config import RerankConfig
    from attnrank.rerank.resolve import check_before_load

    check_before_load(RerankConfig.preset("likelihood", model=str(folder)), None)  # (no attention read)


def test_llama4_text_whose_get_decoder_returns_the_causal_lm_is_captured():
    """Llama4ForCausalLM.get_decoder() gives the model itself (its base_model_prefix names another
    attribute): every attention path refused it as keeping its layers "elsewhere than in a layers
    list", though they are in model.model.layers. Rows past its 64-token attention chunk included."""
    model = tiny_model(
        "Llama4Text", intermediate_size_mlp=64, num_local_experts=2, num_experts_per_tok=1,
        no_rope_layers=[1, 0], attention_chunk_size=64, max_positions=512,
    )  # fmt: skip
    ids = _ids(150, seed=1)
    torch.testing.assert_close(
        AttentionCapturer(model).capture(ids, query_start=130), naive_attention_rows(model, ids, 130), atol=ATOL, rtol=0
    )
