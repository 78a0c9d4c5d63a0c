"""AttentionReranker with ``signals``: attention fused with the candidates' first-stage signals, or
those signals alone (the default preset, ``signals="only"``)."""

from __future__ import annotations

import numpy as np
import pytest
from _tiny import RERANK_QUERY, rerank_docs

from attnrank.errors import InputError, ModelError
from attnrank.rerank.attention import AttentionReranker
from attnrank.rerank.config import RerankConfig
from attnrank.rerank.fused import FusedWeights
from attnrank.rerank.signals import SignalComputer

FUSED = FusedWeights(["attention", "bm25", "dense", "rank"], [0.8, 0.3, 1.2, 0.2], base_weights=[0.3, 1.2, 0.2])


def test_fused_scores_equal_the_weights_over_attention_and_signals(llm):
    docs = rerank_docs()
    plain = AttentionReranker(llm, None, config="fused", signals=None)  # the same capture, attention alone
    fused = AttentionReranker(llm, None, signals=FUSED)  # weights with attention, no preset: fused
    att = plain.score(RERANK_QUERY, docs)
    signals = SignalComputer(backend=fused.signals.backend)(
        RERANK_QUERY, [d.full_text for d in docs], ["bm25", "dense", "rank"]
    )
    expected = FUSED.score({"attention": att, **signals})
    np.testing.assert_allclose(fused.score(RERANK_QUERY, docs), expected, rtol=1e-9, atol=1e-12)
    res = fused.rank(RERANK_QUERY, docs)
    assert [d.id for d in res.results] == [docs[i].id for i in np.argsort(-expected, kind="stable")]
    assert "signals=fused" in repr(fused)


def test_gate_uses_the_first_stage_signals_alone_where_attention_is_flat(llm):
    docs = rerank_docs()
    always_base = FusedWeights(FUSED.features, FUSED.weights, base_weights=FUSED.base_weights, gate=1e9)
    rr = AttentionReranker(llm, None, signals=always_base)
    signals = SignalComputer(backend=rr.signals.backend)(
        RERANK_QUERY, [d.full_text for d in docs], ["bm25", "dense", "rank"]
    )
    base = FusedWeights(["bm25", "dense", "rank"], FUSED.base_weights).score(signals)
    np.testing.assert_allclose(rr.score(RERANK_QUERY, docs), base, rtol=1e-9)


def test_the_weights_heads_are_read_unless_heads_are_given(llm, caplog):
    """Fused weights fitted to some heads' attention score with those heads; heads given
    explicitly win. Weights fitted to attention captured otherwise are applied with a warning."""
    fitted = FusedWeights(FUSED.features, FUSED.weights, heads=["1-0", "0-1"], capture="block:shared")
    cfg = llm.model.config
    every = [(layer, head) for layer in range(cfg.num_hidden_layers) for head in range(cfg.num_attention_heads)]
    caplog.clear()
    with caplog.at_level("WARNING", logger="attnrank.rerank.fused"):
        rr = AttentionReranker(llm, signals=fitted)  # no preset: fused, block attention at shared positions
        assert rr.config.name == "fused" and rr.head_list == [(0, 1), (1, 0)] and not caplog.text
        assert "attention=block:shared" in repr(rr)
        assert AttentionReranker(llm, "0-0", signals=fitted).head_list == [(0, 0)]  # given heads win, said
        assert "fitted to the attention of heads 2 (0-1,1-0); this reranker reads 1 (0-0)" in caplog.text
        caplog.clear()
        AttentionReranker(llm, signals=fitted, attention="full")
        assert "captured as 'block:shared'; this reranker captures it as 'full'" in caplog.text
        caplog.clear()
        # none recorded: the config's heads (no set registered for the tiny model: all), weights taken
        # as fitted to full attention, as every weight was before the capture was recorded
        assert AttentionReranker(llm, signals=FUSED).head_list == every
        assert "captured as 'full'; this reranker captures it as 'block:shared'" in caplog.text


