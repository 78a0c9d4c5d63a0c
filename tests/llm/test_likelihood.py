"""continuation_logprob: batched, left-padded log-likelihoods equal each sequence scored alone,
with or without reused context states."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tiny import tiny_longrope_model, tiny_model, tiny_tokenizer

from attnrank.errors import InputError
from attnrank.llm import layouts, recording
from attnrank.llm.context import ContextBuffer
from attnrank.llm.likelihood import continuation_logprob, reuses_states
from attnrank.llm.models import LLM
from attnrank.llm.states import StateCache

GROUPED = recording.grouped_forward
CONTEXTS = ["Passage: the cat sat on the mat.\nQuestion:", "Passage: x\nQuestion:", "A longer passage " * 6]
QUERY = " where did the cat sit?"


def _reference_tokens(llm: LLM, context: list[int], cont: list[int]) -> list[float]:
    """The log-probability of each token of ``cont`` after ``context``, one unpadded sequence, every logit."""
    ids = torch.tensor([context + cont])
    with torch.inference_mode():
        logp = torch.log_softmax(llm.model(input_ids=ids).logits[0].float(), -1)
    n = len(context)
    return [logp[n + i - 1, t].item() for i, t in enumerate(cont)]


def _scores(*args, **kwargs) -> np.ndarray:
    """Each context's mean log-probability per token (a row's mean of continuation_logprob)."""
    return continuation_logprob(*args, **kwargs).mean(1, dtype=np.float64)


def _reference(llm: LLM, context: list[int], cont: list[int]) -> float:
    """The mean log-probability of ``cont`` after ``context``."""
    return float(np.mean(_reference_tokens(llm, context, cont)))


# Phi-3's config defaults its special token ids to ones past the tiny vocabulary
FAMILIES = {"llama": {}, "qwen2": {}, "mistral": {}, "gemma": {}, "Phi3": {"pad_token_id": 0, "eos_token_id": 1}}


@pytest.mark.parametrize("family", [*FAMILIES, "Gemma3Text"])
def test_batched_scores_equal_each_sequence_scored_alone(family):
    tok = tiny_tokenizer()
    model = tiny_model(family, layers=2, max_positions=512, **FAMILIES.get(family, {}))
    llm = LLM(model=model, tokenizer=tok, model_id=f"tiny-{family}", fingerprint="t")
    contexts = [tok(c, add_special_tokens=False)["input_ids"] for c in CONTEXTS]
    cont = tok(QUERY, add_special_tokens=False)["input_ids"]
    want = [_reference(llm, c, cont) for c in contexts]
    got = _scores(llm, contexts, cont)  # one left-padded batch
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    one_each = _scores(llm, contexts, cont, batch_tokens=1)  # every sequence alone
    np.testing.assert_allclose(one_each, want, rtol=0, atol=1e-5)
    assert len(set(np.round(got, 6))) == len(got)  # the contexts do change the score


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_token_logprobs_are_each_tokens_and_average_to_the_score(family):
    tok = tiny_tokenizer()
    llm = LLM(model=tiny_model(family, layers=2, max_positions=512), tokenizer=tok, model_id=family, fingerprint="t")
    contexts = [tok(c, add_special_tokens=False)["input_ids"] for c in CONTEXTS]
    cont = tok(QUERY, add_special_tokens=False)["input_ids"]
    states = StateCache(64 << 20)
    for reuse in (None, states, states):  # computed in full; kept; served from the kept states
        got = continuation_logprob(llm, contexts, cont, states=reuse)
        assert got.shape == (len(contexts), len(cont)) and got.dtype == np.float32
        np.testing.assert_allclose(got, [_reference_tokens(llm, c, cont) for c in contexts], rtol=0, atol=1e-5)
        np.testing.assert_allclose(got.mean(1), _scores(llm, contexts, cont), rtol=0, atol=1e-6)
    assert len(states) == len(contexts)


def test_bad_inputs_are_refused_naming_the_limit(llm):
    with pytest.raises(InputError, match="continuation is empty"):
        _scores(llm, [[1, 2]], [])
    with pytest.raises(InputError, match="context #1 is empty"):
        _scores(llm, [[1, 2], []], [3])
    with pytest.raises(InputError, match="over the 16384-token context"):
        _scores(llm, [[1] * 16384], [3])
    with pytest.raises(InputError, match="batch_tokens=0"):
        _scores(llm, [[1]], [3], batch_tokens=0)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma", "Phi3"])
@pytest.mark.parametrize("call_products", [layouts.GROUP_CALL_PRODUCTS, 0])  # 0: rows of each length apart
def test_reused_context_states_give_the_scores_computed_in_full(family, call_products, monkeypatch):
    """A context scored once keeps its states; later calls (another continuation, another order,
    a new context beside it) run only the suffix over them, a layer's states copied as the pass
    reaches it and rows attending by groups over the keys past their padding, and match full
    scoring to 1e-5."""
    monkeypatch.setattr(layouts, "GROUP_CALL_PRODUCTS", call_products)
    grouped = []
    monkeypatch.setattr(recording, "grouped_forward", lambda *a: grouped.append(a[6]) or GROUPED(*a))
    tok = tiny_tokenizer()
    model = tiny_model(family, layers=2, max_positions=512, **FAMILIES.get(family, {}))
    llm = LLM(model=model, tokenizer=tok, model_id=f"tiny-{family}", fingerprint="t")
    contexts = [tok(c, add_special_tokens=False)["input_ids"] for c in CONTEXTS]
    cont = tok(QUERY, add_special_tokens=False)["input_ids"]
    other = tok(" what is on the mat?", add_special_tokens=False)["input_ids"]
    states, buffer = StateCache(1 << 30), ContextBuffer()
    assert reuses_states(llm)
    cold = _scores(llm, contexts[:2], cont, states=states, buffer=buffer)
    assert len(states) == 2 and states.hits == 0
    np.testing.assert_allclose(cold, _scores(llm, contexts[:2], cont), rtol=0, atol=1e-5)
    warm = _scores(llm, contexts[::-1], other, states=states, buffer=buffer)
    assert states.hits == 2 and len(states) == 3  # the two seen contexts reused, the new one kept
    np.testing.assert_allclose(warm, _scores(llm, contexts[::-1], other), rtol=0, atol=1e-5)
    np.testing.assert_allclose(warm[:1], _scores(llm, contexts[2:], other), rtol=0, atol=1e-5)
    assert len(grouped) == 2  # the warm pass's two layers
    assert len(grouped[0]) == (1 if call_products else 2)  # two lengths: apart only where a call is free


@pytest.mark.parametrize("n_cont", [1, 2, 5])
def test_a_kept_context_runs_only_the_continuation_but_its_last_token(llm, n_cont):
    """The context's last token is not run again: its logits, which predict the continuation's
    first token, are kept with its states (a one-token continuation then runs no pass at all)."""
    contexts = [[5, 6, 7, 8], [9, 10, 11]]
    cont = list(range(20, 20 + n_cont))
    states = StateCache(1 << 30)
    full = _scores(llm, contexts, cont)
    _scores(llm, contexts, cont, states=states)
    widths = []
    hook = llm.model.register_forward_pre_hook(
        lambda _m, _a, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        warm = _scores(llm, contexts, cont, states=states)
    finally:
        hook.remove()
    assert states.hits == 2
    assert widths == ([n_cont - 1] if n_cont > 1 else [])
    np.testing.assert_allclose(warm, full, rtol=0, atol=1e-5)


def test_padding_before_shorter_reused_contexts_is_never_read_even_where_the_memory_held_nan(llm):
    """The kept memory is uninitialised between calls: padding in front of a shorter context left
    as found (here NaN) would reach its rows through the softmax."""
    tok = llm.tokenizer
    contexts = [tok(c, add_special_tokens=False)["input_ids"] for c in CONTEXTS]  # three lengths
    cont = tok(QUERY, add_special_tokens=False)["input_ids"]
    states, buffer = StateCache(1 << 30), ContextBuffer()
    fresh = _scores(llm, contexts, cont, states=states)
    like = next(iter(states._items.values())).keys
    with buffer.take((1 << 20,), like) as (keys, values):  # more than the call needs: it is reused
        keys.fill_(float("nan"))
        values.fill_(float("nan"))
    poisoned = buffer._memory[0].data_ptr()
    warm = _scores(llm, contexts, cont, states=states, buffer=buffer)
    assert states.hits == 3 and buffer._memory[0].data_ptr() == poisoned
    assert np.isfinite(warm).all()
    np.testing.assert_allclose(warm, fresh, rtol=0, atol=1e-5)


def test_context_states_are_keyed_by_the_weights_and_the_tokens(llm):
    """Another model's weights (fingerprint, precision) or another context never reuse a state."""
    states = StateCache(1 << 30)
    _scores(llm, [[5, 6, 7]], [8, 9], states=states)
    other = LLM(model=llm.model, tokenizer=llm.tokenizer, model_id=llm.model_id, fingerprint="0" * 64)
    _scores(other, [[5, 6, 7]], [8, 9], states=states)
    _scores(llm, [[5, 4, 7]], [8, 9], states=states)
    assert states.hits == 0 and len(states) == 3
    _scores(llm, [[5, 6, 4]], [8, 9], states=states)  # only the last token differs: another context
    assert states.hits == 0 and len(states) == 4
    _scores(llm, [[5, 6, 7]], [3], states=states)  # the same context, another continuation
    assert states.hits == 1
    empty = StateCache(0)  # a budget of 0 keeps nothing
    _scores(llm, [[5, 6, 7]], [3], states=empty)
    assert len(empty) == 0 and empty.misses == 0


