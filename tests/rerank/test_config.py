"""RerankConfig: contradictory options are refused when the configuration is built."""

from __future__ import annotations

import pytest

from attnrank.errors import InputError
from attnrank.rerank.config import RERANK_PRESETS, RerankConfig
from attnrank.rerank.reweight import Reweighting


def test_learned_scorer_refuses_reweighting_it_would_not_apply():
    # before: accepted, and the learned scorer silently ranked without the re-weighting
    with pytest.raises(InputError, match=r"reweight= would not be applied; drop reweight \(--reweight none\)"):
        RerankConfig.preset("learned", reweight=Reweighting(sink=True))
    with pytest.raises(InputError, match="scorer='learned'"):
        RerankConfig.preset("qrhead-sink", heads=None, scorer="learned")
    assert RerankConfig.preset("learned").reweight is None
    assert RerankConfig.preset("qrhead-sink").reweight == Reweighting(sink=True)


def test_signals_other_than_auto_only_likelihood_none_or_fused_weights_are_refused():
    # before: signals=False passed, and the reranker loaded the registered fused weights (fusion on)
    for value in (False, True, 0, "bm25"):
        with pytest.raises(InputError, match=r"is not 'auto', 'only', 'likelihood', None or FusedWeights"):
            RerankConfig.preset("qrhead", signals=value)
    from attnrank.rerank.fused import FusedWeights

    fused = FusedWeights(["attention", "dense"], [1.0, 1.0])
    assert RerankConfig(signals=fused).signals is fused and RerankConfig(signals=None).signals is None


def test_signals_likelihood_is_the_default_preset_without_attention():
    """The default preset names its model by ``signals="likelihood"`` (resolved per model: a user's
    registered weights, else equal ones), so it reads the likelihood and computes no attention."""
    default = RerankConfig.preset()
    assert default.name == "likelihood" and default.signals == "likelihood"
    assert default.uses_likelihood and default.uses_llm and not default.uses_attention
    assert RerankConfig.preset(signals="likelihood").name == "likelihood"
    assert RerankConfig.preset(max_doc_words=150).max_doc_words == 150  # the likelihood cuts passages too
    with pytest.raises(InputError, match="heads='all' configure"):
        RerankConfig.preset("likelihood", heads="all")


def test_truncation_limits_refuse_booleans():
    # before: max_doc_words=True passed as 1, and every passage was cut to its first word
    for key in ("max_doc_words", "max_doc_tokens", "max_prompt_tokens"):
        with pytest.raises(InputError, match=f"{key}=True must be a positive integer or None"):
            RerankConfig(**{key: True})
    assert RerankConfig(max_doc_words=1, max_doc_tokens=None).max_doc_words == 1


def test_device_and_dtype_names_are_checked_with_or_without_attention():
    """They also set the embedder of the preset without attention, which once ignored a typo
    (dtype='float99' ranked as 'auto'); refused when configured, before anything loads."""
    for preset in ("signals", "qrhead"):
        with pytest.raises(InputError, match=r"dtype='float99' is not one of 'auto', 'float32'"):
            RerankConfig.preset(preset, dtype="float99")
        with pytest.raises(InputError, match=r"device='tpu' is not one of 'cpu', 'cuda', 'cuda:N', 'auto'"):
            RerankConfig.preset(preset, device="tpu")
    with pytest.raises(InputError, match="dtype='float16' is not supported on CPU"):
        RerankConfig(dtype="float16")
    assert RerankConfig(device="cuda:1", dtype="float16").dtype == "float16"  # named right; resolved on load
    assert RerankConfig(dtype="int8").dtype == "int8" and RerankConfig(device="auto").device == "auto"


def test_signals_none_as_text_is_none():
    """The CLI's --signals none, given to the API as text, means no signals (it was refused)."""
    assert RerankConfig.preset("qrhead", signals="none").signals is None
    assert RerankConfig.preset("qrhead", signals=" None ").signals is None


def test_the_configured_precision_names_are_the_ones_the_model_loader_maps():
    from attnrank.config import PRECISION_NAMES
    from attnrank.llm.device import DTYPES, QUANTIZED

    assert (*DTYPES, *QUANTIZED) == PRECISION_NAMES