def test_fused_preset_and_bad_signals_value():
    fused = RerankConfig.preset("fused")
    assert RerankConfig.preset(signals="auto") == fused  # fusing attention without a preset: fused
    assert RerankConfig.preset(signals="none", heads="all").name == "icr"  # attention alone over every head
    assert fused.signals == "auto" and (fused.attention, fused.block_positions) == ("block", "shared")
    off = RerankConfig.preset("fused", signals="only")  # the preset's own attention settings go with attention
    assert not off.uses_attention and off.attention == "full" and off.attention_options() == []
    with pytest.raises(InputError, match="attention='block' configure"):  # given ones are refused
        RerankConfig.preset("fused", signals="only", attention="block")
    assert RerankConfig.preset("qrhead").signals is None
    assert RerankConfig.preset("signals").signals == "only" and not RerankConfig.preset("signals").uses_llm
    assert RerankConfig.preset(signals="only") == RerankConfig.preset("signals")
    assert RerankConfig.preset().uses_likelihood and not RerankConfig.preset().uses_attention
    with pytest.raises(InputError, match="signals='bm25'"):
        RerankConfig(signals="bm25")


@pytest.mark.parametrize(
    "option", [{"heads": "all"}, {"attention": "block"}, {"max_doc_words": 50}, {"reweight": None}]
)
def test_attention_options_without_attention_are_refused(option):
    """An attention option under signals='only' would be ignored: refused, naming it (reweight=None
    is the default, so it is accepted)."""
    if option == {"reweight": None}:
        assert RerankConfig.preset("signals", **option).signals == "only"
        return
    name = next(iter(option))
    with pytest.raises(InputError, match=f"{name}=.*configure.*attention"):
        RerankConfig.preset("signals", **option)
    with pytest.raises(InputError, match=name):
        RerankConfig(signals=FUSED.without_attention(), **option)
    assert RerankConfig.preset("signals", signals="auto", **option).uses_attention  # back to fused: accepted


def test_attention_options_without_a_preset_select_fused(llm, caplog):
    """The default computes no attention; attention options given without naming a preset mean
    the default with attention, ``fused`` (said in the log), not an error."""
    assert RerankConfig.preset().name == "likelihood"
    with caplog.at_level("INFO", logger="attnrank.rerank.config"):
        cfg = RerankConfig.preset(heads="all", max_doc_words=50)
    assert cfg.name == "fused+heads" and cfg.heads == "all" and cfg.uses_attention and "preset 'fused'" in caplog.text
    assert RerankConfig.preset(signals=None, heads="all").name == "icr"  # attention alone, every head
    cut = RerankConfig.preset(max_doc_words=50)  # the default reads the passage cut: no attention needed
    assert cut.name == "likelihood" and cut.max_doc_words == 50
    assert RerankConfig.preset(signals=None, heads="all").uses_attention  # (attention alone)
    rr = AttentionReranker(llm, "0-1,2-3")  # heads, no preset
    assert rr.config.name == "fused+heads" and rr.uses_attention and rr.head_list == [(0, 1), (2, 3)]
    assert not AttentionReranker(llm).uses_attention


@pytest.mark.parametrize("family", ["qwen2", "mistral", "gemma"])
def test_fused_and_default_presets_work_with_any_causal_lm(family, caplog):
    from _tiny import tiny_model, tiny_tokenizer

    from attnrank.llm.models import LLM

    llm = LLM(
        model=tiny_model(family, max_positions=4096),
        tokenizer=tiny_tokenizer(),
        model_id=f"tiny-{family}",
        fingerprint="t" * 64,
    )
    res = AttentionReranker(llm, config="fused").rank(RERANK_QUERY, rerank_docs())  # the shipped weights
    assert res.stage == "fused" and len(res) == 4
    assert all(np.isfinite(d.score) and "attention" in d.stage_scores for d in res)
    assert "no fused weights are registered" in caplog.text  # the fallback to the packaged weights is said
    default = AttentionReranker(llm).rank(RERANK_QUERY, rerank_docs())  # preset "likelihood": no attention
    assert default.stage == "fused" and len(default) == 4
    assert all(np.isfinite(d.score) and set(d.stage_scores) == {"fused", "likelihood"} for d in default)
    caplog.clear()
    AttentionReranker(llm)  # the signals alone do not depend on the model: no warning about its weights
    assert "no fused weights are registered" not in caplog.text


def _forward_calls(llm) -> list[int]:
    calls: list[int] = []
    llm.model.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