def test_a_budget_too_small_for_one_calls_states_is_named_once(llm, caplog):
    """States of one call that overflow the budget evict each other (a repeat reuses almost
    none): the user is told once, with the budget that would hold them."""
    contexts = [list(range(3, 3 + n)) for n in (20, 24, 28, 32)]
    roomy = StateCache(1 << 30)
    _scores(llm, contexts, [8, 9], states=roomy)
    held = roomy.nbytes
    small = StateCache(held // 2)  # room for one or two of the four
    with caplog.at_level("WARNING", logger="attnrank.llm.states"):
        _scores(llm, contexts, [8, 9], states=small)
        _scores(llm, contexts, [8, 9], states=small)
    warned = [r.getMessage() for r in caplog.records if "state cache" in r.getMessage()]
    assert len(warned) == 1 and "the 4 prompts" in warned[0]
    assert small.hits < 4  # the second call found few of them
    caplog.clear()
    with caplog.at_level("WARNING", logger="attnrank.llm.states"):
        _scores(llm, contexts, [8, 9], states=StateCache(held))
    assert not [r for r in caplog.records if r.name.startswith("attnrank")]


def test_a_context_given_twice_is_computed_and_kept_once(llm, caplog):
    """One passage under two ids: both rows were computed, kept and counted against the budget,
    so a cache that holds every context warned that a repeat reuses almost none."""
    contexts = [[5, 6, 7, 8], [5, 6, 7, 9], [5, 6, 7, 8], [4, 4], [4, 4]]
    roomy = StateCache(1 << 30)
    alone = _scores(llm, contexts, [10, 20, 30], states=roomy)
    np.testing.assert_array_equal(alone[0], alone[2])
    np.testing.assert_array_equal(alone[3], alone[4])
    exact = StateCache(roomy.nbytes)  # room for the distinct contexts' states, no more
    with caplog.at_level("WARNING", logger="attnrank.llm.states"):
        _scores(llm, contexts, [10, 20, 30], states=exact)
        again = _scores(llm, contexts, [10, 20, 30], states=exact)
    assert not [r for r in caplog.records if "state cache" in r.getMessage()]
    assert exact.hits == 5 and len(exact) == 3
    np.testing.assert_allclose(again, alone, atol=1e-5)


def test_a_context_given_twice_scores_alike_without_kept_states_too(monkeypatch):
    """Without a state cache (attnrank batch, --dtype int8, sliding-window models) a passage under
    two ids was computed twice, in other batches: its two bfloat16 scores differed (6.5e-5)."""
    from attnrank.llm import likelihood

    model = tiny_model("llama", layers=2, max_positions=512).to(torch.bfloat16)
    llm = LLM(model=model, tokenizer=tiny_tokenizer(), model_id="tiny-bf16", fingerprint="bf16")
    contexts = [[5, 6, 7, 8, 9, 10], [4] * 9, [3] * 7, [5, 6, 7, 8, 9, 10], [2] * 8]
    rows: list[int] = []
    computed = likelihood._batch_logprob

    def counted(llm_, seqs, n_cont, keep):  # (the rows each pass computes)
        rows.append(len(seqs))
        return computed(llm_, seqs, n_cont, keep)

    monkeypatch.setattr(likelihood, "_batch_logprob", counted)
    out = continuation_logprob(llm, contexts, [11, 12, 13], batch_tokens=24)
    assert sum(rows) == 4 and len(rows) > 1  # (the copy is computed in no batch again)
    np.testing.assert_array_equal(out[0], out[3])


@pytest.mark.parametrize(
    ("family", "options"),
    [("mistral", {}), ("Gemma3Text", {}), ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}})],
)
def test_models_whose_states_depend_on_the_pass_are_scored_in_full_each_time(family, options):
    """Sliding-window layers keep only recent tokens, and dynamic NTK rotary frequencies follow
    the pass's longest position: nothing is kept, the scores stay right."""
    tok = tiny_tokenizer()
    model = tiny_model(family, layers=2, max_positions=512, **options)
    llm = LLM(model=model, tokenizer=tok, model_id=family, fingerprint="t")
    contexts = [tok(c, add_special_tokens=False)["input_ids"] for c in CONTEXTS]
    cont = tok(QUERY, add_special_tokens=False)["input_ids"]
    states = StateCache(1 << 30)
    assert not reuses_states(llm)
    got = [_scores(llm, contexts, cont, states=states) for _ in range(2)]
    assert len(states) == 0
    want = [_reference(llm, c, cont) for c in contexts]
    np.testing.assert_allclose(got[1], want, rtol=0, atol=1e-5)


