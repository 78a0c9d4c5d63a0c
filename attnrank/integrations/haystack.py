"""Helpers of the Haystack 3 components (extra ``haystack``).

The components themselves live in the PEP 420 namespace package ``haystack_integrations``, as
official integrations do, because Haystack 3 only deserializes pipeline YAML whose component
types come from allowlisted modules (``haystack``, ``haystack_integrations``, ...):

- ``haystack_integrations.components.rankers.attnrank.AttnrankRanker``
- ``haystack_integrations.components.retrievers.attnrank.AttnrankRetriever``

This module converts documents and collects the reranker settings, which are kept as basic types
(str, int, float, bool, None, lists and dicts of them) so that ``to_dict``/``from_dict`` round-trip.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..errors import InputError, require

require("haystack", "haystack", "the attnrank Haystack components")

from haystack import Document as HSDocument

from ..rerank.config import RerankConfig
from ..types import Document, RankedResults, ScoredDocument
from .documents import check_top_n, framework_documents, keep_stages, meta_title, score_fields
from .shared import built_settings, resolved_settings

__all__ = ["from_index", "reranker_settings", "to_attnrank", "to_haystack"]

_BASIC = (str, int, float, bool, type(None))
# the components' own reranker parameters and their defaults
_OWN_DEFAULTS: dict[str, Any] = {"model": None, "heads": None, "scorer": None}


def _check_basic(name: str, value: Any) -> None:
    if isinstance(value, (list, tuple)):
        for v in value:
            _check_basic(name, v)
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_basic(f"{name}.{k}", v)
    elif not isinstance(value, _BASIC):
        raise InputError(
            f"{name}={value!r} is a {type(value).__name__}; Haystack components take basic types "
            "(str, int, float, bool, None, lists/dicts of them) so that pipelines serialize"
        )


def reranker_settings(
    model: str | None, heads: Any, scorer: str | None, extra: dict[str, Any] | None
) -> dict[str, Any]:
    """AttentionReranker keyword arguments from a component's basic-typed init parameters.

    ``extra`` (``reranker_kwargs``) may also carry ``model``, ``heads`` or ``scorer`` when the
    component's own parameter is left at its default; ``reweight`` may be a dict of
    :class:`~attnrank.rerank.reweight.Reweighting` fields."""
    extra = dict(extra or {})
    own: dict[str, Any] = {"model": model, "heads": heads, "scorer": scorer}
    for key, default in _OWN_DEFAULTS.items():
        if key not in extra:
            continue
        if own[key] != default and own[key] != extra[key]:
            raise InputError(
                f"reranker_kwargs[{key!r}]={extra[key]!r} contradicts {key}={own[key]!r}; "
                f"give {key} once, as the component's {key} parameter"
            )
        own[key] = extra.pop(key)
    settings = {**own, **extra}
    for key in ("heads", "scorer"):  # None: the preset's (heads: the fused weights', else the registered set, else all)
        if own[key] is None:
            del settings[key]
    for k, v in settings.items():
        _check_basic(k, v)
    built = built_settings(settings)  # YAML's [[layer, head], ...] as pairs, a reweight dict as Reweighting
    config = built.get("config")
    learned = (
        config.scorer == "learned"
        if isinstance(config, RerankConfig)
        else str(config or "").strip().lower() == "learned"
    )
    if own["scorer"] == "sum" and learned:
        # (saved, scorer "sum" reads back as the preset's: components saved before 2026-12-05 wrote it by
        # default; a configuration given as a dict was not looked into, and changed scorer on reload)
        raise InputError(
            "scorer='sum' with a learned-weights configuration (reranker_kwargs['config']) scores the plain head "
            "sum, not the learned weights; drop scorer, or use preset 'qrhead' for the head sum"
        )
    # the configuration they describe, built now (no model loads): a misspelt option was saved in the
    # pipeline's YAML and refused only at warm_up or the first run (the other adapters refuse it here)
    resolved_settings(built, RerankConfig)
    return built


def legacy_scorer(data: dict[str, Any]) -> dict[str, Any]:
    """A serialised component as its current ``__init__`` reads it: components saved before
    2026-12-05 wrote their default ``scorer="sum"``, which now counts as given (a saved retriever
    with ``rerank=False`` refused it, a saved ``reranker_kwargs`` preset "learned" scored the head
    sum): read as None, the preset's. That is "sum" for every preset but "learned", with which an
    explicit ``scorer="sum"`` is refused (:func:`reranker_settings`), so no component saved now
    changes on load."""
    params = data.get("init_parameters", {})
    if params.get("scorer") != "sum":
        return data
    return {**data, "init_parameters": {**params, "scorer": None}}


def check_top_k(top_k: Any) -> None:
    """``top_k``: None (keep all) or an integer >= 1 (:func:`~attnrank.integrations.documents.check_top_n`)."""
    check_top_n(top_k, "top_k")


def to_attnrank(documents: list[HSDocument]) -> list[Document] | list[ScoredDocument]:
    """Haystack documents -> attnrank documents keyed by input position (``meta["title"]`` = title;
    documents from the attnrank retriever keep their earlier stages' scores)."""
    documents = framework_documents(documents, HSDocument, "Haystack Document")
    out = []
    for i, d in enumerate(documents):  # (no content: no text, ranked after the others, rank_text_first)
        out.append(Document(str(i), d.content or "", meta_title(d.meta)))
    return keep_stages(out, [d.meta or {} for d in documents])


def to_haystack(res: RankedResults, documents: list[HSDocument]) -> list[HSDocument]:
    """Reranked results as copies of the input documents with ``score`` and the score fields in ``meta``."""
    return [
        replace(documents[int(r.id)], score=r.score, meta={**(documents[int(r.id)].meta or {}), **score_fields(r)})
        for r in res
    ]


def from_index(res: RankedResults) -> list[HSDocument]:
    """Index hits as Haystack documents (id, text, title and score fields in ``meta``)."""
    return [
        HSDocument(id=r.id, content=r.text, score=r.score, meta={**r.metadata, "title": r.title, **score_fields(r)})
        for r in res
    ]
