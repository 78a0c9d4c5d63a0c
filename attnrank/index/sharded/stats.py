"""Pass 1 of a sharded build: corpus-wide BM25 statistics as an associative merge of block counts.

BM25 scores are only comparable across shards when every shard uses the same idf and average
document length. Pyserini's sharded Lucene builds keep per-shard statistics (so the same document
scores differently depending on its shard); here each block of documents yields its
:class:`CorpusStats` (document frequency per term, number of documents, total length in terms),
and blocks merge with :func:`merge_stats`, which is associative and commutative, so the merge can
run in any order or as a tree on a cluster. The idf formulas are the single-index ones of
:mod:`attnrank.index.bm25`: rank-bm25's ``BM25Okapi`` (computed by rank-bm25 itself from the
merged frequencies) or Lucene's.

These are plain functions: the Ray build (:mod:`attnrank.index.sharded.build`) calls them in
remote tasks, and they run unchanged in one process.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path

import numpy as np

from ...errors import IndexFormatError, InputError
from ...files import check_new_folder
from ..bm25 import BM25Params, nonnegative_idf
from ..tokenize import TokenizerConfig, make_tokenizer


@dataclass
class CorpusStats:
    """Document frequency per term, document count and total length (in terms) of a corpus part."""

    num_docs: int = 0
    total_len: int = 0
    df: Counter = field(default_factory=Counter)

    @property
    def avgdl(self) -> float:
        """Average document length in terms (rank-bm25's ``avgdl``: total length / documents)."""
        return self.total_len / self.num_docs if self.num_docs else 0.0

    def idf(self, params: BM25Params) -> dict[str, float]:
        """Global idf of every term, with the single index's formula for ``params.method``."""
        if self.num_docs == 0 or not self.df:
            raise InputError("no BM25 statistics: every document is empty after tokenization")
        if params.method == "lucene":
            n = self.num_docs
            return {t: math.log(1.0 + (n - d + 0.5) / (d + 0.5)) for t, d in self.df.items()}
        from rank_bm25 import BM25Okapi

        # rank-bm25's own idf code (with its epsilon floor) over the merged frequencies
        okapi = BM25Okapi.__new__(BM25Okapi)
        okapi.corpus_size, okapi.epsilon, okapi.idf = self.num_docs, params.epsilon, {}
        okapi._calc_idf(dict(sorted(self.df.items())))
        return nonnegative_idf(okapi.idf)

    # -- persistence: sorted vocabulary + int64 counts ---------------------------------------
    def save(self, path: Path) -> None:
        """Write the statistics into ``path``, a new or empty folder (:func:`attnrank.files.check_new_folder`)."""
        check_new_folder(path, "CorpusStats.save")
        path.mkdir(parents=True, exist_ok=True)
        terms = sorted(self.df)
        (path / "terms.json").write_text(json.dumps(terms), encoding="utf-8")
        np.save(path / "df.npy", np.array([self.df[t] for t in terms], dtype=np.int64))
        (path / "totals.json").write_text(json.dumps({"num_docs": self.num_docs, "total_len": self.total_len}))

    @classmethod
    def load(cls, path: Path) -> CorpusStats:
        try:
            terms = json.loads((path / "terms.json").read_text(encoding="utf-8"))
            counts = np.load(path / "df.npy")
            totals = json.loads((path / "totals.json").read_text())
        except (OSError, ValueError) as e:
            raise IndexFormatError(
                f"global BM25 statistics at {path} cannot be read ({e}); rebuild the index"
            ) from None
        if len(terms) != len(counts):
            raise IndexFormatError(f"global BM25 statistics at {path} are inconsistent; rebuild the index")
        return cls(int(totals["num_docs"]), int(totals["total_len"]), Counter(dict(zip(terms, counts.tolist()))))


def block_stats(texts: Iterable[str], tokenizer: TokenizerConfig) -> CorpusStats:
    """Statistics of one block of texts (tokenized exactly as :class:`BM25Index` tokenizes)."""
    tok = make_tokenizer(tokenizer)
    stats = CorpusStats()
    for text in texts:
        terms = tok(text)
        stats.num_docs += 1
        stats.total_len += len(terms)
        stats.df.update(set(terms))
    return stats


def merge_stats(a: CorpusStats, b: CorpusStats) -> CorpusStats:
    """Merge two parts' statistics (associative and commutative; neither input is modified)."""
    df = Counter(a.df)
    df.update(b.df)
    return CorpusStats(a.num_docs + b.num_docs, a.total_len + b.total_len, df)


def merge_all(parts: Sequence[CorpusStats]) -> CorpusStats:
    """Merge any number of parts (a left fold of :func:`merge_stats`; order does not matter)."""
    return reduce(merge_stats, parts, CorpusStats())
