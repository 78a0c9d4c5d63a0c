"""What every framework adapter shares: one reranker/pruner/index per configuration, and the
conversion of attnrank results into the score fields the frameworks expect.

:func:`shared_reranker` / :func:`shared_pruner` return the object passed in, or build one from
the constructor's keyword arguments and keep it in a process-wide cache keyed by those
arguments, so that a LangChain compressor, a LlamaIndex postprocessor and a Haystack ranker
built with the same settings use the same object and one loaded model
(:func:`attnrank.llm.models.load_llm` additionally caches the model per name/dtype/device).
"""

from __future__ import annotations

import json
import os
import threading
import weakref
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..llm.models import check_model_arg
from ..llm.recording import forward_lock
from ..pipeline.checks import check_stage
from ..prune.config import PruneConfig
from ..rerank.config import RerankConfig
from ..rerank.config_checks import check_fields
from ..rerank.reweight import Reweighting

_LOCK = threading.Lock()  # guards the three dicts below, never held while anything is built
_CACHE: dict[tuple[str, str], Any] = {}
# rerankers made for an index object the caller loaded or built (not one of _CACHE's loads): kept
# while an adapter holds them, so the index goes with its last adapter (kept here for good, every
# index a long process built per session stayed in memory)
_HELD: weakref.WeakValueDictionary[tuple[str, str], Any] = weakref.WeakValueDictionary()
# the index each reranker was made for, held as long as the reranker lives (a reranker that reads
# no vectors from it holds no reference of its own): the index's id in the reranker's key then
# names no other object
_INDEX_OF: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_BUILDING: dict[tuple[str, str], threading.Lock] = {}
# what built each shared object: an index's folder, a reranker's keyword arguments (what a pickled
# adapter holding them is rebuilt from, :func:`source_of`)
_SOURCES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _key(kind: str, kwargs: Mapping[str, Any]) -> tuple[str, str]:
    try:
        return kind, json.dumps(kwargs, sort_keys=True, default=_unhashable)
    except TypeError as e:
        raise InputError(
            f"{kind} settings {dict(kwargs)!r} cannot be shared: {e}; pass a built "
            f"{kind} object instead of its settings"
        ) from e


def _unhashable(value: Any) -> Any:
    if isinstance(value, (tuple, set, frozenset)):
        return sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    if isinstance(value, Path):
        return str(value)
    # objects (an LLM, LearnedHeadWeights, ...) are keyed by identity: same object, same reranker
    return f"<{type(value).__name__} at {id(value):#x}>"


def resolved_settings(kwargs: Mapping[str, Any], kind: type) -> dict[str, Any]:
    """The constructor arguments resolved to the one configuration object they describe (a
    preset plus overrides: ``heads=None`` given or not, spelled out or left to the preset, is the
    same configuration and must share the same object). Unknown options raise naming them."""
    opts = dict(kwargs)
    model, config = opts.pop("model", None), opts.pop("config", None)
    check_model_arg(model)  # (any other object was keyed as one and built as the default model)
    if isinstance(model, os.PathLike):  # a model folder as a path object: the same model as its str
        model = os.fspath(model)
    # (a probe is the pruner's: given to a reranker it was passed here, and refused after the index loaded)
    own = ("show_progress", "probe") if kind is PruneConfig else ("show_progress",)
    extra: dict[str, Any] = {k: opts.pop(k) for k in own if k in opts}
    if isinstance(model, str):
        opts["model"] = model
    # anything else would be keyed, and built, as the default configuration: a wrong stage, silently
    allowed = (kind, str, type(None)) if kind is RerankConfig else (kind, type(None))
    if not isinstance(config, allowed):
        names = "a RerankConfig or a preset name" if kind is RerankConfig else "a PruneConfig"
        raise InputError(f"config={config!r} is not {names}; pass one (or None for the defaults)")
    cfg: RerankConfig | PruneConfig
    if kind is RerankConfig:  # as AttentionReranker: the options take part in choosing an unnamed preset
        cfg = (
            config.with_options(**opts)
            if isinstance(config, RerankConfig)
            else RerankConfig.preset(str(config or ""), **opts)
        )
    else:
        cfg = (config if isinstance(config, PruneConfig) else PruneConfig()).with_options(**opts)
    values = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.compare}
    if is_dataclass(values.get("reweight")):
        values["reweight"] = asdict(values["reweight"])
    return {**values, **extra, "llm": None if model is None or isinstance(model, str) else model}


