"""Sharded indexes with global BM25 statistics (build in parallel, serve, merge); Ray optional.

- :mod:`.stats`: pass 1, corpus-wide BM25 statistics as an associative merge of block counts
- :mod:`.build`: pass 2, one index folder per shard (:class:`ShardedIndexer`)
- :mod:`.executor`: run the passes in this process or as Ray tasks (extra ``ray``)
- :mod:`.layout`: shard folders and the top-level manifest
- :mod:`.retriever`: :class:`ShardedRetriever`, per-shard top-k merged before fusion
- :mod:`.merge`: :func:`merge_shards`, a sharded index into one ordinary index
"""

from .build import ShardedIndexer
from .executor import LocalExecutor, RayExecutor
from .layout import is_sharded
from .merge import merge_shards
from .retriever import ShardedRetriever
from .stats import CorpusStats, block_stats, merge_stats

__all__ = [
    "CorpusStats",
    "LocalExecutor",
    "RayExecutor",
    "ShardedIndexer",
    "ShardedRetriever",
    "block_stats",
    "is_sharded",
    "merge_shards",
    "merge_stats",
]
