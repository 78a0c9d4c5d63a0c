"""The reranking option group shared by ``rerank``, ``search``, ``ask`` and ``demo``.

:func:`rerank_options` adds the same options, with the same names, to every command that reranks,
and hands the command one :class:`~attnrank.rerank.config.RerankConfig` (argument
``rerank_config``): the preset (``--preset``, default ``likelihood``) with the options the user gave
applied on top. Each option is named after the :class:`RerankConfig` field it sets.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any, Optional

import typer

from ..prune.config import PruneConfig
from ..rerank.config import (
    ATTENTION_FIELDS,
    DEFAULT_PRESET,
    LIKELIHOOD_FIELDS,
    RERANK_PRESETS,
    SCORERS,
    RerankConfig,
    field_defaults,
    preset_for,
    signals_setting,
)
from ..rerank.reweight import Reweighting
from . import _check_heads, _setup, check_prompt_window, option_errors

DTYPE_HELP = (
    "Precision of the LLM, and on CPU of the candidates' embedder where the command embeds them (bfloat16 or "
    "float32): "
    "auto (CPU: bfloat16 with AMX or AVX-512 BF16, else float32; ATTNRANK_CPU_DTYPE overrides) | float32 | bfloat16 | "
    "float16 (GPU) | int8 (CPU: dynamic int8 linear layers)."
)

Dtype = typer.Option("auto", help=DTYPE_HELP)

REWEIGHT_STEPS = ("sink", "idf", "entropy", "slot")

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
            help="Memory for reusable passage states (block attention, query likelihood), MB (default 1024).",
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
    **MODEL_RUN_OPTIONS,
}


# Reranking options that also configure the pruner (the model and how it runs), flag -> PruneConfig field.
SHARED_WITH_PRUNING = {
    "--model": "model",
    "--device": "device",
    "--dtype": "dtype",
    "--attention": "attention",
    "--block-positions": "block_positions",
    "--state-cache-mb": "state_cache_mb",
}
# Of those, what the pruner reads only when given: a preset's block attention is the reranker's.
_PRUNING_WHEN_GIVEN = ("--attention", "--block-positions", "--state-cache-mb")


def pruning_config(rerank: RerankConfig, given: Iterable[str], **own: Any) -> PruneConfig:
    """The pruner's configuration beside ``rerank`` (``ask``, ``serve``): its model, device and
    dtype; ``--attention``, ``--block-positions`` and ``--state-cache-mb`` where the user gave
    them (``given``: the flags set), else the pruner's defaults; ``own``: the pruner's own options."""
    given = set(given)
    shared = {
        name: getattr(rerank, name)
        for flag, name in SHARED_WITH_PRUNING.items()
        if flag not in _PRUNING_WHEN_GIVEN or flag in given
    }
    if shared.get("attention", "full") != "block":  # the positions were the reranker's blocks' alone
        shared.pop("block_positions", None)
    with option_errors():
        return PruneConfig(**shared, **own)


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
    cannot be read is left to the load, which names it (this process loads it: no warning)."""
    from ..rerank.resolve import check_lookups  # (torch: only for commands that rerank)

    if config.uses_llm and _model_key(config.model) is not None:
        check_lookups(config)


def check_pruner_lookups(config: PruneConfig) -> None:
    """What a pruner of ``config`` reads from the head registry (its sentence probe, an ``auto``
    head set), looked up before anything loads (:func:`check_registered_heads`)."""
    from ..prune.probe import SentenceProbe

    if config.method == "probe":
        key = _model_key(config.model)
        if key is not None:
            SentenceProbe.load(*key)
        return
    check_registered_heads(config.model, config.heads)


def check_registered_heads(model: str | None, heads: Any) -> None:
    """An ``"auto"`` / ``"auto:METHOD"`` head spec's registered set, looked up by the model's id and
    fingerprint before anything loads (``"auto-or-all"`` falls back to every head; other specs
    read nothing); a model whose config cannot be read here is left to the load."""
    from ..registry import resolve_heads
    from ..rerank.resolve import ModelRef

    spec = heads.strip().lower() if isinstance(heads, str) else ""
    key = _model_key(model) if spec == "auto" or spec.startswith("auto:") else None
    if key is not None:
        resolve_heads(heads, ModelRef(*key))


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


def parse_reweight(text: str) -> Reweighting | None:
    """``--reweight sink,idf`` → :class:`Reweighting`; ``none`` → None."""
    steps = [s.strip().lower() for s in text.split(",") if s.strip()]
    if steps == ["none"]:
        return None
    bad = sorted(set(steps) - set(REWEIGHT_STEPS))
    if bad or not steps:
        raise typer.BadParameter(
            f"--reweight {text!r}: unknown step(s) {bad}; use a comma-separated subset of "
            f"{','.join(REWEIGHT_STEPS)} or 'none'"
        )
    return Reweighting(
        sink="sink" in steps, idf="idf" in steps, entropy="entropy" in steps, slot_correction="slot" in steps
    )