def test_switching_to_the_likelihood_keeps_the_passage_cut_and_names_are_stored_lower_case():
    """with_options(signals="likelihood") reset max_doc_words (which the likelihood reads) with the
    attention fields; "CPU" passed the check and reached the embedder as typed."""
    from attnrank.rerank.config import RerankConfig

    cfg = RerankConfig.preset("fused", max_doc_words=120, max_doc_tokens=90).with_options(signals="likelihood")
    assert (cfg.max_doc_words, cfg.max_doc_tokens) == (120, 90)
    assert RerankConfig.preset("fused", max_doc_words=120).with_options(signals="only").max_doc_words == 300
    # weights that read the likelihood keep the cut too (only the word "likelihood" did)
    from attnrank.rerank.fused import LikelihoodWeights, SignalsWeights

    mine = LikelihoodWeights(["bm25", "likelihood"], [1.0, 2.0])
    cfg = RerankConfig.preset("likelihood", max_doc_words=150, max_doc_tokens=90).with_options(signals=mine)
    assert (cfg.max_doc_words, cfg.max_doc_tokens) == (150, 90) and cfg.uses_likelihood
    plain = SignalsWeights(["bm25", "dense"], [1.0, 2.0])
    assert RerankConfig.preset("likelihood", max_doc_words=150).with_options(signals=plain).max_doc_words == 300
    cfg = RerankConfig.preset("signals", device=" CPU ", dtype="BFloat16")
    assert (cfg.device, cfg.dtype) == ("cpu", "bfloat16")


def test_a_preset_whose_attention_is_switched_off_is_named_for_what_it_computes(tiny_dir):
    """preset fused with signals="only" scored as preset signals does, but kept the name fused in
    run tags (attnrank-fused) and repr; it now takes the name of the preset it equals, else custom."""
    from attnrank.rerank.attention import AttentionReranker
    from attnrank.rerank.config import RerankConfig

    assert RerankConfig.preset("fused", signals="only").name == "signals"
    assert RerankConfig.preset("icr", signals="likelihood").name == "likelihood"
    assert RerankConfig.preset("fused", signals="likelihood", max_doc_words=50).name == "likelihood"  # (its cut)
    assert RerankConfig.preset("fused", dtype="float32").name == "fused"  # attention still on: its own name
    assert RerankConfig.preset("fused").with_options(signals="only", name="mine").name == "mine"
    assert "preset='signals'" in repr(AttentionReranker(str(tiny_dir), config="fused", signals="only"))


def test_a_learned_scorer_without_a_preset_builds_the_learned_preset():
    """It selected fused (signals, block attention at shared positions): learned head weights then
    read a capture they were not trained on, fused with the signals, and no warning said so."""
    from attnrank.rerank.config import RerankConfig

    assert RerankConfig.preset(scorer="learned") == RerankConfig.preset("learned")
    assert RerankConfig.preset(heads="all").name == "fused+heads"  # other attention options: fused, its heads not


def test_on_off_settings_refuse_strings():
    """token_filter="false" (a hand-written settings file) ran with the filter on, and
    calibrate="false" failed deep in scoring with a TypeError naming neither."""
    from attnrank.prune.config import PruneConfig

    for key in ("calibrate", "token_filter"):
        with pytest.raises(InputError, match=f"{key}='false' must be True or False"):
            RerankConfig(**{key: "false"})
    with pytest.raises(InputError, match="sink='no' must be True or False"):
        PruneConfig(sink="no")
    assert RerankConfig(calibrate=False, token_filter=True).calibrate is False


def test_weights_without_attention_name_the_preset_whose_features_they_read():
    """They were labelled the default, likelihood, whatever they read: the run tag and a batch
    checkpoint's recorded preset said likelihood for BM25 and dense alone."""
    from attnrank.rerank.fused import LIKELIHOOD_FEATURES, equal_weights

    assert RerankConfig.preset(signals=equal_weights()).name == "signals"
    assert RerankConfig.preset(signals=equal_weights(LIKELIHOOD_FEATURES)).name == "likelihood"


def test_attention_inputs_that_need_no_model_are_checked_when_configured(tmp_path):
    """A bad head list, a missing slot profile file and slot correction without a profile were
    found by AttentionReranker after it had loaded the model (the CLI checked them, the API not),
    and so was a profile file that holds no profile."""
    from attnrank.rerank.attention import AttentionReranker
    from attnrank.rerank.reweight import Reweighting

    not_a_profile = tmp_path / "notes.json"
    not_a_profile.write_text('{"weights": [1, 2]}')
    png = tmp_path / "plot.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    for options, said in (
        (
            {"reweight": Reweighting(slot_correction=True), "slot_profile": str(not_a_profile)},
            r"notes.json' \(--slot-profile\) holds no slot profile \(slot profile is not of format version",
        ),
        (
            {"reweight": Reweighting(slot_correction=True), "slot_profile": str(png)},
            r"plot.png' \(--slot-profile\) holds no slot profile",
        ),
        ({"heads": "13-x"}, "13-x"),
        ({"heads": "no-such-file.json"}, "head file 'no-such-file.json' does not exist"),
        ({"reweight": Reweighting(slot_correction=True)}, r"needs slot_profile= \(--slot-profile\)"),
        (
            {"reweight": Reweighting(slot_correction=True), "slot_profile": "nope.json"},
            r"slot_profile 'nope.json' \(--slot-profile\) is not a file",
        ),
    ):
        with pytest.raises(InputError, match=said):
            AttentionReranker("no/such-model-is-loaded", config="qrhead", **options)
    assert RerankConfig.preset("qrhead", heads="auto:copy").heads == "auto:copy"