def _cached(kind: str, kwargs: Mapping[str, Any], build, store: Any = _CACHE):
    """The object built for ``kwargs``, built once per configuration even when adapters are
    created concurrently, kept in ``store`` (:data:`_CACHE`, or :data:`_HELD` for as long as
    someone holds it). Why a lock per configuration: a build loads a model or an index
    (minutes), and one lock for all held other configurations' builds and lookups that long."""
    key = _key(kind, kwargs)
    with _LOCK:
        found = store.get(key)  # (get: a weak entry may go between a membership test and a read)
        if found is not None:
            return found
        building = _BUILDING.setdefault(key, threading.Lock())
    with building:
        with _LOCK:
            found = store.get(key)  # built by the thread this one waited for
            if found is not None:
                return found
        built = build()  # a failed build leaves its lock: the next tries wait for each other, never build twice
        with _LOCK:
            store[key] = built
            _BUILDING.pop(key, None)
        return built


# What other libraries call a count of results: given to an adapter whose count is named otherwise,
# each was refused as an unknown reranker setting, in a list of RerankConfig fields without a count.
_COUNT_NAMES = ("top_k", "top_n", "k", "similarity_top_k", "search_kwargs")


def check_count_name(settings: Mapping[str, Any], adapter: str, count: str) -> None:
    """Refuse another library's name of the number of results among an ``adapter``'s ``settings``
    (its own is ``count``), naming the one it takes."""
    other = next((n for n in _COUNT_NAMES if n in settings and n != count), None)
    if other is not None:
        raise InputError(f"{adapter} takes no {other}=; the number of results it returns is {count}=")


def check_reranker_settings(reranker: Any = None, **kwargs: Any) -> dict[str, Any] | None:
    """What :func:`shared_reranker` refuses of its arguments (a reranker object beside settings; an
    unknown or invalid setting), found without loading anything: a retriever adapter checks them
    before it loads its index (a misspelt ``top_n=`` was found after the index had loaded).
    Returns the resolved settings (None for a given reranker)."""
    if reranker is not None:
        if kwargs:
            raise InputError(f"got a reranker object and settings {sorted(kwargs)}; give one or the other")
        # (a preset name, or a pruner as the reranker, was taken, and failed at the first query)
        check_stage("reranker=", reranker, "rank", "an AttentionReranker, or its settings as keywords (config='icr')")
        return None
    return resolved_settings(_preset_heads(kwargs), RerankConfig)


def shared_reranker(reranker: Any = None, *, index: Any = None, **kwargs: Any):
    """``reranker`` if given (any object with ``rank(query, docs, k)``), else the process-wide
    :class:`~attnrank.rerank.attention.AttentionReranker` built from ``kwargs`` (its constructor's
    keyword arguments: ``model``, ``heads``, ``scorer``, ``calibrate``, ...), except that
    ``heads=None`` is the preset's heads, as leaving it out is (an adapter's default: the default
    preset, which reads no attention); ``AttentionReranker(heads=None)`` itself reads all heads.

    ``index``: the loaded index a retriever adapter reranks the hits of; the reranker built for it
    reads their dense signal from the index's vectors (:meth:`~attnrank.rerank.attention.AttentionReranker.use_index`),
    so it is one of its own: a reranker shared with adapters of other inputs embeds them, and its
    scores never depend on which adapters a process created first. A given ``reranker`` is used as it is."""
    settings = check_reranker_settings(reranker, **kwargs)
    if settings is None:
        return reranker
    from ..rerank.attention import AttentionReranker

    kwargs = _preset_heads(kwargs)

    def build() -> AttentionReranker:
        built = AttentionReranker(**kwargs)
        with _LOCK:
            _SOURCES[built] = (dict(kwargs), index)
        if index is not None:
            built.use_index(index)
            with _LOCK:
                _INDEX_OF[built] = index
        return built

    if index is None:
        return _cached("AttentionReranker", settings, build)
    with _LOCK:
        ours = any(v is index for v in _CACHE.values())  # loaded by shared_index, which keeps it
    return _cached("AttentionReranker", {**settings, "index": index}, build, _CACHE if ours else _HELD)


