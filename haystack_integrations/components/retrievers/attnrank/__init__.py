"""Retrieval from an attnrank index (hybrid BM25 + dense, reranked) as a Haystack 3
component (extra ``attnrank[haystack]``)."""

from .retriever import AttnrankRetriever

__all__ = ["AttnrankRetriever"]
