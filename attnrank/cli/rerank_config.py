"""The configuration the reranking options build: :func:`build_rerank_config` applies the options
the user gave to the preset and refuses those it would ignore (:func:`check_attention_computed`);
where the command also prunes (``ask``, ``serve``), :func:`pruning_config` gives the pruner the
options it shares with the reranker (:data:`SHARED_WITH_PRUNING`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import typer

from ..errors import InputError
from ..prune.config import PruneConfig
from ..rerank.config import RERANK_PRESETS, RerankConfig, field_defaults, preset_for
from ..rerank.config_fields import ATTENTION_FIELDS, LIKELIHOOD_FIELDS, signals_setting
from ..rerank.reweight import Reweighting
from . import _check_heads, check_prompt_window, option_errors

REWEIGHT_STEPS = ("sink", "idf", "entropy", "slot")


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
# Of those, the fields a reranker without attention refuses: given there, they configure the pruner alone.
_PRUNER_ATTENTION = ("attention", "block_positions")


def pruning_config(rerank: RerankConfig, given: Iterable[str], **own: Any) -> PruneConfig:
    """The pruner's configuration beside ``rerank`` (``ask``, ``serve``): its model, device and
    dtype; ``--attention``, ``--block-positions`` and ``--state-cache-mb`` where the user gave
    them (``given``: the flags set), else the pruner's defaults; ``own``: the pruner's own options."""
    values = getattr(given, "values", {})  # (GivenOptions: what a reranker without attention does not hold)
    given = set(given)
    shared = {
        name: values[flag] if flag in values and flag in _PRUNING_WHEN_GIVEN else getattr(rerank, name)
        for flag, name in SHARED_WITH_PRUNING.items()
        if flag not in _PRUNING_WHEN_GIVEN or flag in given
    }
    if shared.get("attention", "full") != "block":  # the positions were the reranker's blocks' alone
        if "--block-positions" in given and not rerank.uses_attention:  # (and this reranker has none)
            raise typer.BadParameter(
                f"--block-positions configure(s) block attention, which neither the reranker (--preset "
                f"{rerank.name.split('+')[0]} computes no attention) nor the pruner (full attention) reads; add "
                "--attention block or drop it"
            )
        shared.pop("block_positions", None)
        shared.pop("state_cache_mb", None)  # (the reranker's cache: the likelihood or the signals read it)
    with option_errors():
        return PruneConfig(**shared, **own)


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


def _check_not_replaced(preset: str | None, signals: Any, config: RerankConfig) -> None:
    """Refuse ``--preset A --signals S`` that ranks as another preset, B, alone: nothing of A is read
    (``--preset icr --signals likelihood`` is preset ``likelihood``; the run was tagged so, but
    nothing said that the icr attention asked for was never computed)."""
    name = (preset or "").strip().lower()
    if not name or signals is None or config.name not in RERANK_PRESETS or config.name == name:
        return
    if name in RERANK_PRESETS and signals_setting(signals) == RERANK_PRESETS[name].signals:
        return  # (the preset's own setting, spelled out: another option made it the other preset, as without it)
    raise typer.BadParameter(
        f"--preset {name} with --signals {signals} ranks as preset {config.name}, and reads nothing of {name}; "
        f"give --preset {config.name} (without --signals), or drop --signals to rank with {name}"
    )


def build_rerank_config(preset: str | None = None, *, pruner_reads: bool = False, **given: Any) -> RerankConfig:
    """The preset with every option the user gave (not None) applied; ``pruner_reads``: the
    command also prunes, and its pruner reads ``--attention``, ``--block-positions`` and
    ``--state-cache-mb`` too (``ask``, ``serve``; :func:`pruning_config`)."""
    overrides = {k: v for k, v in given.items() if v is not None}
    if "reweight" in overrides:
        overrides["reweight"] = parse_reweight(overrides["reweight"])
    if "signals" in overrides:
        overrides["signals"] = signals_setting(overrides["signals"])
    if pruner_reads:  # attention options a reranker without attention would refuse: the pruner's alone
        with option_errors():
            reranker = chosen_preset(preset, overrides)
        if not reranker.uses_attention:
            overrides = {k: v for k, v in overrides.items() if k not in _PRUNER_ATTENTION}
    with option_errors():  # an option value the configuration refuses
        _check_heads(overrides.get("heads"), model=overrides.get("model"))
        check_attention_computed(preset, overrides)
        # (the positions and the state cache last: the configuration refuses them where nothing reads
        # them, the check below names the flags)
        chosen = preset_for(preset, overrides)  # (chosen with the positions: they select the attention preset)
        late = ("block_positions", "state_cache_mb")
        config = RerankConfig.preset(chosen, **{k: v for k, v in overrides.items() if k not in late})
    _check_not_replaced(preset, given.get("signals"), config)
    defaults = field_defaults()  # a default spelled out changes nothing
    changed = {k for k in ("block_positions", "state_cache_mb") if k in overrides and overrides[k] != defaults[k]}
    unread = ["--block-positions"] if "block_positions" in changed and config.attention != "block" else []
    # (0, keep nothing, allowed as in Python)
    if "state_cache_mb" in changed and overrides["state_cache_mb"] != 0 and not config.reads_state_cache:
        unread.append("--state-cache-mb")
    if unread and config.uses_attention:  # (a preset without attention: check_attention_computed named them)
        raise typer.BadParameter(
            f"{', '.join(unread)} configure(s) block attention's passage states, which --preset "
            f"{preset or config.name.split('+')[0]} with full attention does not use; add --attention block or drop them"
        )
    if any(k in overrides for k in late):
        with option_errors():
            config = config.with_options(**{k: overrides[k] for k in late if k in overrides})
    if config.uses_attention:  # (a window the reranker reads: past the model's context, before any load)
        check_prompt_window(config.max_prompt_tokens, config.model)
        _check_frame(config)
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


def _check_frame(config: RerankConfig) -> None:
    """A ``--max-prompt-tokens`` that no reranking prompt fits, with the model's tokenizer alone: an
    option error before the index loads and searches (it was found when the reranker was built)."""
    if config.max_prompt_tokens is None:
        return
    from ..rerank.resolve import check_window  # (torch: only where a window is given)

    try:
        check_window(config)
    except InputError as e:
        raise typer.BadParameter(str(e).replace("max_prompt_tokens=", "--max-prompt-tokens ", 1)) from None


def chosen_preset(preset: str | None, overrides: dict[str, Any]) -> RerankConfig:
    """The preset ``preset`` (or the one the options choose, :func:`~attnrank.rerank.config.preset_for`)
    with the ``signals`` given: what decides whether attention is computed."""
    signals = {k: v for k, v in overrides.items() if k == "signals"}
    return RERANK_PRESETS[preset_for(preset, overrides)].with_options(**signals)


def check_attention_computed(preset: str | None, overrides: dict[str, Any]) -> None:
    """Attention options (``overrides``: the flags given) on a configuration that computes no
    attention would be ignored: refused naming the flags, before the model loads. Without a
    preset, those given at other than their default values select ``fused``
    (:func:`~attnrank.rerank.config.preset_for`); one given at its default value selects nothing,
    so under the default preset it is refused too (``--attention full`` alone ran the default
    ``likelihood``, which computes no attention, as if it had been honoured). (Where the
    command's pruner reads ``--attention`` and ``--block-positions`` too, ``ask`` and ``serve``,
    :func:`build_rerank_config` gives them to the pruner alone beside such a reranker.)"""
    given = [k for k in overrides if k in ATTENTION_FIELDS]
    if not given:
        return
    signals = {k: v for k, v in overrides.items() if k == "signals"}
    config = chosen_preset(preset, overrides)
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
