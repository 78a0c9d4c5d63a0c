"""The attention reranker's one configuration object, with named presets.

:class:`RerankConfig` holds every option of :class:`~attnrank.rerank.attention.AttentionReranker`
(:class:`~attnrank.prune.config.PruneConfig` does the same for the pruner); the Python API, :class:`~attnrank.pipeline.Pipeline`, the CLI's shared option group and any server or adapter
build their stage from one of these objects, so a setting has one name everywhere.

Presets (``RerankConfig.preset(name)``, CLI ``--preset NAME``):

- ``likelihood`` (**the default**): the candidates' BM25, dense cosine and the LLM's query
  likelihood given each (UPR, Sachan et al. EMNLP 2022; :mod:`attnrank.rerank.likelihood`),
  z-scored per query and summed with equal weights: nothing trained, no attention computed
  (``signals="likelihood"``; a user's weights trained by ``attnrank train`` replace the equal
  ones once registered).
  With the packaged 135M model it measured best of every configuration on the four datasets
  (nDCG@10 mean 0.6988, +1.4 points over ``signals`` and above it on each; +1.2 over ``fused``'s
  held-out mean; docs/results/likelihood.md), at one prompt per candidate through the whole model
  (0.9 s per query of 20 web passages, 2.9 s of 20 abstracts, on 2 CPU cores).
- ``signals``: the same without the likelihood, BM25 and dense cosine alone (``signals="only"``;
  :func:`~attnrank.rerank.fused.equal_weights`; a user's weights from ``attnrank train --preset
  signals`` replace it, else their fused weights' model without attention); loads no LLM: the fast choice (a ninth to a
  seventeenth of the default's time, 1.4 nDCG@10 points lower on the held-out mean).
- ``fused``: an attention score fused with the same signals (and first-stage rank) by the model's
  registered fused weights, else the packaged model's, falling back to those weights' model
  without attention where attention is not confident (weights with a gate; the packaged ones have
  none since 2026-12-04: with 400 SciFact queries in training, no gate scored best). Attention is block attention at shared
  positions (every passage encoded alone, at the same positions after the instruction, so no
  passage sits nearer the query than another; its states are reusable), read from the heads the
  weights were fitted to. Full-prompt attention mostly echoed the candidate's slot, and fused this
  way it scored lower held out (docs/benchmarks.md). It gains over ``signals`` on conversational
  data (LoCoMo); a user trains its weights on their own labelled queries with ``attnrank train
  --preset fused``.
- ``qrhead``: the model's registered retrieval-head set (QRHead's query-focused detection, Zhang
  et al. EMNLP 2025; ``heads="auto"``), calibrated ICR scoring, attention alone: the best of the
  attention-only presets held out. A model with no registered set falls back to all heads
  (``heads="auto-or-all"``), logged as a warning.
- ``icr``: every head of the model (ICR, Chen et al. ICLR 2025) — works for any model.
- ``learned``: the model's registered linear head weights (:mod:`attnrank.rerank.learned`).
- ``qrhead-sink``: ``qrhead`` plus sink filtering (:mod:`attnrank.rerank.reweight` step 1).

Overrides go after the preset: ``RerankConfig.preset("icr", max_doc_words=150)``. Attention
options given without a preset (``RerankConfig.preset(heads="all")``, ``AttentionReranker(heads=...)``,
CLI ``--heads`` alone) select ``fused``, the default with attention, except the passage cuts
``max_doc_words`` and ``max_doc_tokens``, which the default ``likelihood`` reads too; given at their
default values they choose nothing. With ``signals`` or ``likelihood`` named, options they do not
read are refused.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..config import check_flags
from ..errors import InputError
from ..llm.blocks import capture_name, check_attention_mode, check_positions
from ..llm.prompts import DEFAULT_MAX_DOC_WORDS, late_instruction
from ..llm.rows import QUERY_SPANS
from ..types import is_count
from .config_checks import (
    AUTO_OR_ALL,
    check_attention_inputs,
    check_fields,
    check_model_field,
    check_prompt_options,
    checked_likelihood_depth,
    store_precision_names,
)
from .config_fields import (
    ATTENTION_FIELDS,
    LIKELIHOOD_FIELDS,
    METHOD_FIELDS,
    PROMPT_FIELDS,
    SIGNALS_SETTINGS,
    computes_attention,
    method_of,
    plain_heads,
    reads_likelihood,
    signals_setting,
)
from .fused import SIGNALS_AUTO, SIGNALS_LIKELIHOOD, SIGNALS_ONLY, FusedWeights
from .reweight import Reweighting

logger = logging.getLogger(__name__)

SCORERS = ("sum", "learned")


@dataclass(frozen=True)
class RerankConfig:
    """Every option of attention reranking.

    ``model``: HF id, local folder or ``.gguf`` (None: the packaged SmolLM2-135M-Instruct).
    ``heads``: ``"all"`` (ICR), ``"auto"`` / ``"auto:METHOD"`` (registered set; error if none),
    ``"auto-or-all"`` (the heads the fused weights of ``signals`` record, else the registered set,
    else all heads), ``"l-h,l-h"`` or a JSON head file.
    ``scorer``: ``"sum"`` (sum over heads) or ``"learned"`` (registered weights; they fix heads,
    calibration and filter). ``calibrate``: subtract the content-free "N/A" query's attention.
    ``token_filter``: ICR's μ − 2σ token filter. ``query_span``: ``"full"`` or ``"last"``.
    ``reweight``: re-weighting steps (sink, IDF, entropy, slot correction; a Reweighting, or its fields as a dict) or None;
    ``slot_profile``: a profile JSON path or ``"auto"`` (needed by slot correction).
    ``instruction``: ``"ie"``, ``"qa"`` or custom text; ``order``: document order in the prompt.
    ``max_doc_words`` / ``max_doc_tokens``: per-passage truncation; ``max_prompt_tokens``: window
    size (None: :attr:`~attnrank.llm.models.LLM.prompt_budget`, the model's context minus 64).
    ``device``/``dtype``: where and how the LLM runs (``dtype="int8"``: CPU only, the decoder's
    linear layers in dynamic int8, :mod:`attnrank.llm.quantize`).
    ``attention``: ``"full"`` (one causal prompt) or ``"block"`` (passages encoded independently,
    :mod:`attnrank.llm.blocks`); ``block_positions``: ``"shared"``, ``"sequential"`` or ``"rotated"``;
    ``state_cache_mb``: in-memory budget of reusable passage states, block attention's and the
    query likelihood's (0: none; a passage seen by an earlier query then costs only the new query);
    any other value also keeps the candidates' dense vectors from query to query (a fixed number
    of them, :data:`~attnrank.rerank.signals.VECTOR_CACHE`; 0 keeps none);
    ``passage_states``: an index folder (or its ``passage_states`` folder) with states built by
    ``attnrank index --passage-states``.
    ``signals``: None (attention alone), ``"auto"`` (fuse attention with the candidates' BM25,
    dense and rank signals by the model's registered fused weights, else the packaged model's),
    ``"only"`` (the signals alone, no attention computed, so the attention fields must keep their
    defaults: a user's registered :class:`~attnrank.rerank.fused.SignalsWeights`, else their fused
    weights' model without attention, else equal weights over BM25 and dense,
    :func:`~attnrank.rerank.fused_resolve.signals_only`), ``"likelihood"`` (the same
    with the LLM's query likelihood, no attention: a user's registered
    :class:`~attnrank.rerank.fused.LikelihoodWeights`, else equal weights over BM25, dense and the
    likelihood, :func:`~attnrank.rerank.fused_resolve.likelihood_weights`) or a
    :class:`~attnrank.rerank.fused.FusedWeights` (one without the attention feature computes none).
    ``likelihood_depth``: where the query likelihood is fused without attention, how many of the
    candidates the other signals rank highest it scores (:mod:`attnrank.rerank.shortlist`; the
    rest follow them in the signals' order; None: every candidate).
    """

    model: str | None = None
    heads: Any = AUTO_OR_ALL  # str, (layer, head) pairs or None
    scorer: Any = "sum"  # "sum", "learned" or a LearnedHeadWeights
    calibrate: bool = True
    token_filter: bool = True
    query_span: str = "full"
    reweight: Reweighting | None = None
    slot_profile: Any = None  # None, "auto", a JSON path or a SlotProfile
    instruction: str = "ie"
    order: str = "reverse"
    max_doc_words: int | None = DEFAULT_MAX_DOC_WORDS
    max_doc_tokens: int | None = None
    max_prompt_tokens: int | None = None
    device: str = "cpu"
    dtype: str = "auto"
    attention: str = "full"
    block_positions: str = "rotated"
    state_cache_mb: int = 1024
    passage_states: str | None = None
    signals: Any = None  # None, "auto", "only", "likelihood" or a FusedWeights
    likelihood_depth: int | None = None
    name: str = field(default="custom", compare=False)  # the preset it came from

    def __post_init__(self) -> None:
        object.__setattr__(self, "heads", plain_heads(self.heads))
        if isinstance(self.reweight, Mapping):  # (as dataclasses.asdict or a JSON file gives it)
            check_fields(Reweighting, dict(self.reweight))
            object.__setattr__(self, "reweight", Reweighting(**self.reweight))
        check_flags(self, ("calibrate", "token_filter"))
        if isinstance(self.scorer, str) and self.scorer not in SCORERS:
            raise InputError(f"scorer={self.scorer!r} is not one of {SCORERS}")
        if self.query_span not in QUERY_SPANS:
            raise InputError(f"query_span={self.query_span!r} is not one of {QUERY_SPANS}")
        check_prompt_options(self.order, self.instruction)
        check_attention_mode(self.attention)
        check_positions(self.block_positions)
        check_model_field(self)
        store_precision_names(self)  # they also set the embedder's, with or without attention
        if not is_count(self.state_cache_mb, 0):
            raise InputError(f"state_cache_mb={self.state_cache_mb!r} must be an integer >= 0 (0: no state cache)")
        object.__setattr__(self, "state_cache_mb", int(self.state_cache_mb))  # a NumPy integer written as JSON
        if self.attention != "block" and self.passage_states is not None:
            raise InputError("passage_states are block-attention states; add attention='block' (--attention block)")
        if self.passage_states is not None and self.block_positions == "sequential":
            raise InputError(
                "passage_states hold states at shared block positions ('shared' or 'rotated'); drop "
                "block_positions='sequential' (--block-positions) or passage_states"
            )
        object.__setattr__(self, "signals", signals_setting(self.signals))
        if self.signals not in SIGNALS_SETTINGS and not isinstance(self.signals, FusedWeights):
            raise InputError(
                f"signals={self.signals!r} is not 'auto', 'only', 'likelihood', None or FusedWeights "
                "(--signals auto|only|likelihood|none)"
            )
        if not self.uses_attention:
            self._check_no_attention_options()
        depth = checked_likelihood_depth(
            self.likelihood_depth, self.uses_likelihood and not self.uses_attention, self.name
        )
        object.__setattr__(self, "likelihood_depth", depth)
        # 0, keep nothing, is always allowed (a batch's actors set it for every preset)
        if self.state_cache_mb not in (0, type(self).state_cache_mb) and not self.reads_state_cache:
            raise InputError(
                f"state_cache_mb={self.state_cache_mb} sizes passage states and vectors that this reranker (attention "
                f"alone, attention={self.attention!r}) never keeps; add attention='block' (--attention block), or "
                "drop state_cache_mb"
            )
        for key in ("max_doc_words", "max_doc_tokens", "max_prompt_tokens"):
            value = getattr(self, key)
            if value is not None and not is_count(value):
                raise InputError(f"{key}={value!r} must be a positive integer or None (no limit)")
            object.__setattr__(self, key, None if value is None else int(value))
        if self.scorer != "sum" and self.signals is not None and self.uses_attention:
            # fused weights were fitted to the summed attention of their heads: the learned score
            # would silently take that feature's place
            raise InputError(
                "scorer='learned' scores attention alone (preset learned), and the fused weights of "
                f"signals={self.signals if isinstance(self.signals, str) else 'FusedWeights'!r} read the heads' summed "
                "attention; drop the scorer (--scorer), or use signals=None (--signals none)"
            )
        if self.scorer != "sum" and self.heads not in (None, AUTO_OR_ALL):
            raise InputError(f"scorer='learned' reads the heads its weights were trained on; drop heads={self.heads!r}")
        check_attention_inputs(self.heads, self.reweight, self.slot_profile)
        shared = self.attention == "block" and self.block_positions == "shared"
        if shared and self.reweight is not None and self.reweight.slot_correction:
            # (a full prompt's profile, subtracted: the passage placed last gained about 0.1 in the shipped one)
            raise InputError(
                "reweight slot correction (--reweight slot) removes the bias of a passage's place in the prompt, which "
                "block attention at shared positions does not have (every passage at the same positions); drop it, "
                "or use block_positions='rotated' / attention='full'"
            )
        if self.scorer != "sum" and self.reweight is not None:  # the learned scorer reads plain head scores
            raise InputError(
                "scorer='learned' scores the heads' plain calibrated passage scores, so reweight= would not "
                "be applied; drop reweight (--reweight none) or use scorer='sum'"
            )

    def prompt_settings(self) -> dict[str, Any]:
        """The settings of :data:`~attnrank.rerank.config_fields.PROMPT_FIELDS` (how the attention
        prompt is built and read), as weights fitted to its scores record them; the instruction as
        the text the prompt holds (``"ie"``, ``"IE"`` and that text build one prompt)."""
        settings = {name: getattr(self, name) for name in PROMPT_FIELDS}
        settings["instruction"] = late_instruction(self.instruction)
        return settings

    @property
    def prompt_kw(self) -> dict[str, Any]:
        """The arguments the attention prompts are built with (:func:`~attnrank.llm.prompts.build_rerank_prompts`,
        :func:`~attnrank.llm.blocks.build_block_prompts`)."""
        return dict(
            instruction=self.instruction,
            order=self.order,
            max_doc_words=self.max_doc_words,
            max_doc_tokens=self.max_doc_tokens,
        )

    @property
    def block_positions_read(self) -> str | None:
        """The block position scheme with block attention; None with the full prompt."""
        return self.block_positions if self.attention == "block" else None

    @property
    def capture(self) -> str:
        """How attention is captured, as one name (:func:`~attnrank.llm.blocks.capture_name`)."""
        return capture_name(self.attention, self.block_positions)

    @property
    def uses_attention(self) -> bool:
        """Whether reranking computes attention (False: the fused signals alone, with the query
        likelihood where the weights read it: :attr:`uses_llm`)."""
        return computes_attention(self.signals)

    @property
    def uses_llm(self) -> bool:
        """Whether reranking runs the LLM: for attention, or for the query likelihood."""
        return self.uses_attention or self.uses_likelihood

    @property
    def uses_likelihood(self) -> bool:
        """Whether the fused weights read the LLM's query likelihood (:mod:`attnrank.rerank.likelihood`)."""
        return reads_likelihood(self.signals)

    @property
    def reads_state_cache(self) -> bool:
        """Whether ``state_cache_mb`` sizes anything: block attention's passage states, the
        likelihood's prompt states, or the candidates' vectors the signals keep."""
        return self.attention == "block" or self.uses_likelihood or self.signals is not None

    def attention_options(self) -> list[str]:
        """The attention fields set to other than their defaults that this configuration would not
        read (what ``signals="only"`` and ``"likelihood"`` refuse; the query likelihood reads the passage cuts)."""
        defaults = field_defaults()
        read = LIKELIHOOD_FIELDS if self.uses_likelihood else ()
        return [k for k in ATTENTION_FIELDS if k not in read and getattr(self, k) != defaults[k]]

    def _check_no_attention_options(self) -> None:
        given = self.attention_options()
        if given:
            shown = [f"{k}={v!r}" if isinstance(v := getattr(self, k), (str, int, type(None))) else k for k in given]
            raise InputError(
                f"{', '.join(shown)} configure(s) attention, which signals="
                f"{self.signals if isinstance(self.signals, str) else 'FusedWeights without attention'} "
                "does not compute; drop them, or choose a preset with attention (config='fused' to fuse it with "
                "the signals, 'qrhead' or 'icr' for attention alone)"
            )

    @classmethod
    def preset(cls, name: str = "", **overrides: Any) -> RerankConfig:
        """The named preset with ``overrides`` applied; unnamed, :func:`preset_for` chooses it."""
        return RERANK_PRESETS[preset_for(name, overrides)].with_options(**overrides)

    def with_options(self, **overrides: Any) -> RerankConfig:
        """A copy with ``overrides`` (field names; an unknown name is an error naming the fields).
        Overrides that turn attention off (``signals="only"`` or ``"likelihood"``) also reset the attention fields this
        configuration set (e.g. preset ``fused``'s block attention) and they did not give: nothing
        would read them; attention fields they do give are refused. Overrides that turn attention on
        where this configuration computes none (``signals="auto"`` on preset ``likelihood``) take the
        attention fields they and it did not set from the preset :func:`preset_for` picks for them, as
        with no preset (:data:`ATTENTION_PRESET` for ``signals="auto"``).
        Overrides of what it computes
        (:data:`~attnrank.rerank.config_fields.METHOD_FIELDS`) name the copy for what it now
        computes (run tags, ``repr``): the preset whose method it has (``--preset qrhead --heads all`` is ``icr``;
        ``preset("likelihood", signals="only")`` is ``signals``, which the command line refuses as ``--preset
        likelihood --signals only``: give ``--preset signals``), else this preset's name and the fields that
        differ from it (``fused+heads``), or ``custom`` (another ``signals``, no preset's). Other
        ``block_positions`` where attention is read from the full prompt are refused: nothing would
        read them."""
        check_fields(type(self), overrides)
        if not overrides:
            return self
        positions = overrides.get("block_positions")  # as the caller gave them, before any reset
        previous = self.name  # what the copy is named from (the preset it stands for)
        if "signals" in overrides and not computes_attention(overrides["signals"]):
            defaults = field_defaults()
            # the passage cuts stay for a setting that reads the likelihood (its prompts cut them)
            kept = LIKELIHOOD_FIELDS if reads_likelihood(signals_setting(overrides["signals"])) else ()
            reset = {k: defaults[k] for k in ATTENTION_FIELDS if k not in kept}
            overrides = {**reset, **overrides}
        elif "signals" in overrides and computes_attention(overrides["signals"]) and not self.uses_attention:
            # attention switched on where none was computed: captured as with no preset (fused with the signals:
            # the default with attention, as its weights were fitted; alone: qrhead's); --preset likelihood
            # --signals auto read the full prompt at rotated positions, preset fused's weights beside it (the
            # fields this configuration set are kept)
            defaults, previous = field_defaults(), preset_for("", overrides)
            base = RERANK_PRESETS[previous]
            taken = {
                k: getattr(base, k) for k in ATTENTION_FIELDS if k not in overrides and getattr(self, k) == defaults[k]
            }
            if overrides.get("attention", base.attention) != "block":  # (positions nothing reads, kept for later)
                taken.pop("block_positions", None)
            overrides = {**taken, **overrides}
        out = replace(self, **overrides)
        # (refused where given other than the default: a preset's own positions carried into the full
        # prompt, or the default spelled out, change nothing)
        unread = positions is not None and positions != field_defaults()["block_positions"]
        if unread and out.uses_attention and out.attention != "block":
            raise InputError(
                f"block_positions={out.block_positions!r} is read by block attention only, and this reranker "
                f"reads attention={out.attention!r}; add attention='block' (--attention block), or drop block_positions"
            )
        if "name" not in overrides and method_of(out) != method_of(self):  # (named as with no preset, where that chose)
            out = replace(out, name=_method_name(previous, out))
        return out


def _method_name(previous: str, out: RerankConfig) -> str:
    """The name of ``out`` (a copy of preset ``previous`` with options): see :meth:`RerankConfig.with_options`."""
    same = [n for n, p in RERANK_PRESETS.items() if method_of(p) == method_of(out)]
    if same:
        return previous if previous in same else same[0]
    base_name = previous.split("+")[0]  # (fused+heads: preset fused with other heads)
    base = RERANK_PRESETS.get(base_name)
    if base is None or method_of(base)[0] != method_of(out)[0]:  # (another fusion is another method)
        return "custom"
    differ = [f for f, a, b in zip(METHOD_FIELDS, method_of(base), method_of(out)) if a != b and f != "block_positions"]
    if out.attention == "block" and out.block_positions != base.block_positions:  # (named where blocks are read)
        differ.append("block_positions")
    return "+".join([base_name, *differ])


def field_defaults() -> dict[str, Any]:
    """Every :class:`RerankConfig` field's default value, by name."""
    return {f.name: f.default for f in fields(RerankConfig)}


def preset_for(name: str | None, overrides: dict[str, Any]) -> str:
    """The preset ``name`` (checked), or for no name :data:`DEFAULT_PRESET`, except when
    ``overrides`` say otherwise: ``signals=None`` (attention alone) is ``qrhead``, ``signals="only"``
    is ``signals``, ``signals="likelihood"`` is ``likelihood`` (and weights without attention the
    one of those two whose features they read); fusing attention with the signals (``signals="auto"`` or fused weights with
    attention), or attention options the default does not read (heads, scorer, reweight, ...)
    without ``signals``, select :data:`ATTENTION_PRESET`, the default with attention, which
    captures attention as its weights were fitted to it (logged); a learned ``scorer`` without
    ``signals`` selects ``learned``, as ``--preset learned`` does."""
    chosen = (name or "").strip().lower()
    if chosen:
        if chosen not in RERANK_PRESETS:
            raise InputError(f"preset {chosen!r} is not one of {sorted(RERANK_PRESETS)}")
        return chosen
    read = LIKELIHOOD_FIELDS if RERANK_PRESETS[DEFAULT_PRESET].uses_likelihood else ()
    if "heads" in overrides:
        overrides = {**overrides, "heads": plain_heads(overrides["heads"])}
    defaults = field_defaults()  # a default spelled out chooses nothing
    given = [k for k in overrides if k in ATTENTION_FIELDS and k not in read and overrides[k] != defaults[k]]
    if "signals" in overrides:
        signals = signals_setting(overrides["signals"])
        if signals is None:  # attention alone: the preset of the default fields
            return ATTENTION_ALONE_PRESET
        if signals == SIGNALS_ONLY:
            return SIGNALS_PRESET
        if signals == SIGNALS_LIKELIHOOD:
            return LIKELIHOOD_PRESET
        if isinstance(signals, FusedWeights) and not signals.uses_attention:  # named by what they read
            return LIKELIHOOD_PRESET if reads_likelihood(signals) else SIGNALS_PRESET
        given = ["signals", *given] if computes_attention(signals) else []
    if given and "signals" not in given and overrides.get("scorer", "sum") != "sum":
        # learned head weights score attention alone, as captured for them (preset learned): fused
        # with the signals at block positions they would read a capture they were not trained on
        return "learned"
    if given:
        logger.info(
            "option(s) %s without a preset: preset %r, the default with attention (the default, %r, computes none)",
            given,
            ATTENTION_PRESET,
            DEFAULT_PRESET,
        )
        return ATTENTION_PRESET
    return DEFAULT_PRESET


RERANK_PRESETS: dict[str, RerankConfig] = {
    "qrhead": RerankConfig(heads=AUTO_OR_ALL, name="qrhead"),
    "icr": RerankConfig(heads="all", name="icr"),
    "learned": RerankConfig(heads=None, scorer="learned", name="learned"),
    "qrhead-sink": RerankConfig(heads=AUTO_OR_ALL, reweight=Reweighting(sink=True), name="qrhead-sink"),
    "fused": RerankConfig(
        heads=AUTO_OR_ALL, signals=SIGNALS_AUTO, attention="block", block_positions="shared", name="fused"
    ),
    "signals": RerankConfig(signals=SIGNALS_ONLY, name="signals"),
    "likelihood": RerankConfig(signals=SIGNALS_LIKELIHOOD, name="likelihood"),
}
DEFAULT_PRESET = "likelihood"
LIKELIHOOD_PRESET = "likelihood"  # signals="likelihood" without a preset
SIGNALS_PRESET = "signals"  # signals="only" without a preset
ATTENTION_ALONE_PRESET = "qrhead"  # signals=None without a preset: every other field at its default
ATTENTION_PRESET = "fused"  # an unnamed configuration with attention options (see preset_for)
