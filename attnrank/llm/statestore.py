"""On-disk passage states: every corpus passage's block states, built once at index time
(written by :mod:`attnrank.llm.statestore_write`, read here).

``attnrank index CORPUS --passage-states float16|int8`` writes a ``passage_states/`` folder into
the index (inside the same atomic build, so the index manifest lists and checksums its files):

- ``states.json``: format, encoder version (:data:`ENCODER`), model id and weights key (fingerprint + quantization), model dtype, layers kept, KV geometry, the
  prompt settings (truncation; the position scheme is always ``shared``, and each state key
  holds its start position), the prefix ids' hash, the storage, and per
  passage its id and state key (:func:`attnrank.llm.states.state_keys`, a hash of everything the
  states depend on, the passage's block ids included);
- ``keys.npy``, ``values.npy``: ``[tokens, layers, kv_heads, head_dim]``, float16, or int8 with
  ``key_scales.npy``/``value_scales.npy`` (float16 absmax per token, layer and head);
- ``offsets.npy``: passage ``i`` holds tokens ``offsets[i]:offsets[i+1]``.

Arrays are memory-mapped on load. A store built for another model, dtype, head depth, prompt
settings or chat template is refused with an error naming the difference; a passage whose text
changed since the build has another state key, so its stored states are never used (it is
encoded afresh, with a warning naming the passage once; :attr:`PassageStateStore.stale` counts them).
Passages named by their positions in a request (:func:`ids_by_position`) are looked up by their
states alone: a stored passage under the same id is another passage, not a changed one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnrank.config import PASSAGE_STATES_FOLDER, STATE_STORAGES
from attnrank.errors import InputError

from .attention import AttentionCapturer
from .blocks import block_prefix_ids
from .states import BlockState, rows_share_the_pass

logger = logging.getLogger(__name__)

FORMAT = "attnrank-passage-states"
# How the stored states were encoded. 2 (2026-12-06): every store since block states were fixed for
# dynamic int8 linears and length-following rotary frequencies (each block encoded alone) and
# sliding windows (checked before any block). A store without the field predates it: its states
# are right only for a model none of those fixes touched (fixes to how kept keys are rotated when
# blocks are assembled, as for EXAONE 4's layers without rotary, change no stored state).
ENCODER = 2


# Whether the passages being looked up are named by their positions in a request ("0", "1", ...:
# plain texts, a server's /v1/rerank, a framework's documents) rather than by corpus ids.
_BY_POSITION: ContextVar[bool] = ContextVar("attnrank_ids_by_position", default=False)


@contextmanager
def ids_by_position() -> Iterator[None]:
    """Inside (this thread or task): the passages' ids are their positions in a request, not corpus
    ids, so a lookup never takes a stored passage of the same id for a changed one. Why: a server's
    ``/v1/rerank`` over an index with stored states warned that passage '0' had changed, and counted
    it ``stale``, for any text sent first (the corpus's own text too, sent without its title)."""
    token = _BY_POSITION.set(True)
    try:
        yield
    finally:
        _BY_POSITION.reset(token)


def _hash_ids(ids: Sequence[int]) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()


# The config fields the stored keys and values depend on beyond the weights (a hub model's
# fingerprint is its snapshot's commit: a config.json edited in the cache, e.g. its RoPE settings,
# keeps it).
_CONFIG_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "partial_rotary_factor",
    "max_position_embeddings",
    "rms_norm_eps",
    "layer_norm_eps",
)


# Fields added since stores were first written (2026-12-05), hashed where they change what a
# model computes: a model that sets none of them (or, as transformers fills them in for Qwen, only
# full-attention layer types and an unused window) keeps the digest its stores were written under.
_LATER_FIELDS = (
    "no_rope_layers",
    "attn_logit_softcapping",
    "query_pre_attn_scalar",
    "v_head_dim",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
)


def _later_fields(config: Any) -> dict[str, Any]:
    out = {k: v for k in _LATER_FIELDS if (v := getattr(config, k, None)) is not None}
    types = list(getattr(config, "layer_types", None) or [])
    mixed = any(t != "full_attention" for t in types)
    if mixed:
        out["layer_types"] = types
    window = getattr(config, "sliding_window", None)
    if window is not None and getattr(config, "use_sliding_window", True) and (mixed or not types):
        out["sliding_window"] = window
    return out


