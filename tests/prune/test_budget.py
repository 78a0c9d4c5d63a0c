"""The pruning budget: what keep_ratio and budget_tokens resolve to."""

from __future__ import annotations

import pytest

from attnrank.errors import InputError


def test_a_keep_ratio_that_keeps_no_token_is_refused_and_numpy_ratios_are_numbers():
    import numpy as np

    from attnrank.prune.context import check_budget, resolve_budget

    with pytest.raises(InputError, match="keep_ratio=0.05 of the context's 13 sentence tokens keeps 0 tokens") as e:
        resolve_budget(None, 0.05, 13)
    # in the command line's words too (prune and ask printed "raise keep_ratio, or give budget_tokens")
    assert str(e.value).endswith(
        "raise keep_ratio (--keep-ratio) to at least 0.077, or give budget_tokens (--budget-tokens)"
    )
    assert resolve_budget(None, 0.077, 13) == (1, "keep_ratio")  # (the least it names keeps one token)
    check_budget(None, np.float32(0.5))  # "is outside (0, 1]" before
    assert resolve_budget(None, np.float32(0.5), 13) == (6, "keep_ratio")


@pytest.mark.parametrize(
    "option, message",
    [
        (dict(order="backward"), "order='backward' is not one of"),
        (dict(instruction="  "), "instruction is empty"),
        (dict(max_prompt_tokens=True), "max_prompt_tokens=True must be a positive integer"),
        (dict(dtype="float64"), "float64"),
    ],
)
def test_prune_options_are_refused_before_a_model_loads(option, message):
    from attnrank.prune.config import PruneConfig

    with pytest.raises(InputError, match=message):
        PruneConfig(**option)


def test_a_window_past_the_models_context_is_refused(llm):
    """The reranker refused it; the pruner scored at positions the model was never trained on."""
    from attnrank.prune.pruner import ContextPruner

    with pytest.raises(InputError, match=f"max_prompt_tokens=99999 exceeds the {llm.context_length}-token context"):
        ContextPruner(llm, max_prompt_tokens=99_999)


def test_a_huge_neighbours_count_selects_as_the_whole_passage_does_and_at_once():
    """The neighbour range was not clamped: neighbours=10**9 looped 2e9 times per sentence (a
    server request could stall its model worker for hours). A guard ends the call with a failure
    after 30 s, where the unclamped loop ran for hours (no speed is asserted: it takes microseconds)."""
    import signal

    from attnrank.prune.context import ScoredSentence, select

    def sentences():
        return [
            ScoredSentence(0, "a", 0, "One.", 0, 4, 4, 0.1),
            ScoredSentence(0, "a", 1, "Two.", 5, 9, 4, 0.9),
            ScoredSentence(0, "a", 2, "Three.", 10, 16, 4, 0.2),
            ScoredSentence(1, "b", 0, "Four.", 0, 5, 4, 0.3),
        ]

    def hung(signum, frame):
        raise AssertionError("select(neighbours=10**9) loops over sentences that do not exist")

    huge, whole = sentences(), sentences()
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    try:
        select(huge, 12, 10**9)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    select(whole, 12, 2)
    assert [s.kept for s in huge] == [s.kept for s in whole] == [True, True, True, False]


def test_a_window_past_the_models_context_is_refused_before_the_weights_load(tiny_dir, tmp_path):
    """Both were refused only after the weights had loaded: the config alone tells the context."""
    import shutil

    from attnrank.prune.pruner import ContextPruner
    from attnrank.rerank.attention import AttentionReranker

    config_only = tmp_path / "config-only"  # no weights: a load would fail with another error
    config_only.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        if (tiny_dir / name).exists():
            shutil.copy(tiny_dir / name, config_only / name)
    with pytest.raises(InputError, match=r"max_prompt_tokens=99999 exceeds the 16384-token context of .*config-only"):
        ContextPruner(str(config_only), max_prompt_tokens=99_999)
    with pytest.raises(InputError, match=r"max_prompt_tokens=99999 exceeds the 16384-token context of .*config-only"):
        AttentionReranker(str(config_only), None, signals=None, max_prompt_tokens=99_999)