def test_signals_preset_scores_by_the_weights_model_without_attention_and_never_runs_the_llm(llm):
    """The default preset: the registered (here: given) weights' base model over the signals alone."""
    docs = rerank_docs()
    calls = _forward_calls(llm)
    rr = AttentionReranker(llm, config="signals", signals=FUSED.without_attention())
    signals = SignalComputer(backend=rr.signals.backend)(
        RERANK_QUERY, [d.full_text for d in docs], ["bm25", "dense", "rank"]
    )
    expected = FusedWeights(["bm25", "dense", "rank"], FUSED.base_weights).score(signals)
    np.testing.assert_allclose(rr.score(RERANK_QUERY, docs), expected, rtol=1e-9, atol=1e-12)
    res = rr.rank(RERANK_QUERY, docs, k=2)
    assert [d.id for d in res] == [docs[i].id for i in np.argsort(-expected, kind="stable")[:2]]
    assert all(set(d.stage_scores) == {"fused"} for d in res)
    assert not calls and not rr.uses_attention and f"weights={FUSED.base_weights}" in repr(rr)  # not equal ones
    with pytest.raises(InputError, match="no per-token attention evidence"):
        rr.rank(RERANK_QUERY, docs, return_evidence=True)


@pytest.mark.parametrize(
    ("device", "dtype", "cpu_dtype", "want"),
    [
        ("cpu", "auto", "bfloat16", ("cpu", "torch-bf16")),  # a CPU with AMX / AVX-512 BF16
        ("cpu", "auto", "float32", ("cpu", "torch")),
        ("auto", "auto", "bfloat16", ("cpu", "torch-bf16")),
        ("cpu", "float32", "bfloat16", ("cpu", "torch")),
        ("cpu", "int8", "bfloat16", ("cpu", "torch")),  # int8 linear layers: the rest stays float32
        ("cpu", "bfloat16", "float32", ("cpu", "torch-bf16")),
        ("cuda:0", "auto", "bfloat16", ("cuda:0", "torch")),
    ],
)
def test_the_candidates_embedder_runs_in_the_rerankers_cpu_precision(monkeypatch, device, dtype, cpu_dtype, want):
    from attnrank.rerank.signals import signal_embedder_setup

    monkeypatch.setenv("ATTNRANK_CPU_DTYPE", cpu_dtype)
    assert signal_embedder_setup(device, dtype) == want


def test_the_signals_preset_loads_no_model_until_one_is_asked_for(tiny_dir):
    from attnrank.llm.models import _load_cached

    def loads() -> int:
        info = _load_cached.cache_info()
        return info.hits + info.misses

    before = loads()
    rr = AttentionReranker(str(tiny_dir), config="signals")
    res = rr.rank(RERANK_QUERY, rerank_docs())
    assert len(res) == 4 and res.stage == "fused" and not rr.uses_attention and rr.head_list == []
    assert loads() == before and rr.model_id == str(tiny_dir)
    assert rr.llm.model_id == str(tiny_dir) and loads() == before + 1  # an answer or explanation loads it
    fused = AttentionReranker(str(tiny_dir), config="fused")
    assert fused.uses_attention and loads() == before + 2 and fused.fingerprint == rr.fingerprint
    with pytest.raises(ModelError, match="no such local model folder"):  # still checked, before any work
        AttentionReranker(str(tiny_dir / "missing"), config="signals")
    with pytest.raises(ModelError, match="its config cannot be read"):  # a folder that is no model
        AttentionReranker(str(tiny_dir.parent), config="signals")
    weights = AttentionReranker(str(tiny_dir), signals=FUSED.without_attention())  # no attention: no load either
    assert not weights.uses_attention and loads() == before + 2


def test_the_candidates_embedder_follows_a_given_models_precision(llm, monkeypatch):
    import torch
    from _tiny import tiny_model, tiny_tokenizer

    from attnrank.llm.models import LLM

    monkeypatch.setenv("ATTNRANK_CPU_DTYPE", "bfloat16")  # what auto would pick: not what the model is
    assert AttentionReranker(llm, config="signals").signals.backend == "torch"  # a float32 model
    bf16 = LLM(tiny_model("llama").to(torch.bfloat16), tiny_tokenizer(), "tiny-bf16", "b" * 64)
    monkeypatch.setenv("ATTNRANK_CPU_DTYPE", "float32")
    assert AttentionReranker(bf16, config="signals").signals.backend == "torch-bf16"