def test_an_int8_model_keeps_no_states_and_scores_each_context_alone_of_the_query_order():
    """Dynamic int8 scales each linear's input over the whole pass: states kept from a pass that
    ran the first query's tokens depended on that query, so a second query over them scored
    otherwise than it does cold (5e-4 nats on a tiny model)."""
    from attnrank.llm.quantize import quantize_int8

    tok = tiny_tokenizer()
    model = tiny_model("llama", layers=2, max_positions=512)
    quantize_int8(model)
    llm = LLM(model=model, tokenizer=tok, model_id="int8", fingerprint="t", quantization="int8")
    assert not reuses_states(llm)
    contexts = [tok(c, add_special_tokens=False)["input_ids"] for c in CONTEXTS]
    first, second = (tok(q, add_special_tokens=False)["input_ids"] for q in (QUERY, " what is on the mat?"))
    states = StateCache(1 << 30)
    _scores(llm, contexts, first, states=states)
    assert len(states) == 0
    np.testing.assert_array_equal(_scores(llm, contexts, second, states=states), _scores(llm, contexts, second))


def test_a_buffer_first_taken_in_inference_mode_serves_a_later_call_outside_it(llm):
    """The kept memory was allocated as an inference tensor when a call ran inside
    torch.inference_mode(): a later call outside it then failed writing the padding."""
    tok = llm.tokenizer
    contexts = [tok(c, add_special_tokens=False)["input_ids"] for c in CONTEXTS]
    cont = tok(QUERY, add_special_tokens=False)["input_ids"]
    states, buffer = StateCache(1 << 30), ContextBuffer()
    _scores(llm, contexts, cont, states=states, buffer=buffer)
    with torch.inference_mode():
        inside = _scores(llm, contexts, cont, states=states, buffer=buffer)
    assert buffer.nbytes > 0 and not buffer._memory[0].is_inference()
    np.testing.assert_allclose(_scores(llm, contexts, cont, states=states, buffer=buffer), inside, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("shared", "reused"),
    [({"num_kv_shared_layers": 1}, False), ({"kv_source_layers": [0, 0]}, False), ({"kv_source_layers": [0, 1]}, True)],
)
def test_models_whose_layers_read_another_layers_keys_keep_no_states(shared, reused):
    """A suffix pass over kept states lends every layer one buffer: a layer that reads an earlier
    layer's keys (declared in the config: Gemma 3n/4, Kolibri, Mistral Large 4) would read the
    wrong layer's, so such a model scores every context in full."""
    tok = tiny_tokenizer()
    model = tiny_model("llama", layers=2, max_positions=512)
    for name, value in shared.items():
        setattr(model.config, name, value)
    llm = LLM(model=model, tokenizer=tok, model_id="shared-kv", fingerprint="t")
    assert reuses_states(llm) is reused