def shared_pruner(pruner: Any = None, **kwargs: Any):
    """Like :func:`shared_reranker`, for :class:`~attnrank.prune.pruner.ContextPruner`, except
    that ``heads=None`` is all heads, as ``ContextPruner(heads=None)`` reads it (a pruner has no
    preset whose heads it would stand for)."""
    if pruner is not None:
        if kwargs:
            raise InputError(f"got a pruner object and settings {sorted(kwargs)}; give one or the other")
        check_stage("pruner=", pruner, "prune", "a ContextPruner, or its settings as keywords (method='query')")
        return pruner
    from ..prune.pruner import ContextPruner

    if "heads" in kwargs and kwargs["heads"] is None:  # one key for one configuration: PruneConfig says "all"
        kwargs = {**kwargs, "heads": "all"}
    return _cached("ContextPruner", resolved_settings(kwargs, PruneConfig), lambda: ContextPruner(**kwargs))


def _preset_heads(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``heads=None`` means the preset's heads, as not giving them does (and as Haystack's
    components read it): given to the reranker it chose the preset with attention, and the object
    built first for one configuration's key depended on which spelling came first."""
    return {k: v for k, v in kwargs.items() if not (k == "heads" and v is None)}


# The key under which a stored ``config`` names its class (:func:`stored_settings`).
CONFIG_CLASS = "__config__"
_CONFIGS = {c.__name__: c for c in (RerankConfig, PruneConfig)}


def stored_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A stage's keyword arguments as JSON holds them, for an adapter's ``to_dict``: paths as
    strings, tuples as lists, a :class:`Reweighting` as the dict of its fields, a ``config``
    object (:class:`RerankConfig`, :class:`PruneConfig`) as its fields and its class's name
    (``"__config__"``); :func:`built_settings` turns them back. Other objects (fused or learned
    weights, a slot profile) stay objects: rebuilt from a dict they would be wrong, so JSON
    refuses them and a ``from_dict`` in the same process passes them on."""

    def plain(value: Any) -> Any:
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        if isinstance(value, (RerankConfig, PruneConfig)):
            return {
                CONFIG_CLASS: type(value).__name__,
                **{f.name: plain(getattr(value, f.name)) for f in fields(value)},
            }
        if isinstance(value, Reweighting):
            return asdict(value)
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    return {k: plain(v) for k, v in settings.items()}


def built_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments read back from JSON (:func:`stored_settings`, a Haystack YAML) for a stage's
    constructor: ``reweight`` as a :class:`~attnrank.rerank.reweight.Reweighting`, ``heads`` given as
    ``[[layer, head], ...]`` as pairs, a stored ``config`` as the configuration object it was."""
    out = dict(settings)
    if isinstance(out.get("reweight"), dict):
        out["reweight"] = reweighting_of(out["reweight"])
    heads = out.get("heads")
    if isinstance(heads, list) and heads and all(isinstance(p, list) for p in heads):
        out["heads"] = [tuple(p) for p in heads]
    config = out.get("config")
    if isinstance(config, dict) and CONFIG_CLASS in config:
        values = dict(config)
        kind = _CONFIGS.get(values.pop(CONFIG_CLASS))
        if kind is None:
            raise InputError(f"config names {config[CONFIG_CLASS]!r}, not one of {sorted(_CONFIGS)}")
        check_fields(kind, values)
        out["config"] = kind(**built_settings(values))
    return out