def test_reranking_candidates_of_an_index_reads_their_stored_vectors(llm, built_retriever, embedded):
    """Same scores with the index's vectors as with a fresh embedding of every candidate."""
    first = built_retriever.search("vitamin D and bone fractures", 8)
    only = FUSED.without_attention()  # the llm fixture is float32: so is the candidates' embedder
    plain = AttentionReranker(llm, config="signals", signals=only)
    indexed = AttentionReranker(llm, config="signals", signals=only)
    assert plain.signals.backend == "torch" and indexed.use_index(built_retriever)
    want = plain.score(first.query, first)
    embedded.clear()
    np.testing.assert_allclose(indexed.score(first.query, first), want, rtol=1e-4, atol=1e-5)
    assert embedded == [1]  # the query alone: every candidate's vector was read back
    assert [d.id for d in indexed.rank(first.query, first)] == [d.id for d in plain.rank(first.query, first)]
    assert not AttentionReranker(llm, None, signals=None).use_index(built_retriever)  # no signals read


def test_signals_only_is_equal_weights_unless_a_user_registered_weights(llm, home):
    """The default preset: z(BM25) + z(dense), untrained, even though weights are shipped for the
    packaged model (which ``fused`` reads); a user's registered weights' base model replaces it."""
    shipped = AttentionReranker(llm, config="fused").fused
    assert shipped is not None and shipped.base_weights  # shipped weights exist, and are not read:
    only = AttentionReranker(llm, config="signals").fused
    assert only is not None and only.features == ["bm25", "dense"] and only.weights == [1.0, 1.0]
    assert only.gate is None and only.learner == "equal"
    FUSED.save(llm.model_id, llm.fingerprint)
    mine = AttentionReranker(llm, config="signals").fused
    assert mine is not None and mine.features == ["bm25", "dense", "rank"] and mine.weights == FUSED.base_weights
    assert AttentionReranker(llm, config="fused").fused.weights == FUSED.weights  # type: ignore[union-attr]
    from attnrank.rerank.fused import SignalsWeights  # the preset's own weights come first

    own = SignalsWeights(["bm25", "rank"], [0.2, 3.0], trained_on="my queries")
    own.save(llm.model_id, llm.fingerprint)
    rr = AttentionReranker(llm, config="signals")
    assert rr.fused == own and "weights=[0.2, 3.0]" in repr(rr)
    docs = rerank_docs()
    want = own.score(rr.signals(RERANK_QUERY, [d.full_text for d in docs], ["bm25", "rank"]))
    np.testing.assert_allclose(rr.score(RERANK_QUERY, docs), want, rtol=1e-6)


def test_the_default_preset_scores_by_a_users_likelihood_weights_once_registered(llm, home):
    """Preset likelihood: equal weights over BM25, dense and the likelihood, until a user registers
    LikelihoodWeights (``attnrank train``) for the model; fused weights registered for the preset
    fused leave it alone, and its weights leave the preset signals alone."""
    from attnrank.rerank.fused import LikelihoodWeights

    docs = rerank_docs()
    before = AttentionReranker(llm).fused
    assert before is not None and before.features == ["bm25", "dense", "likelihood"] and before.learner == "equal"
    FUSED.save(llm.model_id, llm.fingerprint)
    assert AttentionReranker(llm).fused == before
    mine = LikelihoodWeights(["bm25", "dense", "rank", "likelihood"], [0.2, 0.5, 0.1, 2.0], learner="pointwise")
    mine.save(llm.model_id, llm.fingerprint)
    rr = AttentionReranker(llm)
    assert rr.fused == mine and not rr.uses_attention
    ranked = rr.rank(RERANK_QUERY, docs)
    by_id = {d.id: d for d in ranked}
    signals = rr.signals(RERANK_QUERY, [d.full_text for d in docs], ["bm25", "dense", "rank"])
    signals["likelihood"] = np.array([by_id[d.id].stage_scores["likelihood"] for d in docs])
    np.testing.assert_allclose([by_id[d.id].score for d in docs], mine.score(signals), atol=1e-5)  # float32 scores
    np.testing.assert_allclose(signals["likelihood"], rr.likelihood(RERANK_QUERY, docs), rtol=1e-6)
    assert AttentionReranker(llm, config="signals").fused.weights == FUSED.base_weights  # type: ignore[union-attr]