def config_digest(config: Any) -> str:
    """A hash of the decoder config's fields that shape its keys and values (:data:`_CONFIG_FIELDS`,
    and those of :data:`_LATER_FIELDS`, layer types and sliding window that change something)."""
    fields = {k: getattr(config, k, None) for k in _CONFIG_FIELDS}
    fields |= _later_fields(config)
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def store_settings(
    capturer: AttentionCapturer, tokenizer: Any, fingerprint: str, max_doc_words: int | None, max_doc_tokens: int | None
) -> dict[str, Any]:
    """What a store must match to serve a reranker (compared field by field on load; a store
    written before ``config_sha256`` was recorded is not checked for it)."""
    cfg = capturer.decoder.config
    return {
        "fingerprint": fingerprint,
        "config_sha256": config_digest(cfg),
        "model_dtype": str(next(capturer.model.parameters()).dtype),
        "deepest_layer": capturer.deepest_layer,
        "kv_heads": int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads),
        "max_doc_words": max_doc_words,
        "max_doc_tokens": max_doc_tokens,
        "positions": "shared",
        "prefix_sha256": _hash_ids(block_prefix_ids(tokenizer)),
    }


class StoreError(InputError):
    """A passage-state store the reranker cannot read: ``fault`` is what is wrong without the fix
    (the message's advice names ``--passage-states``, which an index's own store, attached unasked,
    was not given with: :func:`~attnrank.rerank.over_index.index_reranker` says the fault alone)."""

    def __init__(self, message: str, fault: str | None = None):
        super().__init__(message)
        self.fault = fault or message


class StoreSetupError(StoreError):
    """A passage-state store built for another model or prompt settings than the reranker's."""


class StoreDamagedError(StoreError):
    """A passage-state store that cannot be read as written (its header or arrays)."""


STORE_FILES = ("states.json", "offsets.npy", "keys.npy", "values.npy", "key_scales.npy", "value_scales.npy")


# the arrays of a store, by storage (int8 keeps a scale per token, layer and head besides)
ARRAYS = {"float16": ("keys", "values"), "int8": ("keys", "values", "key_scales", "value_scales")}


def sample_digest(array: np.ndarray, rows: int = 64) -> str:
    """sha256 of ``array``'s dtype, shape and up to ``rows`` evenly spaced rows: read in
    milliseconds at open, it tells arrays of equal shape apart (keys and values swapped, or an
    array from another store); ``--verify`` still reads every byte."""
    n = array.shape[0] if array.ndim else 0
    digest = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    for row in np.unique(np.linspace(0, n - 1, num=min(n, rows)).astype(np.int64)) if n else ():
        digest.update(np.ascontiguousarray(array[row]).tobytes())
    return digest.hexdigest()


def store_folder(path: str | Path) -> Path:
    """The passage-state store of ``path`` (an index folder or its ``passage_states``), checked to
    hold a store's header without the model (the header's settings are checked when it opens)."""
    folder = Path(path)
    if (folder / PASSAGE_STATES_FOLDER).is_dir():
        folder = folder / PASSAGE_STATES_FOLDER
    if not (folder / "states.json").is_file():
        raise InputError(
            f"passage_states={str(path)!r} holds no passage-state store (no {folder / 'states.json'}); give an "
            "index built with `attnrank index CORPUS --passage-states float16`, or its passage_states folder"
        )
    return folder


