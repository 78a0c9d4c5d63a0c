"""The pruning budget: what keep_ratio and budget_tokens resolve to."""

from __future__ import annotations

import pytest

from attnrank.errors import InputError


def test_a_keep_ratio_that_keeps_no_token_is_refused_and_numpy_ratios_are_numbers():
    import numpy as np

    from attnrank.prune.context import check_budget, resolve_budget

    with pytest.raises(InputError, match="keep_ratio=0.05 of the context's 13 sentence tokens keeps 0 tokens"):
        resolve_budget(None, 0.05, 13)
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