def _longrope_llm() -> LLM:
    return LLM(model=tiny_longrope_model(), tokenizer=tiny_tokenizer(), model_id="phi3-longrope", fingerprint="l")


def test_rotary_that_follows_the_batch_scores_each_context_alone():
    """LongRoPE (and dynamic NTK) frequencies follow the pass's longest sequence: a short context
    batched beside a long one was scored with the long one's frequencies."""
    llm = _longrope_llm()
    short, long = list(range(2, 22)), list(range(2, 47))
    cont = [50, 51, 52, 53]
    both = continuation_logprob(llm, [short, long], cont)
    alone = [continuation_logprob(llm, [c], cont)[0] for c in (short, long)]
    np.testing.assert_array_equal(both, np.stack(alone))


def test_gemma4s_kv_shared_layers_give_the_models_own_likelihood():
    """Gemma 4 (E2B/E4B) cuts its KV-shared layers' queries to the kept logits after the mask was
    skipped as causal; SDPA's causal flag then aligned them on the first keys: other scores, exit 0."""
    types = ["sliding_attention", "full_attention"] * 2
    model = tiny_model(
        "Gemma4Text", layers=4, layer_types=types, num_kv_shared_layers=2, sliding_window=8,
        hidden_size_per_layer_input=8, global_head_dim=8, num_global_key_value_heads=2,
    )  # fmt: skip
    llm = LLM(model=model, tokenizer=tiny_tokenizer(), model_id="tiny-gemma4", fingerprint="test")
    contexts, continuation = [list(range(10, 30)), list(range(40, 60))], [5, 6, 7, 8]
    got = continuation_logprob(llm, contexts, continuation)
    with torch.no_grad():
        for row, context in zip(got, contexts):
            logits = model(input_ids=torch.tensor([context + continuation])).logits[0].float().log_softmax(-1)
            own = [float(logits[len(context) - 1 + i, t]) for i, t in enumerate(continuation)]
            np.testing.assert_allclose(row, own, atol=1e-5)
