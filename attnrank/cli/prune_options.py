"""The pruning option group of ``attnrank prune``: one option per
:class:`~attnrank.prune.config.PruneConfig` field, named after it (as :mod:`attnrank.cli.options`
does for the reranker), handed to the command as one ``prune_config``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any, Optional

import typer

from ..errors import InputError
from ..prune.config import LENGTH_NORMS, PRUNE_METHODS, PruneConfig
from ..prune.segment import DEFAULT_MAX_WORDS
from ..rerank.config_checks import ORDERS
from . import _check_heads, check_prompt_window
from .options import MODEL_RUN_OPTIONS, option_group, refuse_unread_block_options

_OPTIONS: dict[str, tuple[Any, Any]] = {
    "model": (
        Optional[str],
        typer.Option(None, "--model", help="LLM: HF id, local path or .gguf (default: packaged SmolLM2-135M)."),
    ),
    "heads": (
        Optional[str],
        typer.Option(None, "--heads", help="'all' (default), 'auto' (registered set), 'l-h,l-h' or a JSON head file."),
    ),
    "method": (
        Optional[str],
        typer.Option(
            None,
            "--method",
            help="query (default; ICR: query-span attention, N/A-calibrated) | focus (AttentionRAG: answer-hint "
            "token) | probe (learned sentence probe; it fixes the heads and length normalisation).",
        ),
    ),
    "calibrate": (
        Optional[bool],
        typer.Option(None, "--calibrate/--no-calibrate", help="Subtract the content-free 'N/A' query's attention."),
    ),
    "token_filter": (
        Optional[bool],
        typer.Option(None, "--token-filter/--no-token-filter", help="ICR's mean - 2 std filter per sentence."),
    ),
    "sink": (
        Optional[bool],
        typer.Option(None, "--sink/--no-sink", help="Sink filtering of the sentence rows (off by default)."),
    ),
    "length_norm": (
        Optional[str],
        typer.Option(
            None, "--length-norm", help=f"{' | '.join(LENGTH_NORMS)}: a sentence's score over sqrt(tokens), or not."
        ),
    ),
    "instruction": (
        Optional[str],
        typer.Option(None, "--instruction", help="Late instruction: qa (default) | ie | custom text."),
    ),
    "order": (Optional[str], typer.Option(None, "--order", help=f"Passage order in the prompt: {' | '.join(ORDERS)}.")),
    "focus_hint": (
        Optional[str],
        typer.Option(None, "--focus-hint", help="The answer hint of --method focus (default 'The answer is')."),
    ),
    "max_sentence_words": (
        Optional[int],
        typer.Option(
            None,
            "--max-sentence-words",
            min=1,
            help=f"Longer sentences are split (default {DEFAULT_MAX_WORDS} words; a run without spaces counts "
            "one word per 32 characters).",
        ),
    ),
    "max_prompt_tokens": (
        Optional[int],
        typer.Option(
            None,
            "--max-prompt-tokens",
            min=1,
            help="Tokens per prompt; a longer context is pruned in chunks (default: the model's context - 64, at "
            "most the positions its LongRoPE or dynamic-NTK frequencies keep one set for).",
        ),
    ),
    "attention": (
        Optional[str],
        typer.Option(None, "--attention", help="full (one causal prompt) | block (each passage encoded on its own)."),
    ),
    "block_positions": (
        Optional[str],
        typer.Option(None, "--block-positions", help="Block attention's positions: rotated | shared | sequential."),
    ),
    "state_cache_mb": (
        Optional[int],
        typer.Option(None, "--state-cache-mb", min=0, help="Memory for block attention's passage states, MB (256)."),
    ),
    **MODEL_RUN_OPTIONS,  # the reranker's: how the model runs
}


# Values of the options the probe fixes that say what it does anyway: it scores unfiltered (its
# heads and length normalisation are its own, whatever is named).
PROBE_OWN: dict[str, tuple[Any, ...]] = {"--token-filter": (False,)}


def check_method(method: str, fixed: dict[str, Any]) -> str:
    """``--method`` one of the pruning methods; with ``probe``, none of the options it fixes given
    (``fixed``: flag -> value, None where not given) but as the probe has them (:data:`PROBE_OWN`):
    the probe would ignore them."""
    if method not in PRUNE_METHODS:
        raise typer.BadParameter(f"--method {method!r} is not one of {', '.join(PRUNE_METHODS)}")
    for flag, value in fixed.items():
        # (what the probe does anyway, spelt out, is no option ignored: PruneConfig takes it too)
        if method == "probe" and value is not None and value not in PROBE_OWN.get(flag, ()):
            raise typer.BadParameter(
                f"--method probe scores sentences with the heads, length normalisation and unfiltered features its "
                f"probe was trained with, so {flag} {value!r} would be ignored; drop {flag} or use --method query|focus"
            )
    return method


# the pruner's Python names as flags: those ask has too (its --max-prompt-tokens sizes the
# reranker's prompts, not the pruner's), then prune's own
SHARED_PRUNE_FLAGS = (
    ("method='query' or 'focus'", "--method query or focus"),
    ("method='query'", "--method query"),
    ("method='focus'", "--method focus"),
    ("attention='full'", "--attention full"),
)
_PRUNE_FLAGS = (
    ("max_prompt_tokens=", "--max-prompt-tokens "),
    ("max_prompt_tokens", "--max-prompt-tokens"),
    ("max_sentence_words", "--max-sentence-words"),
    *SHARED_PRUNE_FLAGS,
    ("focus_hint", "--focus-hint"),
)


def prune_names(message: str, flags: tuple[tuple[str, str], ...] = _PRUNE_FLAGS) -> str:
    """``message`` (the pruner's refusal) with the option names ``flags`` give (prune's) for the
    library's arguments."""
    for name, option in flags:
        message = message.replace(name, option)
    return message


def build_prune_config(**given: Any) -> PruneConfig:
    """The pruner's configuration with every option the user gave (not None); a value it refuses
    is an option error (exit 2), named before the model loads."""
    overrides = {k: v for k, v in given.items() if v is not None}
    method = check_method(
        overrides.get("method", "query"),
        {
            "--heads": overrides.get("heads"),
            "--length-norm": overrides.get("length_norm"),
            "--token-filter": overrides.get("token_filter"),
        },
    )
    if "focus_hint" in overrides and method != "focus":
        raise typer.BadParameter(f"--focus-hint is the answer hint of --method focus, not {method}; drop it")
    defaults = {f.name: f.default for f in fields(PruneConfig)}  # a default spelled out changes nothing
    block = [
        f"--{k.replace('_', '-')}"
        for k in ("block_positions", "state_cache_mb")
        if overrides.get(k, defaults[k]) != defaults[k]
    ]
    refuse_unread_block_options(block, str(overrides.get("attention", "full")).strip().lower() == "block")
    _check_heads(overrides.get("heads"), model=overrides.get("model"))
    try:
        config = PruneConfig(**overrides)
    except InputError as e:  # (an option error, in prune's flags)
        raise typer.BadParameter(prune_names(str(e))) from None
    check_prompt_window(config.max_prompt_tokens, config.model)
    return config


def prune_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Give a Typer command the pruning options; it receives ``prune_config``."""
    return option_group(func, _OPTIONS, build_prune_config, "prune")
