"""Why each passage ranked where it did: per-token calibrated attention of the scoring heads.

- :mod:`attnrank.explain.tokens`: :func:`explain_results` turns the per-token evidence that
  :meth:`AttentionReranker.rank(..., return_evidence=True)
  <attnrank.rerank.attention.AttentionReranker.rank>` records into :class:`PassageExplanation`
  objects whose counted token scores add up to the passage score.
- :mod:`attnrank.explain.render`: a self-contained HTML heat-map page and a PNG (extra ``plot``).
"""

from __future__ import annotations

from .tokens import PassageExplanation, TokenScore, check_explainable, explain_results

__all__ = ["PassageExplanation", "TokenScore", "check_explainable", "explain_results"]