def test_what_the_registry_lacks_is_named_before_the_model_loads(home, tiny_dir, tmp_path):
    """scorer='learned' with nothing registered was found after the weights had loaded (the CLI
    looked it up first, the Python API did not)."""
    import shutil

    from attnrank.rerank.attention import AttentionReranker

    config_only = tmp_path / "config-only"  # no weights: a load would fail with another error
    config_only.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        if (tiny_dir / name).exists():
            shutil.copy(tiny_dir / name, config_only / name)
    with pytest.raises(InputError, match="learned head weights"):
        AttentionReranker(str(config_only), config="learned")


@pytest.mark.parametrize(
    ("preset", "options", "name"),
    [
        ("likelihood", {"signals": "only"}, "signals"),  # no likelihood, no LLM
        ("signals", {"signals": "likelihood"}, "likelihood"),  # runs the LLM
        ("likelihood", {"signals": None}, "qrhead"),  # attention alone
        ("signals", {"signals": "auto"}, "fused"),  # captured as preset fused (its weights were fitted so)
        ("qrhead", {"heads": "all"}, "icr"),
        ("fused", {"signals": None}, "custom"),  # attention alone at block positions
        ("fused", {"heads": "all"}, "fused+heads"),
        ("likelihood", {"max_doc_words": 150}, "likelihood"),  # how it reads, not what it computes
        ("qrhead", {"calibrate": False}, "qrhead"),
    ],
)
def test_a_preset_with_options_is_named_for_what_it_computes(preset, options, name):
    """The name is the run tag (attnrank-<name>) and the repr's preset: `--preset likelihood
    --signals only` was tagged attnrank-likelihood though it computed no likelihood."""
    assert RerankConfig.preset(preset, **options).name == name


def test_a_name_changes_only_with_what_is_computed_whatever_the_order_or_spelling():
    mine = RerankConfig(heads=[(0, 1)], name="mine")
    assert mine.with_options(heads=[(0, 1)]).name == "mine"  # the same heads again: nothing changed
    assert RerankConfig.preset("qrhead", heads=None).name == RerankConfig.preset("qrhead", heads="ALL").name == "icr"
    assert RerankConfig.preset("learned", scorer="sum").name == "icr"  # every head, summed
    both = RerankConfig.preset("fused", heads="all", attention="full").name
    assert (
        both == RerankConfig.preset("fused", heads="all").with_options(attention="full").name == "fused+heads+attention"
    )


def test_an_instruction_that_is_not_a_text_is_refused_when_configured():
    """instruction=None passed (str(None) is "None") and failed after the model loaded; 5 was an
    AttributeError from prompt_settings()."""
    from attnrank.prune.config import PruneConfig

    for bad in (None, 5):
        with pytest.raises(InputError, match=f"instruction={bad!r} is not a text"):
            RerankConfig(instruction=bad)
        with pytest.raises(InputError, match=f"instruction={bad!r} is not a text"):
            PruneConfig(instruction=bad)


def test_block_positions_without_block_attention_are_refused_and_name_nothing():
    """preset('qrhead', block_positions='shared') captured the full prompt but was named
    'qrhead+block_positions' (a run tag claiming another method), and preset('fused',
    attention='full') was charged for the preset's own shared positions."""
    with pytest.raises(InputError, match="block_positions='shared' is read by block attention only"):
        RerankConfig.preset("qrhead", block_positions="shared")
    assert RerankConfig.preset("fused", attention="full").name == "fused+attention"
    assert RerankConfig.preset("icr", attention="block").name == "icr+attention"
    assert (
        RerankConfig.preset("icr", attention="block", block_positions="shared").name == "icr+attention+block_positions"
    )
    assert RerankConfig.preset("fused", signals="likelihood").name == "likelihood"  # reset, not refused
    with pytest.raises(InputError, match="read by block attention only"):  # the preset's own value, given
        RerankConfig.preset("fused", attention="full", block_positions="shared")
    assert RerankConfig.preset("fused", attention="full", block_positions="rotated").name == "fused+attention"


