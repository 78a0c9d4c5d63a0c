"""What a pruner looks up in the head registry (its sentence probe, an ``"auto"`` head set), found
before its model loads: :func:`check_pruner_lookups` (the pruner, ``Pipeline.from_model`` and the
CLI call it; the probe or set missing was named only after the load)."""

from __future__ import annotations

from ..errors import ModelError
from ..llm.modelconfig import check_attention_architecture
from ..llm.models import unloaded_model
from ..llm.tokenizers import load_tokenizer
from ..rerank.resolve import check_head_list, check_registered_heads
from .config import PruneConfig
from .planning import check_prune_frame
from .probe import SentenceProbe


def check_pruner_before_load(config: PruneConfig, *, probe_given: bool = False) -> None:
    """What a pruner of ``config`` checks before its model loads (:class:`ContextPruner` and
    ``Pipeline.from_model``, which builds it on the loaded model): its registry lookups
    (:func:`check_pruner_lookups`), explicit heads against the model's config, and a
    ``max_prompt_tokens`` no prompt fits, with the tokenizer alone."""
    check_pruner_lookups(config, probe_given=probe_given)
    check_attention_architecture(config.model)  # (GPT-2's layers: refused at the first prune, model loaded)
    check_head_list(config.heads, config.model)
    if config.max_prompt_tokens is not None:
        check_prune_frame(load_tokenizer(config.model), config, config.max_prompt_tokens)


def check_pruner_lookups(config: PruneConfig, *, probe_given: bool = False) -> None:
    """Look up, without loading the model, what a pruner of ``config`` reads from the head
    registry: its sentence probe (``method="probe"``, unless one is given: ``probe_given``), or a
    registered ``"auto"`` / ``"auto:METHOD"`` head set (``"auto-or-all"`` falls back to every head;
    other specs read nothing). A model whose config cannot be read here is left to the load, which
    names it."""
    if config.method != "probe":
        check_registered_heads(config.model, config.heads)
        return
    if probe_given:
        return
    try:
        key = unloaded_model(config.model)
    except ModelError:
        return
    SentenceProbe.load(*key)