def check_store_fits(folder: Path, fingerprint: str, max_doc_words: int | None, max_doc_tokens: int | None) -> None:
    """What a store's header (``folder``: :func:`store_folder`'s) tells without the model: the
    weights it was built from (``fingerprint``: the model's, without its dtype or quantization)
    and the passage cuts. A store for another model or cut was refused only on opening, after the
    model's load (minutes for a large one); the rest of its setup is checked then, as before.
    An unreadable header is left to that opening, which names it."""
    try:
        header = json.loads((folder / "states.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(header, dict) or not isinstance(header.get("fingerprint"), str):
        return
    want = {
        "fingerprint": fingerprint,
        "max_doc_words": max_doc_words,
        "max_doc_tokens": max_doc_tokens,
    }
    have = {**header, "fingerprint": header["fingerprint"].split("+")[0]}
    diff = [f"{k}: store {have.get(k)!r}, reranker {v!r}" for k, v in want.items() if have.get(k) != v]
    if diff:
        raise StoreSetupError(_SETUP_MESSAGE.format(folder=folder, diff="; ".join(diff)))


_SETUP_MESSAGE = (
    "the passage states at {folder} were built for another setup ({diff}); rebuild them with `attnrank index "
    "--passage-states` for this setup (its --model, --preset, --heads, --max-doc-words, --max-doc-tokens and "
    "--dtype), or rerank without them"
)


class PassageStateStore:
    """A memory-mapped store opened for one reranker (see the module docstring).

    Opening checks the arrays against the header (passages, token count, storage) and, when
    given, the model's ``head_dim``: a damaged or mismatched store is an :class:`InputError`
    naming it, never states served from the wrong rows."""

    def __init__(self, folder: Path, header: dict[str, Any], head_dim: int | None = None):
        self.folder = folder
        self.dtype = torch.float32  # of the states get returns: the model's, once opened for one
        self.device = torch.device("cpu")  # of the states get returns: the model's, once opened for one
        self.served = 0  # passages whose states get returned
        self._counting = threading.Lock()  # (served/stale: a server's rerank threads share one store)
        self.header = header
        passages = _passages(folder, header)
        self.n_passages = len(passages)  # (by_key holds one row per text: duplicates are counted here)
        int8 = header.get("storage") == "int8"
        try:
            self.offsets = np.load(folder / "offsets.npy")
            self.keys = np.load(folder / "keys.npy", mmap_mode="r")
            self.values = np.load(folder / "values.npy", mmap_mode="r")
            self.key_scales = np.load(folder / "key_scales.npy", mmap_mode="r") if int8 else None
            self.value_scales = np.load(folder / "value_scales.npy", mmap_mode="r") if int8 else None
        except (OSError, ValueError, EOFError) as e:  # (EOFError: an empty file, which the CLI read as "Aborted!")
            raise _damaged(folder, f"an array cannot be read: {e or type(e).__name__}") from None
        self._check(head_dim, len(passages))
        self.by_key = {key: i for i, (_, key) in enumerate(passages)}
        self.key_of_id = {doc_id: key for doc_id, key in passages}
        self.stale = 0  # lookups of a stored passage id whose text changed
        self._warned: set[str] = set()  # the ids warned of

    def _check(self, head_dim: int | None, n: int) -> None:
        """Arrays of the recorded storage, geometry and token count; offsets from 0, increasing."""
        h, keys, off = self.header, self.keys, self.offsets
        dtype = np.float16 if h.get("storage") == "float16" else np.int8
        deepest = h.get("deepest_layer")
        layers = deepest + 1 if isinstance(deepest, int) else None
        width = head_dim or (keys.shape[-1] if keys.ndim else None)
        geometry = (h.get("tokens"), layers, h.get("kv_heads"), width)
        if keys.dtype != dtype or self.values.dtype != dtype or keys.shape != geometry or self.values.shape != geometry:
            raise _damaged(
                self.folder,
                f"keys {keys.dtype} {keys.shape}, values {self.values.dtype} {self.values.shape}; "
                f"the header says {dtype.__name__} {geometry}",
            )
        for scales in (self.key_scales, self.value_scales):
            if scales is not None and (scales.dtype != np.float16 or scales.shape != geometry[:3]):
                raise _damaged(self.folder, f"int8 scales of shape {scales.shape}, expected {geometry[:3]}")
        if (
            off.ndim != 1
            or off.dtype.kind != "i"
            or len(off) != n + 1
            or off[0] != 0
            or off[-1] != geometry[0]
            or np.any(np.diff(off) <= 0)
        ):
            raise _damaged(self.folder, "offsets do not match the stored passages")
        samples = h.get("samples") or {}  # stores written before samples were recorded are not checked
        if not isinstance(samples, dict):
            raise _damaged(self.folder, f"its header's samples are a {type(samples).__name__}, not a mapping")
        for name, array in (
            ("keys", keys),
            ("values", self.values),
            ("key_scales", self.key_scales),
            ("value_scales", self.value_scales),
        ):
            if array is not None and name in samples and sample_digest(array) != samples[name]:
                raise _damaged(self.folder, f"{name}.npy is not the array written with this store")
        if "offsets" in samples and sample_digest(off, len(off)) != samples["offsets"]:  # (every row: it is small)
            raise _damaged(self.folder, "offsets.npy is not the array written with this store")

    @classmethod
    def open(
        cls,
        path: str | Path,
        capturer: AttentionCapturer,
        tokenizer: Any,
        fingerprint: str,
        *,
        max_doc_words: int | None,
        max_doc_tokens: int | None,
    ) -> PassageStateStore:
        """Open ``path`` (an index folder or its ``passage_states``) if it fits this reranker."""
        folder = store_folder(path)
        try:
            header = json.loads((folder / "states.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            fault = f"no readable passage-state store at {path} ({e})"
            raise StoreDamagedError(
                f"{fault}; build one with `attnrank index CORPUS --passage-states float16`", fault
            ) from None
        if (
            not isinstance(header, dict)
            or header.get("format") != FORMAT
            or header.get("version") != 1
            or header.get("storage") not in STATE_STORAGES
        ):
            raise StoreDamagedError(f"{folder}/states.json is not an attnrank passage-state store (version 1)")
        want = store_settings(capturer, tokenizer, fingerprint, max_doc_words, max_doc_tokens)
        if "config_sha256" not in header:  # written before the config was recorded
            del want["config_sha256"]
        diff = [f"{k}: store {header.get(k)!r}, reranker {v!r}" for k, v in want.items() if header.get(k) != v]
        if diff:
            raise StoreSetupError(_SETUP_MESSAGE.format(folder=folder, diff="; ".join(diff)))
        check_encoder(folder, header, capturer)  # (after the settings: a store for another setup is named as such)
        cfg = capturer.decoder.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        store = cls(folder, header, int(head_dim))
        weight = next(capturer.model.parameters())
        store.dtype = weight.dtype  # (half the cache memory for a bfloat16 model)
        store.device = weight.device  # where the states computed afresh live, and where they are read
        return store

    def get(self, doc_id: str, key: str, n_tokens: int | None = None) -> BlockState | None:
        """The stored states of passage ``doc_id`` if its current ``key`` matches the stored one;
        ``n_tokens``: its block's token count, which the stored rows must have (else the store is
        damaged: an :class:`InputError`, never states cut at other rows)."""
        row = self.by_key.get(key)
        if row is None:
            if doc_id in self.key_of_id and not _BY_POSITION.get():
                with self._counting:
                    self.stale += 1
                if doc_id not in self._warned:  # (once: a server's /v1/rerank may send other texts under these ids)
                    self._warned.add(doc_id)
                    logger.warning(
                        "passage %r changed since its states were stored (or another text came under its id); "
                        "encoding it afresh",
                        doc_id,
                    )
            return None
        a, b = int(self.offsets[row]), int(self.offsets[row + 1])
        if n_tokens is not None and b - a != n_tokens:
            raise _damaged(self.folder, f"passage {doc_id!r} has {b - a} stored token rows, its block {n_tokens}")
        with self._counting:
            self.served += 1
        return BlockState(
            self._tensor(self.keys, self.key_scales, a, b), self._tensor(self.values, self.value_scales, a, b)
        )

    def stats(self) -> dict[str, Any]:
        """What the store holds and has served: its folder, passages, tokens and storage, passages
        served from it, and lookups of a stored id whose text had changed (encoded afresh)."""
        return {
            "folder": str(self.folder),
            "passages": self.n_passages,
            "tokens": int(self.offsets[-1]) if len(self.offsets) else 0,
            "storage": self.header.get("storage"),
            "served": self.served,
            "stale": self.stale,
        }

    def _tensor(self, data: np.ndarray, scales: np.ndarray | None, a: int, b: int) -> torch.Tensor:
        x = np.asarray(data[a:b], dtype=np.float32)
        if scales is not None:
            x = x * np.asarray(scales[a:b], dtype=np.float32)[..., None]
        x = np.ascontiguousarray(x.transpose(1, 2, 0, 3))  # [layers, kv, tokens, head_dim]
        return torch.from_numpy(x).to(device=self.device, dtype=self.dtype)

    @property
    def nbytes(self) -> int:
        return sum(p.stat().st_size for p in self.folder.glob("*.npy"))


def check_encoder(folder: Path, header: dict[str, Any], capturer: AttentionCapturer) -> None:
    """Refuse a store whose states an earlier or later attnrank encoded otherwise than this one
    would for ``capturer``'s model: a store without :data:`ENCODER` serves only a model that none of
    the encoder's fixes touched (no dynamic int8 linears, no length-following rotary frequencies, no
    sliding-window layers)."""
    encoder = header.get("encoder", 1)
    if not isinstance(encoder, int) or encoder > ENCODER:
        raise StoreSetupError(
            f"the passage states at {folder} were written by a newer attnrank (encoder {encoder!r}, this one "
            f"reads up to {ENCODER}); upgrade attnrank, or rebuild them with `attnrank index --passage-states`"
        )
    sliding = {"layer_types", "sliding_window"} & set(_later_fields(capturer.decoder.config))
    touched = rows_share_the_pass(capturer.model, capturer.decoder) or bool(sliding)
    if encoder < ENCODER and touched:
        fault = (
            f"the passage states at {folder} were written by an earlier attnrank (encoder {encoder}, now {ENCODER}) "
            "that encoded this model's blocks otherwise (int8 linears, length-following rotary or sliding-window "
            "layers)"
        )
        raise StoreSetupError(f"{fault}; {_REBUILD}, or drop --passage-states", fault)


_REBUILD = "rebuild them with `attnrank index --passage-states`"


def _damaged(folder: Path, what: str) -> StoreDamagedError:
    fault = f"the passage states at {folder} are damaged ({what})"
    return StoreDamagedError(f"{fault}; {_REBUILD}, or drop --passage-states", fault)


def _passages(folder: Path, header: dict[str, Any]) -> list[tuple[str, str]]:
    """The header's ``[doc id, state key]`` pairs, checked."""
    entries = header.get("passages")
    if not isinstance(entries, list) or not isinstance(header.get("tokens"), int):
        raise _damaged(folder, "states.json lacks its passages or token count")
    if not all(isinstance(e, list) and len(e) == 2 and all(isinstance(x, str) for x in e) for e in entries):
        raise _damaged(folder, "a passage entry of states.json is not [id, key]")
    return [(doc_id, key) for doc_id, key in entries]