def reweighting_of(values: dict[str, Any]) -> Reweighting:
    """The :class:`~attnrank.rerank.reweight.Reweighting` a dict of its fields describes."""
    known = {f.name for f in fields(Reweighting)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise InputError(f"reweight={values!r} has unknown field(s) {unknown}; known: {sorted(known)}")
    return Reweighting(**values)


def shared_index(index: Any) -> Any:
    """A loaded :class:`~attnrank.index.retriever.HybridRetriever` (or sharded one): the object
    itself, or the index folder ``index`` (a str or path object) loaded once per process and build."""
    from ..index.retriever import HybridRetriever
    from ..index.sharded.retriever import ShardedRetriever
    from ..index.store import manifest_tag

    if isinstance(index, os.PathLike):
        index = os.fspath(index)
    if not isinstance(index, str):
        # (any object with a search(), a framework's vector store, was taken, and failed at the first query)
        if not isinstance(index, (HybridRetriever, ShardedRetriever)):
            raise InputError(
                f"index is a {type(index).__name__}, neither an attnrank index folder nor a retriever; pass the "
                "folder's path or a HybridRetriever (HybridRetriever.load(path))"
            )
        return index

    path = str(Path(index).expanduser().resolve())
    # keyed by the build too: an index rebuilt at the same path in this process is loaded again,
    # not served from the earlier load without its new documents
    build = manifest_tag(Path(path))
    _forget_other_builds(path, build)

    def load() -> HybridRetriever:
        loaded = HybridRetriever.load(path)
        with _LOCK:
            _SOURCES[loaded] = path
        return loaded

    return _cached("HybridRetriever", {"path": path, "build": build}, load)


def source_of(shared: Any) -> Any:
    """What built ``shared``, where :func:`shared_index` or :func:`shared_reranker` built it: an
    index's folder (str); a reranker's keyword arguments (a dict) and the index it was built
    for (or None); else None (an object the caller built)."""
    with _LOCK:
        try:
            return _SOURCES.get(shared)
        except TypeError:  # not weakly referable
            return None


# where a pickled retriever adapter keeps :func:`retriever_sources`
PICKLED_STAGES = "attnrank_stages"


def retriever_sources(adapter: str, index: Any, reranker: Any) -> dict[str, Any]:
    """What a retriever adapter's pickled copy loads its ``index`` and ``reranker`` (or None) again
    from (:func:`retriever_stages`): the index's folder, the reranker's settings and the folder of
    the index it was built for. Why: the loaded objects hold locks and a model, which do not
    pickle, so a chain holding the adapter could not go to a worker process. An object the caller
    built (not by :func:`shared_index` / :func:`shared_reranker`) cannot be loaded again: refused."""
    folder, built = source_of(index), source_of(reranker)
    settings, its_index = built if built is not None else (None, None)
    its_folder = None if its_index is None else source_of(its_index)
    unknown = [
        kind
        for kind, missing in (
            ("index", folder is None or (its_index is not None and its_folder is None)),
            ("reranker", reranker is not None and built is None),
        )
        if missing
    ]
    if unknown:
        raise InputError(
            f"{adapter} built around a given {unknown[0]} object cannot be pickled (it holds locks and a model); "
            "build it from the index's folder (index=path) and the reranker's settings (model=..., ...), which a "
            "copy loads again"
        )
    return {"index": folder, "reranker": None if settings is None else (settings, its_folder)}


def retriever_stages(sources: dict[str, Any]) -> tuple[Any, Any]:
    """The index and reranker (or None) :func:`retriever_sources` describes, shared as any adapter's."""
    index = shared_index(sources["index"])
    if sources["reranker"] is None:
        return index, None
    settings, its_folder = sources["reranker"]
    return index, shared_reranker(index=None if its_folder is None else shared_index(its_folder), **settings)


def _forget_other_builds(path: str, build: str | None) -> None:
    """Drop the shared loads of ``path``'s earlier builds, and the rerankers made for them (they
    read their vectors): a long process that rebuilds an index kept every build in memory.
    Adapters that hold them keep them; new ones get the current build."""
    with _LOCK:
        old = [
            (key, _CACHE[key])
            for key in list(_CACHE)
            if key[0] == "HybridRetriever"
            and json.loads(key[1]).get("path") == path
            and json.loads(key[1]).get("build") != build
        ]
        for key, index in old:
            del _CACHE[key]
            tag = _unhashable(index)  # how a reranker's key names the index it was made for
            for other in [k for k in _CACHE if k[0] == "AttentionReranker" and tag in k[1]]:
                del _CACHE[other]


def clear_shared() -> None:
    """Forget the shared rerankers, pruners and indexes built so far (for tests and reloads)."""
    with _LOCK:
        _CACHE.clear()
        _HELD.clear()


_STAGE_LOCKS: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()
_STAGE_GUARD = threading.Lock()
_UNKEYED_LOCK = threading.Lock()


def model_lock(stage: Any) -> AbstractContextManager[Any]:
    """The lock that serializes calls into ``stage``'s model (a reranker/pruner with ``.llm``):
    the model's own :func:`~attnrank.llm.recording.forward_lock`, held here for the whole call.

    Every forward pass takes that lock anyway; holding it for the call keeps one request's
    passes together when frameworks call adapters from thread pools (LangChain ``.batch()``,
    Haystack's executor, the server's workers). A stage without a model, or one that does not run
    it (a reranking preset that runs no model), gets a lock of its own.
    """
    llm = getattr(stage, "llm", None) if getattr(stage, "uses_llm", True) else None
    model = getattr(llm, "model", None) if llm is not None else None
    if model is not None:
        return forward_lock(model)
    with _STAGE_GUARD:
        try:
            lock = _STAGE_LOCKS.get(stage)
            if lock is None:
                lock = _STAGE_LOCKS[stage] = threading.Lock()
        except TypeError:  # not hashable (a plain dataclass) or not weakly referable (__slots__)
            return _UNKEYED_LOCK  # one lock for all such stages: serialized together, never unlocked
        return lock
