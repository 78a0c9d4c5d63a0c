"""Reranking speed and quality by attention mode (used by ``scripts/bench_rerank.py --blocks``).

Modes, all with the same reranker configuration (preset ``qrhead``: attention alone over its
registered heads, ``signals=None``) and candidates:

- ``full``: today's capture — the whole prompt prefilled causally, then the two suffixes;
- ``block-cold``: block attention (:mod:`attnrank.llm.blocks`) with no cached passage state:
  every block is encoded for this query;
- ``block-warm``: block attention with every candidate's state already in memory (the query
  was ranked once before): only the two suffixes run.

Submodules:

- :mod:`.timing`: seconds per query, cell by cell in fresh processes or the modes interleaved
- :mod:`.quality`: nDCG@10 of each mode on the same candidate sets, against a reference mode
- :mod:`.stores`: the passage-state store's bytes per token and sizes, and a real store built
- :mod:`.__main__`: one speed cell, ``python -m attnrank.speed DATASET ROOT K MODE DTYPE N``
"""

from .timing import measure_interleaved, probe_gflops

__all__ = ["measure_interleaved", "probe_gflops"]