def build_rerank_config(preset: str | None = None, *, pruner_reads: bool = False, **given: Any) -> RerankConfig:
    """The preset with every option the user gave (not None) applied; ``pruner_reads``: the
    command also prunes, and its pruner reads :data:`PRUNER_SHARED` (``ask``, ``serve``)."""
    overrides = {k: v for k, v in given.items() if v is not None}
    if "reweight" in overrides:
        overrides["reweight"] = parse_reweight(overrides["reweight"])
    if "signals" in overrides:
        overrides["signals"] = signals_setting(overrides["signals"])
    with option_errors():  # an option value the configuration refuses
        _check_heads(overrides.get("heads"), model=overrides.get("model"))
        check_attention_computed(preset, overrides, pruner_reads)
        # (the positions last: the configuration refuses them without block attention, the check
        # below names the flags)
        chosen = preset_for(preset, overrides)  # (chosen with the positions: they select the attention preset)
        config = RerankConfig.preset(chosen, **{k: v for k, v in overrides.items() if k != "block_positions"})
    defaults = field_defaults()  # a default spelled out changes nothing
    changed = {k for k in ("block_positions", "state_cache_mb") if k in overrides and overrides[k] != defaults[k]}
    unread = ["--block-positions"] if "block_positions" in changed and config.attention != "block" else []
    # the state cache also keeps the candidates' vectors where the signals are read
    reads_cache = config.attention == "block" or config.uses_likelihood or config.signals is not None
    if "state_cache_mb" in changed and not reads_cache:
        unread.append("--state-cache-mb")
    if unread and config.uses_attention:  # (a preset without attention: check_attention_computed named them)
        raise typer.BadParameter(
            f"{', '.join(unread)} configure(s) block attention's passage states, which --preset "
            f"{preset or config.name.split('+')[0]} with full attention does not use; add --attention block or drop them"
        )
    if "block_positions" in overrides:
        with option_errors():
            config = config.with_options(block_positions=overrides["block_positions"])
    if config.uses_attention:  # (a window the reranker reads: past the model's context, before any load)
        check_prompt_window(config.max_prompt_tokens, config.model)
    fixed = [
        f"--{'' if v else 'no-'}{k.replace('_', '-')}"
        for k in ("calibrate", "token_filter")
        if (v := given.get(k)) is not None
    ]
    if config.scorer == "learned" and fixed:  # the weights fix them (AttentionReranker would ignore the options)
        raise typer.BadParameter(
            f"the learned scorer (--scorer learned, --preset learned) uses the calibration and token filter its "
            f"weights were trained with, so {', '.join(fixed)} would be ignored; drop it or use --scorer sum"
        )
    return config


# Reranking options the pruner reads too where a command prunes (one --attention for both stages):
# given at their default values they are not refused for a reranker that computes no attention.
PRUNER_SHARED = ("attention", "block_positions", "state_cache_mb")


def check_attention_computed(preset: str | None, overrides: dict[str, Any], pruner_reads: bool = False) -> None:
    """Attention options (``overrides``: the flags given) on a configuration that computes no
    attention would be ignored: refused naming the flags, before the model loads. Without a
    preset, those given at other than their default values select ``fused``
    (:func:`~attnrank.rerank.config.preset_for`); one given at its default value selects nothing,
    so under the default preset it is refused too (``--attention full`` alone ran the default
    ``likelihood``, which computes no attention, as if it had been honoured), except, where the
    command's pruner reads them too (``pruner_reads``: ``ask``, ``serve``), those of
    :data:`PRUNER_SHARED` at their defaults, which there configure the pruner alone."""
    defaults = field_defaults()
    shared = PRUNER_SHARED if pruner_reads else ()
    given = [k for k in overrides if k in ATTENTION_FIELDS and (k not in shared or overrides[k] != defaults[k])]
    if not given:
        return
    signals = {k: v for k, v in overrides.items() if k == "signals"}
    config = RERANK_PRESETS[preset_for(preset, overrides)].with_options(**signals)
    read = LIKELIHOOD_FIELDS if config.uses_likelihood else ()  # the query likelihood cuts passages too
    # (a switch named as typed: --no-calibrate, not --calibrate)
    flags = [f"--{'no-' if overrides[k] is False else ''}{k.replace('_', '-')}" for k in given if k not in read]
    if not flags or config.uses_attention:
        return
    what = f"--signals {signals['signals']}" if signals else f"--preset {config.name}"
    raise typer.BadParameter(
        f"{', '.join(flags)} configure(s) attention, which {what} does not compute (it fuses the candidates' "
        "BM25 and dense scores, with the query likelihood for likelihood); use --preset fused (attention fused "
        "with them) or --preset qrhead|icr|learned (attention alone), or drop them"
    )


def rerank_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Give a Typer command the shared reranking options; it receives ``rerank_config`` (and, if it
    takes ``rerank_given``, the flags the user set)."""
    return option_group(func, _OPTIONS, build_rerank_config, "rerank")


def rerank_and_prune_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """:func:`rerank_options` for a command whose pruner reads ``--attention``,
    ``--block-positions`` and ``--state-cache-mb`` too (``ask``, ``serve``)."""
    return option_group(func, _OPTIONS, functools.partial(build_rerank_config, pruner_reads=True), "rerank")


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
        if wants_given:
            kwargs[given_arg] = frozenset(f"--{n.replace('_', '-')}" for n, v in given.items() if v is not None)
        return func(*args, **kwargs)

    command.__signature__ = sig.replace(parameters=[*own, *added])  # type: ignore[attr-defined]
    return command