def test_attention_switched_on_over_a_preset_without_it_is_captured_as_with_no_preset():
    """--preset likelihood --signals auto read the full prompt at rotated positions, beside
    preset fused's weights, fitted to block attention at shared positions; with no preset the same
    option chose preset fused. Both are now that capture; fields the caller set are kept."""
    bare = RerankConfig.preset(signals="auto")
    for name in ("likelihood", "signals"):
        turned = RerankConfig.preset(name, signals="auto")
        assert (
            (turned.attention, turned.block_positions, turned.heads)
            == (
                bare.attention,
                bare.block_positions,
                bare.heads,
            )
            == ("block", "shared", RERANK_PRESETS["fused"].heads)
        )
        assert turned.name == "fused"
    full = RerankConfig.preset("likelihood", signals="auto", attention="full")
    assert full.attention == "full" and full.block_positions == RerankConfig.block_positions
    for options in ({"attention": "full"}, {"heads": "all"}):  # one configuration, one name (and run tag)
        same = RerankConfig.preset(signals="auto", **options)
        assert RerankConfig.preset("likelihood", signals="auto", **options).name == same.name != "custom"


def test_a_config_refuses_a_model_that_is_no_name_and_a_state_cache_nothing_reads():
    """model=123 reached the registry lookups as a bare TypeError; state_cache_mb on attention
    alone over the full prompt was accepted in Python (refused by the CLI) and never read."""
    from attnrank.prune.config import PruneConfig

    for make in (RerankConfig, PruneConfig):
        with pytest.raises(InputError, match=r"\(model=\.\.\.\) is a int, not a model name or folder"):
            make(model=123)
    with pytest.raises(InputError, match="state_cache_mb=4096 sizes passage states and vectors"):
        RerankConfig.preset("qrhead", state_cache_mb=4096)
    assert RerankConfig.preset("qrhead", state_cache_mb=0).state_cache_mb == 0  # (keep nothing: batch actors)
    assert RerankConfig.preset("qrhead", attention="block", state_cache_mb=4096).state_cache_mb == 4096
    assert RerankConfig.preset("likelihood", state_cache_mb=4096).state_cache_mb == 4096


def test_slot_correction_is_refused_where_every_passage_has_the_same_positions():
    """A full prompt's slot profile was subtracted from block attention at shared positions, which
    has no slot bias: the shipped profile raised the passage placed last by about 0.1."""
    slot = Reweighting(slot_correction=True)
    with pytest.raises(InputError, match="block attention at shared positions does not have"):
        RerankConfig.preset("icr", attention="block", block_positions="shared", reweight=slot, slot_profile="auto")
    rotated = RerankConfig.preset(
        "icr", attention="block", block_positions="rotated", reweight=slot, slot_profile="auto"
    )
    assert rotated.reweight == slot


def test_heads_given_as_a_numpy_array_choose_a_preset_as_a_list_does():
    """RerankConfig(heads=array) worked, but choosing a preset compared the array with the default
    ("truth value of an array ... is ambiguous"), as did RerankConfig.preset and with_options."""
    import numpy as np

    pairs = np.array([[0, 0], [0, 1]])
    assert RerankConfig.preset(heads=pairs) == RerankConfig.preset(heads=[[0, 0], [0, 1]])
    assert RerankConfig.preset("qrhead").with_options(heads=pairs).name == "qrhead+heads"
    assert RerankConfig(heads=pairs).heads == [[0, 0], [0, 1]]


def test_a_preset_survives_a_round_trip_through_a_dict_and_json():
    """dataclasses.asdict turned qrhead-sink's Reweighting into a dict, which RerankConfig refused."""
    import dataclasses
    import json

    for name, cfg in RERANK_PRESETS.items():
        again = RerankConfig(**json.loads(json.dumps(dataclasses.asdict(cfg))))
        assert again == cfg, name
    with pytest.raises(InputError, match=r"unknown Reweighting option\(s\) \['sinks'\]"):
        RerankConfig(reweight={"sinks": True})


def test_a_preset_given_by_the_command_lines_name_is_pointed_to_config():
    """AttentionReranker(preset="signals") was refused listing every option but the one it meant."""
    with pytest.raises(
        InputError, match=r"\['preset'\].*a preset is named by config='NAME' \(the command line's --preset"
    ):
        RerankConfig.preset(preset="signals")
    from attnrank.prune.config import PruneConfig

    with pytest.raises(InputError, match=r"unknown PruneConfig option\(s\) \['preset'\]") as e:
        PruneConfig().with_options(preset="icr")  # (a pruner has no presets: no hint)
    assert "config='NAME'" not in str(e.value)
