"""attnrank's attention ranker as a Haystack 3 component (extra ``attnrank[haystack]``)."""

from .ranker import AttnrankRanker

__all__ = ["AttnrankRanker"]