def test_an_empty_list_carries_the_fused_stage(llm):
    """An empty candidate list is named as a non-empty one would be (it said "attention")."""
    assert AttentionReranker(llm, None, signals=FUSED).rank(RERANK_QUERY, []).stage == "fused"
    assert AttentionReranker(llm, None, signals=None).rank(RERANK_QUERY, []).stage == "attention"


def test_the_reranker_computes_dense_with_the_weights_embedder(llm):
    from dataclasses import replace

    mine = replace(FUSED, embedder="/models/my-embedder")
    assert AttentionReranker(llm, None, signals=mine).signals.embedder_name == "/models/my-embedder"
    assert AttentionReranker(llm, None, signals=FUSED).signals.embedder_name is None


def test_an_empty_query_is_refused_by_every_preset(llm):
    """The preset without attention once ranked the candidates for an empty query (by BM25 and
    dense scores against nothing) and returned that order; every preset and call refuses it."""
    docs = rerank_docs()
    for reranker in (AttentionReranker(llm, config="signals"), AttentionReranker(llm, None, signals=None)):
        for query in ("", "   "):
            with pytest.raises(InputError, match="is empty; give a non-empty query text"):
                reranker.rank(query, docs)
            with pytest.raises(InputError, match="is empty"):
                reranker.score(query, docs)
        with pytest.raises(InputError, match="query 123 is a int, not a text"):
            reranker.rank(123, docs)  # type: ignore[arg-type]
        with pytest.raises(InputError, match="query None is a NoneType"):
            reranker.rank_batch([None], [docs])  # type: ignore[list-item]


def test_signals_never_reads_the_likelihood_of_a_users_fused_weights(tmp_path, home):
    """Fused weights with the likelihood among their base features gave preset signals (which
    runs no LLM) a likelihood to read: the first rank loaded and ran the model."""
    from _tiny import save_tiny

    from attnrank.llm.models import unloaded_model
    from attnrank.rerank.fused_resolve import signals_only

    path = str(save_tiny(tmp_path / "tiny"))
    key = unloaded_model(path)
    with_llm = FusedWeights(
        ["attention", "bm25", "dense", "likelihood"], [1.0, 0.5, 1.0, 0.5], base_weights=[1.0, 1.0, 1.0], gate=None
    )
    with_llm.save(*key)
    assert not signals_only(*key).uses_llm and signals_only(*key).features == ["bm25", "dense"]
    rr = AttentionReranker(path, config="signals")
    assert len(rr.rank(RERANK_QUERY, rerank_docs())) == 4 and rr._llm is None


def test_registered_weights_without_attention_need_no_head_set(tmp_path, home):
    """The lookup before a run (batch, serve, the CLI) resolved the 'auto' head set although
    weights without attention read no heads: a model with none registered was refused."""
    from _tiny import save_tiny

    from attnrank.llm.models import unloaded_model
    from attnrank.rerank.config import RerankConfig
    from attnrank.rerank.resolve import check_lookups

    path = str(save_tiny(tmp_path / "tiny"))
    FusedWeights(["bm25", "dense", "rank"], [1.0, 1.0, 0.2]).save(*unloaded_model(path))
    check_lookups(RerankConfig.preset("fused", model=path, heads="auto"))
    rr = AttentionReranker(path, config="fused", heads="auto")
    assert not rr.uses_attention and len(rr.rank(RERANK_QUERY, rerank_docs())) == 4


