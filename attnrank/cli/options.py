"""The reranking option group shared by ``rerank``, ``search``, ``ask`` and ``demo``.

:func:`rerank_options` adds the same options, with the same names, to every command that reranks,
and hands the command one :class:`~attnrank.rerank.config.RerankConfig` (argument
``rerank_config``): the preset (``--preset``, default ``likelihood``) with the options the user gave
applied on top (:mod:`attnrank.cli.rerank_config` builds it). Each option is named after the
:class:`RerankConfig` field it sets. Beside it, the checks commands make of the options they were
given, before anything loads: options for a stage that does not run, and what a configuration
reads from the head registry.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any, Optional

import typer

from ..llm.rows import QUERY_SPANS
from ..prune.config import PruneConfig
from ..rerank.config import DEFAULT_PRESET, RERANK_PRESETS, SCORERS, RerankConfig
from ..rerank.config_checks import ORDERS
from . import _setup, named_preset
from .rerank_config import REWEIGHT_STEPS, build_rerank_config

DTYPE_HELP = (
    "Precision of the LLM, and on CPU of the candidates' embedder where the command embeds them (bfloat16 or "
    "float32): "
    "auto (CPU: bfloat16 with AMX or AVX-512 BF16, else float32; ATTNRANK_CPU_DTYPE overrides) | float32 | bfloat16 | "
    "float16 (GPU) | int8 (CPU: dynamic int8 linear layers)."
)

Dtype = typer.Option("auto", help=DTYPE_HELP)

INDEX_NAME_HELP = "Index name under ./indexes (or $ATTNRANK_INDEX_DIR)"  # (--index of every command that reads one)

# How the model runs: options of every command that loads it for reranking or pruning.
MODEL_RUN_OPTIONS: dict[str, tuple[Any, Any]] = {
    "device": (Optional[str], typer.Option(None, "--device", help="cpu | cuda | cuda:N | auto.")),
    "dtype": (Optional[str], typer.Option(None, "--dtype", help=DTYPE_HELP)),
}

_OPTIONS: dict[str, tuple[Any, Any]] = {
    "preset": (
        Optional[str],
        typer.Option(
            None,
            "--preset",
            callback=named_preset,
            help=f"Reranking preset: {' | '.join(RERANK_PRESETS)} (default: {DEFAULT_PRESET}: the candidates' BM25 "
            "and dense scores and the LLM's query likelihood given each (UPR), z-scored per query and summed, or "
            "weighed by your `attnrank train` weights, no attention; signals: BM25 and dense alone (or your registered weights), no LLM, fastest; fused: block "
            "attention from the heads its weights were fitted to, fused with them, also chosen when attention "
            "options come without a preset, except --scorer learned alone (learned) and --signals none (qrhead)). The "
            "options below override it.",
        ),
    ),
    "model": (
        Optional[str],
        typer.Option(
            None, "--model", help="LLM: HF id, local path or .gguf (default: packaged SmolLM2-135M-Instruct)."
        ),
    ),
    "heads": (
        Optional[str],
        typer.Option(
            None,
            "--heads",
            help="'all' (ICR), 'auto' (registered set), 'auto:METHOD', 'l-h,l-h' or a JSON head file (default: the "
            "heads the fused weights record, else the registered set, else all).",
        ),
    ),
    "scorer": (
        Optional[str],
        typer.Option(
            None, "--scorer", help=f"{' | '.join(SCORERS)}: sum over heads, or the model's registered learned weights."
        ),
    ),
    "calibrate": (
        Optional[bool],
        typer.Option(
            None, "--calibrate/--no-calibrate", help="Subtract the content-free 'N/A' query's attention (ICR)."
        ),
    ),
    "token_filter": (
        Optional[bool],
        typer.Option(None, "--token-filter/--no-token-filter", help="ICR's mean - 2 std token filter per passage."),
    ),
    "reweight": (
        Optional[str],
        typer.Option(
            None,
            "--reweight",
            help=f"Re-weighting steps, comma-separated: {','.join(REWEIGHT_STEPS)} "
            "(slot needs --slot-profile); 'none' for plain ICR.",
        ),
    ),
    "slot_profile": (
        Optional[str],
        typer.Option(
            None,
            "--slot-profile",
            help="Slot profile for --reweight slot: 'auto' (per window, the registered one closest to its size) or a JSON file.",
        ),
    ),
    "instruction": (
        Optional[str],
        typer.Option(None, "--instruction", help="Late instruction: ie | qa | custom text."),
    ),
    "order": (
        Optional[str],
        typer.Option(
            None,
            "--order",
            help=f"Passage order in the attention prompt: {' | '.join(ORDERS)} (default reverse: the best "
            "first-stage hit nearest the query).",
        ),
    ),
    "query_span": (
        Optional[str],
        typer.Option(
            None,
            "--query-span",
            help=f"Query rows whose attention is read: {' | '.join(QUERY_SPANS)} (default full).",
        ),
    ),
    "max_doc_words": (
        Optional[int],
        typer.Option(None, "--max-doc-words", min=1, help="Words kept per passage in the prompt (default 300)."),
    ),
    "max_doc_tokens": (
        Optional[int],
        typer.Option(
            None,
            "--max-doc-tokens",
            min=1,
            help="Tokens of each passage's text kept in the prompt, its title not counted (default: no limit).",
        ),
    ),
    "max_prompt_tokens": (
        Optional[int],
        typer.Option(
            None,
            "--max-prompt-tokens",
            min=1,
            help="Tokens per prompt window; more candidates are split over windows (default: the model's context - 64, "
            "at most the positions its LongRoPE or dynamic-NTK frequencies keep one set for).",
        ),
    ),
    "attention": (
        Optional[str],
        typer.Option(
            None,
            "--attention",
            help="full (one causal prompt) | block (passages encoded independently; their states are reused).",
        ),
    ),
    "block_positions": (
        Optional[str],
        typer.Option(
            None,
            "--block-positions",
            help="Block positions: shared (preset fused's: every passage at the same positions after the instruction) "
            "| rotated (the other presets'; keys moved to their prompt positions) | sequential.",
        ),
    ),
    "state_cache_mb": (
        Optional[int],
        typer.Option(
            None,
            "--state-cache-mb",
            min=0,
            help="Memory for reusable passage states (block attention, query likelihood), MB (default 1024); "
            "0 keeps nothing between queries (the candidates' vectors neither, whose cache is not sized by it).",
        ),
    ),
    "passage_states": (
        Optional[str],
        typer.Option(
            None, "--passage-states", help="Index folder with passage states (attnrank index --passage-states)."
        ),
    ),
    "signals": (
        Optional[str],
        typer.Option(
            None,
            "--signals",
            help="auto (fuse attention with the candidates' BM25, dense and rank scores: registered fused weights) "
            "| only (no attention: BM25 and dense with equal weights, or your train --preset signals weights, else "
            "your fused weights' model without attention) "
            "| likelihood (only's signals and the LLM's query likelihood, equal weights or your registered "
            "likelihood weights) | none (attention alone).",
        ),
    ),
    "likelihood_depth": (
        Optional[int],
        typer.Option(
            None,
            "--likelihood-depth",
            min=1,
            help="With the query likelihood (preset likelihood): score only this many candidates, those BM25 and "
            "dense rank highest, the rest following in their order (default: every candidate).",
        ),
    ),
    **MODEL_RUN_OPTIONS,
}


# How much of each passage the prompt keeps: also options of the commands that read attention for
# training (heads detect, heads train), named as the reranker's, whose windows their advice names.
MaxDocWords = _OPTIONS["max_doc_words"][1]
MaxDocTokens = _OPTIONS["max_doc_tokens"][1]


def truncation(max_doc_words: int | None, max_doc_tokens: int | None) -> dict[str, int]:
    """The reranker options of ``--max-doc-words`` / ``--max-doc-tokens`` that were given (the
    others keep the preset's)."""
    given = {"max_doc_words": max_doc_words, "max_doc_tokens": max_doc_tokens}
    return {k: v for k, v in given.items() if v is not None}


def refuse_unread_block_options(given: Iterable[str], read: bool) -> None:
    """``--block-positions``/``--state-cache-mb`` given (``given``: the flags set) where no stage
    that runs reads them (``read`` False) would size nothing: refused."""
    unread = sorted({"--block-positions", "--state-cache-mb"} & set(given))
    if unread and not read:
        raise typer.BadParameter(
            f"{', '.join(unread)} configure(s) block attention's passage states, which no stage that runs here "
            "uses; add --attention block or drop them"
        )


def check_registry_lookups(config: RerankConfig) -> None:
    """What a reranker of ``config`` reads from the head registry (learned or fused weights, an
    ``auto`` head set), looked up by the model's id and fingerprint before anything loads: a
    missing one is named now, not after the index and the model have loaded. A model whose config
    cannot be read is left to the load, which names it after the command's own input is checked
    (:func:`check_model_readable` names it before an index loads)."""
    from ..rerank.resolve import check_lookups  # (torch: only for commands that rerank)

    if config.uses_llm and _model_key(config.model) is not None:
        check_lookups(config)


def check_model_readable(model: str | None) -> None:
    """A model whose config cannot be read here, named before an index loads (and embeds, and
    searches): a mistyped --model was found only after the first stage had run."""
    from ..llm.models import readable_model

    readable_model(model)


def check_queries_fit(config: RerankConfig, queries: dict[str, str]) -> None:
    """:func:`attnrank.rerank.precheck.check_queries_before_load` (torch and the tokenizer: imported here only)."""
    from ..rerank.precheck import check_queries_before_load

    check_queries_before_load(config, queries)


def check_pruner_lookups(config: PruneConfig) -> None:
    """What a pruner of ``config`` reads from the head registry (its sentence probe, an ``auto``
    head set), looked up before anything loads (:func:`attnrank.prune.lookups.check_pruner_lookups`)."""
    from ..prune.lookups import check_pruner_lookups as lookups

    lookups(config)


def _model_key(model: str | None) -> tuple[str, str] | None:
    """The model's (id, fingerprint) read without loading it, or None where its config cannot be read."""
    from ..errors import ModelError
    from ..llm.models import unloaded_model

    try:
        return unloaded_model(model)
    except ModelError:
        return None


def refuse_without_rerank(given: Iterable[str]) -> None:
    """``search``/``batch``: reranking options ``given`` while ``--rerank`` is 0 would be ignored."""
    names = sorted(given)
    if names:
        raise typer.BadParameter(
            f"{', '.join(names)} configure(s) the attention reranker, which runs only with --rerank K; "
            "add --rerank K (the hits reranked) or drop them"
        )


def refuse_when_off(flag: str, stage: str, given: Iterable[str]) -> None:
    """Options ``given`` for a ``stage`` that ``flag`` (e.g. ``--no-rerank``) turns off would be ignored."""
    names = sorted(given)
    if names:
        raise typer.BadParameter(f"{flag} turns {stage} off, but {', '.join(names)} configure(s) it; drop one")


def check_k_within_depth(k: int, depth: int, what: str) -> None:
    """``-k`` results ``what`` (shown, kept) can come only from the ``--depth`` first-stage hits."""
    if k > depth:
        raise typer.BadParameter(
            f"-k {k} is more than --depth {depth}: only first-stage hits can be {what}; lower -k or raise --depth"
        )


def rerank_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Give a Typer command the shared reranking options; it receives ``rerank_config`` (and, if it
    takes ``rerank_given``, the flags the user set)."""
    return option_group(func, _OPTIONS, build_rerank_config, "rerank")


def rerank_and_prune_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """:func:`rerank_options` for a command whose pruner reads ``--attention``,
    ``--block-positions`` and ``--state-cache-mb`` too (``ask``, ``serve``)."""
    return option_group(func, _OPTIONS, functools.partial(build_rerank_config, pruner_reads=True), "rerank")


class GivenOptions(frozenset):
    """The flags a user set (a frozenset of their names, ``--attention``), with the values given
    (:attr:`values`, by flag): what a stage beside the configuration's own reads (``ask``'s pruner
    takes ``--attention block`` where the reranker computes no attention)."""

    values: dict[str, Any]

    def __new__(cls, values: dict[str, Any]) -> GivenOptions:
        self = super().__new__(cls, values)
        self.values = dict(values)
        return self


def _typed(name: str, value: Any, option: Any) -> str:
    """The flag of option ``name`` as the user typed it: ``--no-x`` for a ``--x/--no-x`` switch set off."""
    flag = name.replace("_", "-")
    switch = any(f"/--no-{flag}" in d for d in getattr(option, "param_decls", None) or ())
    return f"--no-{flag}" if switch and value is False else f"--{flag}"


def option_group(
    func: Callable[..., Any], options: dict[str, tuple[Any, Any]], build: Callable[..., Any], stage: str
) -> Callable[..., Any]:
    """``func`` as a Typer command that also takes ``options`` (name -> (annotation, typer option),
    each named after its configuration field) and receives ``{stage}_config``, the configuration
    ``build(**values)`` makes of them, and, if it takes ``{stage}_given``, the flags the user set
    (e.g. to refuse them when the stage is off)."""
    config_arg, given_arg = f"{stage}_config", f"{stage}_given"
    sig = inspect.signature(func)
    wants_given = given_arg in sig.parameters
    own = [p for p in sig.parameters.values() if p.name not in (config_arg, given_arg)]
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation)
        for name, (annotation, option) in options.items()
    ]

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        given = {name: kwargs.pop(name) for name in options}
        if "verbose" in kwargs:  # building the configuration logs its choices (a preset picked by options)
            _setup(bool(kwargs.get("quiet", False)), bool(kwargs["verbose"]))
        kwargs[config_arg] = build(**given)
        if wants_given:  # (each flag as typed: "--no-calibrate" where it was, not "--calibrate")
            kwargs[given_arg] = GivenOptions(
                {_typed(n, v, options[n][1]): v for n, v in given.items() if v is not None}
            )
        return func(*args, **kwargs)

    command.__signature__ = sig.replace(parameters=[*own, *added])  # type: ignore[attr-defined]
    return command
