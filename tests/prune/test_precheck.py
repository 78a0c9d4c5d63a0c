"""A pruning budget below every sentence, refused with the tokenizer alone before the model loads
(attnrank.prune.precheck), exactly where the loaded pruner refuses it."""

from __future__ import annotations

import json

import pytest

from attnrank.errors import InputError
from attnrank.prune.config import PruneConfig
from attnrank.prune.precheck import check_budget_fits
from attnrank.types import Document

DOCS = [
    Document(id="a", text="Vitamin D is made in the skin. It helps bones grow strong and keeps teeth healthy."),
    Document(
        id="b", title="Sun", text="Sunlight on the skin starts it. Short walks at noon are enough for most people."
    ),
]
QUERY = "how does the body get vitamin D?"


def _loaded_refusal(config: PruneConfig, budget: int | None, ratio: float | None) -> str | None:
    """What the loaded pruner says of the same budget (None: it keeps a sentence)."""
    from attnrank.prune.pruner import ContextPruner

    pruned = ContextPruner(config=config).prune(QUERY, DOCS, budget_tokens=budget, keep_ratio=ratio)
    try:
        pruned.check_kept()
    except InputError as e:
        return str(e)
    return None


def _early_refusal(config: PruneConfig, budget: int | None, ratio: float | None) -> str | None:
    try:
        check_budget_fits(config, QUERY, DOCS, budget_tokens=budget, keep_ratio=ratio)
    except InputError as e:
        return str(e)
    return None


@pytest.mark.parametrize("method", ["query", "focus"])
def test_the_early_refusal_is_the_loaded_pruners_to_the_token(tiny_dir, method):
    config = PruneConfig(model=str(tiny_dir), heads="all", method=method)
    shortest = None
    for budget in range(1, 40):
        loaded = _loaded_refusal(config, budget, None)
        assert _early_refusal(config, budget, None) == loaded, budget
        if loaded is None and shortest is None:
            shortest = budget
    assert shortest is not None and shortest > 1  # (both sides were seen: refused, then kept)
    for ratio in (0.05, 0.1, 0.2, 0.5):
        assert _early_refusal(config, None, ratio) == _loaded_refusal(config, None, ratio), ratio


def test_what_the_pruner_would_plan_otherwise_is_left_to_it(tiny_dir):
    """Past one prompt (chunks may count a sentence otherwise) and block attention: no early refusal."""
    for config in (
        PruneConfig(model=str(tiny_dir), heads="all", max_prompt_tokens=300),  # (scored in 2 chunks)
        PruneConfig(model=str(tiny_dir), heads="all", attention="block"),
    ):
        assert _early_refusal(config, 1, None) is None


def test_prune_refuses_a_budget_below_every_sentence_before_the_model_loads(tmp_path, tiny_dir, monkeypatch):
    """It was refused only after the model had loaded (seconds; minutes for a large model)."""
    from typer.testing import CliRunner

    from attnrank.cli import app
    from attnrank.llm import models

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"_id": d.id, "title": d.title, "text": d.text}) + "\n" for d in DOCS))
    loads = []
    monkeypatch.setattr(models, "_load_cached", lambda *a: loads.append(a))
    r = CliRunner().invoke(
        app, ["prune", QUERY, "--corpus", str(corpus), "--model", str(tiny_dir), "--budget-tokens", "1", "-q"]
    )
    assert r.exit_code == 1 and "no sentence of the passages fits the budget of 1 tokens" in r.output + str(
        r.exception
    ), r.output
    assert loads == []


def test_the_early_check_leaves_the_warning_of_unusable_sentences_to_the_pruner(tiny_dir, caplog):
    """Metadata sentences not found in the text are warned of once, by the pruner, not twice."""
    config = PruneConfig(model=str(tiny_dir), heads="all")
    docs = [Document(id="m", text="One sentence here. Another one there.", metadata={"sentences": ["Not in it."]})]
    with caplog.at_level("WARNING", logger="attnrank.prune.segment"):
        check_budget_fits(config, QUERY, docs, budget_tokens=100, keep_ratio=None)
    assert "metadata sentences unusable" not in caplog.text
    from attnrank.prune.segment import document_sentences

    with caplog.at_level("WARNING", logger="attnrank.prune.segment"):
        document_sentences(docs, None, 64)
    assert "metadata sentences unusable" in caplog.text


def test_a_model_the_pruner_refuses_is_named_before_the_budget(tmp_path, tiny_dir):
    """The early check said "raise the budget" for a model (GPT-2's layout) whose pruner would have
    been refused anyway, before its load: the pruner's own refusals come first, as they do there."""
    import shutil

    from transformers import GPT2Config

    from attnrank.errors import AttnrankError

    gpt2 = tmp_path / "gpt2"
    GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=300).save_pretrained(gpt2)
    for name in tiny_dir.iterdir():
        if name.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            shutil.copy(name, gpt2 / name.name)
    with pytest.raises(AttnrankError) as refused:
        check_budget_fits(PruneConfig(model=str(gpt2), heads="all"), QUERY, DOCS, budget_tokens=1, keep_ratio=None)
    assert "budget" not in str(refused.value), refused.value