def test_weights_fitted_to_attention_warn_where_it_is_re_weighted(llm, caplog):
    """Re-weighted attention (sink, IDF, ...) was scored with weights fitted to plain attention, and
    gated on its changed peakedness, without a word (no trainer fits weights to re-weighted attention)."""
    from attnrank.rerank.reweight import Reweighting

    caplog.clear()
    with caplog.at_level("WARNING", logger="attnrank.rerank.fused"):
        AttentionReranker(llm, signals=FUSED, reweight=Reweighting())  # every step off: nothing re-weighted
        AttentionReranker(llm, signals=FusedWeights(FUSED.features, FUSED.weights, learner="equal"),
                          reweight=Reweighting(sink=True))  # fmt: skip
        assert "re-weight" not in caplog.text
        AttentionReranker(llm, signals=FUSED, reweight=Reweighting(sink=True, idf=True))
    assert "fitted to attention without re-weighting; this reranker re-weights it" in caplog.text


def test_a_reweighting_that_applies_no_step_is_not_warned_of(llm, caplog):
    """Reweighting(idf_eps=0.3) sets an option of a step that is off: nothing is re-weighted."""
    from attnrank.rerank.reweight import Reweighting

    caplog.clear()
    with caplog.at_level("WARNING", logger="attnrank.rerank.fused"):
        AttentionReranker(llm, signals=FUSED, reweight=Reweighting(idf_eps=0.3))
    assert "re-weight" not in caplog.text


def test_only_weights_whose_scores_moved_since_they_were_fitted_are_warned_of(llm, caplog, make_examples):
    """Version 2 moved the likelihood alone (its prompt strips edge whitespace): weights fitted to
    version 1's attention still read the scores they measured and were told to retrain all the same;
    weights that read the likelihood were fitted to scores this attnrank no longer computes."""
    from dataclasses import replace

    from attnrank.rerank.fused_training import train_fused
    from attnrank.rerank.versions import ATTENTION_SINCE, LIKELIHOOD_SINCE

    assert ATTENTION_SINCE < LIKELIHOOD_SINCE
    attention = train_fused(make_examples(20, "a", 0.5, 1), capture="full")
    examples = make_examples(20, "a", 0.5, 1)
    for e in examples:
        e.signals["likelihood"] = e.signals.pop("attention")
    likelihood = train_fused(examples, ["bm25", "dense", "rank", "likelihood"])
    with caplog.at_level("WARNING"):
        AttentionReranker(llm, signals=replace(attention, scoring_version=ATTENTION_SINCE))
    assert "version" not in caplog.text
    with caplog.at_level("WARNING"):
        AttentionReranker(llm, signals=replace(likelihood, scoring_version=LIKELIHOOD_SINCE - 1))
    assert f"fitted to scores of version {LIKELIHOOD_SINCE - 1} of attnrank's scoring" in caplog.text


def test_weights_fitted_to_another_scoring_version_are_warned_of(llm, caplog, make_examples):
    """Weights record the version of the scoring their LLM feature was read with (it moves the
    attention and likelihood scores: a batch checkpoint refused to mix them, but registered weights
    were applied across a change without a word). Weights that record none are not checked."""
    from dataclasses import replace

    from attnrank.rerank.fused_training import train_fused
    from attnrank.rerank.learned import train_head_weights
    from attnrank.rerank.learned.features import QueryFeatures
    from attnrank.rerank.versions import ATTENTION_SINCE, SCORING_VERSION

    fitted = train_fused(make_examples(20, "a", 0.5, 1), capture="full")
    assert fitted.scoring_version == SCORING_VERSION
    with caplog.at_level("WARNING"):
        AttentionReranker(llm, signals=fitted)
        AttentionReranker(llm, signals=replace(fitted, scoring_version=None))
        assert "version" not in caplog.text
        AttentionReranker(llm, signals=replace(fitted, scoring_version=ATTENTION_SINCE - 1))
    assert f"fitted to scores of version {ATTENTION_SINCE - 1} of attnrank's scoring" in caplog.text
    heads = [(0, 2), (1, 1)]
    rng = np.random.default_rng(0)
    ex = [
        QueryFeatures(f"q{i}", ["a", "b", "c"], rng.normal(size=(3, 2)), np.array([1, 0, 0]), heads) for i in range(6)
    ]
    learned = train_head_weights(ex)
    assert learned.config.scoring_version == SCORING_VERSION
    caplog.clear()
    learned.config.scoring_version = SCORING_VERSION + 1
    with caplog.at_level("WARNING"):
        AttentionReranker(llm, scorer=learned, signals=None)
    assert "learned head weights were fitted to scores of version" in caplog.text
