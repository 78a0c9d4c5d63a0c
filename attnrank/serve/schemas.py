"""Request and response bodies of the server, and its request limits.

Rerank shapes follow the de-facto standards (read from their documentation, see
ECOSYSTEM.md): Cohere v2 ``POST /v2/rerank`` (served here at ``/v1/rerank``, the path vLLM
uses too) and Hugging Face text-embeddings-inference ``POST /rerank``. Scores are the reranker's:
the fused score with the default preset (``likelihood``), ``signals`` and ``fused``, the calibrated attention
score with an attention-only one; higher is better, not probabilities, and not comparable across
queries.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from ..config import DEFAULT_BUDGET_TOKENS
from ..errors import AttnrankError
from ..types import Document


class LimitExceeded(AttnrankError):
    """A request over one of the server's limits (answered 413)."""


def count_limit(name: str, n: int, limit: int) -> None:
    """Refuse ``n`` documents (or index hits) over the server's ``max_documents``."""
    if n > limit:
        raise LimitExceeded(f"{name}={n} > max_documents={limit}; ask for at most {limit} documents")


# The limits of the app a request is for, set by its body-limit middleware: a body's lists are
# counted before their items are validated. A body of 60 MB within max_body_bytes held 4.7 million
# one-letter documents, whose validation took 26 s and 3.3 GB (the server answered nothing else)
# before the count refused them.
REQUEST_LIMITS: ContextVar[Limits | None] = ContextVar("attnrank_request_limits", default=None)


def _counted(data: Any, field: str) -> Any:
    """``data`` (a request body as parsed JSON), once its list ``field`` is within the limits."""
    limits = REQUEST_LIMITS.get()
    if limits is not None and isinstance(data, dict) and isinstance(data.get(field), list):
        # (LimitExceeded is no ValueError: pydantic passes it on, answered 413 as the routes' own count)
        count_limit(field, len(data[field]), limits.max_documents)
    return data


class TextDocument(BaseModel):
    """Cohere v1 also accepts documents as ``{"text": ...}`` objects."""

    text: str


class PruneDocument(BaseModel):
    """A passage to prune: its text, and where known its id, title and pre-split sentences (every
    sentence of the text, in order; :func:`attnrank.prune.segment.locate_sentences`)."""

    model_config = ConfigDict(extra="forbid")
    text: str
    id: str | None = None
    title: str = ""
    sentences: list[str] | None = None

    def document(self, position: int) -> Document:
        """As the pruner reads it (``id``: the position in the request where none is given; the
        sentences go to the pruner's ``sentences=``, which refuses a list that does not cover the
        text, where metadata's would be set aside for its own split with a log line only)."""
        return Document(str(position) if self.id is None else self.id, self.text, self.title)


class CohereRerankRequest(BaseModel):
    # unknown fields refused, as attnrank's own bodies refuse them (Voyage's top_k, a misspelt
    # return_document or max_tokens_per_document were dropped: all documents, no text, no cut, 200)
    model_config = ConfigDict(protected_namespaces=(), extra="forbid")
    model: str | None = Field(
        None, description="Accepted for compatibility and not checked: the server has one model (see /health)."
    )
    query: str
    documents: list[str | TextDocument] = Field(min_length=1, description="At least one document.")
    top_n: int | None = Field(None, ge=1, strict=True)
    return_documents: bool = Field(False, strict=True)
    max_tokens_per_doc: int | None = Field(
        None, ge=1, strict=True, description="Truncate each document to this many tokens."
    )
    explain: bool = Field(False, strict=True, description="Add per-token attention evidence to each result.")
    rank_fields: list[str] | None = Field(
        None, description="Cohere v1: the fields of object documents ranked on; only ['text'] is supported."
    )
    relevant_spans: dict[str, Any] | None = Field(
        None, description="Cohere's relevant spans: not supported (mode 'enabled' is refused; see explain)."
    )
    max_chunks_per_doc: int | None = Field(
        None, description="Cohere v1's chunking of long documents: not supported (a value is refused)."
    )
    priority: int | None = Field(
        None, description="Cohere v2's request priority (its SDK sends it where given): accepted, not used."
    )

    @model_validator(mode="before")
    @classmethod
    def _count(cls, data: Any) -> Any:
        return _counted(data, "documents")

    @model_validator(mode="after")
    def _supported(self) -> CohereRerankRequest:
        """Refuse what Cohere's API takes and this server cannot do: each was dropped without a
        word (the answer then looked like one ranked on other fields, or with no span found)."""
        if self.rank_fields not in (None, ["text"]):
            raise ValueError(
                f"rank_fields={self.rank_fields} is not supported: documents are ranked on their text; "
                "drop rank_fields, or put what to rank on in text"
            )
        if self.max_chunks_per_doc is not None:
            raise ValueError(
                f"max_chunks_per_doc={self.max_chunks_per_doc} is not supported: a document is read whole, cut as "
                "the reranker is configured (or to max_tokens_per_doc); drop it, or split long documents yourself"
            )
        if self.relevant_spans is not None and self.relevant_spans.get("mode", "disabled") != "disabled":
            raise ValueError(
                f"relevant_spans={self.relevant_spans} is not supported; drop it, or ask for explain=true "
                "(per-token attention evidence)"
            )
        return self


class TEIRerankRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # (as Cohere's: a misspelt field was dropped, 200)
    query: str
    texts: list[str] = Field(min_length=1, description="At least one text.")
    truncate: bool = Field(
        False,
        strict=True,
        description="Accepted for compatibility: the reranker cuts texts as it is configured (to max_doc_words "
        "in an LLM prompt; preset signals reads whole texts), and texts over the server's limits are refused "
        "either way.",
    )
    raw_scores: bool = Field(
        False,
        strict=True,
        description="Accepted for compatibility: the scores are always the reranker's own (no sigmoid), "
        "whatever its preset (the default's is a sum of per-query z-scores).",
    )
    return_text: bool = Field(False, strict=True)
    truncation_direction: Literal["Left", "Right"] = Field(
        "Right",
        description="TEI's side a cut text keeps: the reranker keeps a text's start (Right); Left with truncate "
        "is refused.",
    )

    @model_validator(mode="before")
    @classmethod
    def _count(cls, data: Any) -> Any:
        return _counted(data, "texts")

    @model_validator(mode="after")
    def _supported(self) -> TEIRerankRequest:
        if self.truncate and self.truncation_direction == "Left":  # (a cut text's start kept, its end asked for)
            raise ValueError(
                "truncation_direction='Left' keeps a cut text's end; this reranker keeps its start "
                "(max_doc_words): drop it, or cut the texts yourself"
            )
        return self


# The CLI's and Pipeline's names: ``top_k`` results kept, ``depth`` first-stage candidates. The names
# these bodies had before (``k``, ``first_stage_k``, ``rerank_k``) are still accepted. attnrank's own
# bodies refuse unknown fields (a misspelt ``topk`` would otherwise be dropped and its default used).
# Counts are strict: JSON ``true`` or ``2.5`` is refused, not read as 1 or 2 (the library refuses them too);
# so are switches: ``"yes"``, ``"false"`` or ``0`` is no JSON boolean (pydantic read "false" as False, 1 as True).
class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str
    top_k: int = Field(
        10, ge=1, strict=True, description="Results returned.", validation_alias=AliasChoices("top_k", "k")
    )
    depth: int = Field(
        20,
        ge=1,
        strict=True,
        description="First-stage candidates reranked; only with rerank true.",
        validation_alias=AliasChoices("depth", "first_stage_k"),
    )
    rerank: bool = Field(True, strict=True)


class PruneRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str
    documents: list[str | PruneDocument] | None = Field(
        None,
        description="Passages to prune (texts, or objects with text and optional id, title and sentences); "
        "default: the index's top k.",
    )
    top_k: int = Field(
        5,
        ge=1,
        strict=True,
        description="Index hits pruned; only without documents (which are all pruned).",
        validation_alias=AliasChoices("top_k", "k"),
    )
    budget_tokens: int | None = Field(
        None,
        ge=1,
        strict=True,
        description=f"Sentence tokens kept (default {DEFAULT_BUDGET_TOKENS} unless keep_ratio is given).",
    )
    keep_ratio: float | None = Field(None, gt=0, le=1, strict=True)  # (JSON true is no ratio; 1 is)
    neighbours: int = Field(0, ge=0, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _count(cls, data: Any) -> Any:
        return _counted(data, "documents")


class AskRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str
    depth: int = Field(20, ge=1, strict=True, description="First-stage hits.")
    top_k: int = Field(
        5,
        ge=1,
        strict=True,
        description="Passages kept after reranking.",
        validation_alias=AliasChoices("top_k", "rerank_k"),
    )
    budget_tokens: int | None = Field(
        None, ge=1, strict=True, description=f"Sentence tokens kept by pruning (default {DEFAULT_BUDGET_TOKENS})."
    )
    keep_ratio: float | None = Field(None, gt=0, le=1, strict=True)  # (JSON true is no ratio; 1 is)
    max_new_tokens: int = Field(64, ge=1, le=1024, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _no_k(cls, data: Any) -> Any:
        # ``k`` was this body's name of ``depth``, but is ``top_k`` in /v1/search and /v1/prune:
        # read as depth, {"k": 10} kept 5 of 10 hits where `attnrank ask -k 10` keeps 10
        if isinstance(data, dict) and "k" in data:
            raise ValueError(
                "k is ambiguous in /v1/ask (it once meant depth; /v1/search and /v1/prune read it as top_k): "
                "give depth (first-stage hits) and/or top_k (passages kept)"
            )
        return data


@dataclass(frozen=True)
class Limits:
    """Per-request limits, checked before any model work (413 when exceeded, naming the limit).

    ``max_documents``: documents (texts) per request, and index hits asked for (``top_k``,
    ``depth``); ``max_document_chars``: characters per
    document; ``max_query_chars``: characters of the query; ``max_total_tokens``: model tokens of
    the query plus all documents (the prompt the model reads).
    """

    max_documents: int = 256
    max_document_chars: int = 20_000
    max_query_chars: int = 2_000
    max_total_tokens: int = 65_536

    @property
    def max_body_bytes(self) -> int:
        """Request body size implied by the other limits, plus 64 bytes a document and 64 KiB for
        the rest of the request: 12 bytes per character, what JSON's escapes take at most (Python's ``json.dumps``, the
        default of ``requests`` and ``httpx``, writes every non-ASCII character as ``\\uXXXX``,
        6 bytes, and one outside the BMP as two of them), so that no request within the other
        limits is refused for its size."""
        return 12 * (self.max_documents * self.max_document_chars + self.max_query_chars) + self._framing

    @property
    def max_prune_body_bytes(self) -> int:
        """:attr:`max_body_bytes` for ``/v1/prune``, whose documents may bring their ``sentences``
        (which repeat the text): 28 bytes per character of the documents (12 for the text, 12 for
        the sentences, 4 for a sentence's quotes, comma and space where each is one character)."""
        return 28 * self.max_documents * self.max_document_chars + 12 * self.max_query_chars + self._framing

    @property
    def max_query_body_bytes(self) -> int:
        """:attr:`max_body_bytes` for ``/v1/search`` and ``/v1/ask``, whose one text is the query:
        12 bytes per character of it and 64 KiB for the rest (the whole limit let such a request
        bring tens of MB, buffered and parsed on the event loop before any count was checked)."""
        return 12 * self.max_query_chars + 65_536

    @property
    def _framing(self) -> int:
        """Bytes beside the texts: 64 bytes a document (its object's keys, quotes and commas: a
        Cohere document of ten emoji had 34 past its 120) and 64 KiB for the rest."""
        return 64 * self.max_documents + 65_536

    def as_dict(self) -> dict[str, Any]:
        return {
            "max_documents": self.max_documents,
            "max_document_chars": self.max_document_chars,
            "max_query_chars": self.max_query_chars,
            "max_total_tokens": self.max_total_tokens,
            "max_body_bytes": self.max_body_bytes,
            "max_prune_body_bytes": self.max_prune_body_bytes,
            "max_query_body_bytes": self.max_query_body_bytes,
        }


def texts_of(documents: list[Any]) -> list[str]:
    return [d if isinstance(d, str) else d.text for d in documents]
