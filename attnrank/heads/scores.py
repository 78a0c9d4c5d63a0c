"""Per-head detection scores (:class:`HeadScores`), the one result type of every detector in
:mod:`attnrank.heads.copypaste` and :mod:`attnrank.heads.queryfocused`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..llm.headspec import HeadList
from ..registry_save import save_head_set
from ..types import is_count

RETRIEVAL_THRESHOLD = 0.1  # Wu et al.: heads with RS_h > 0.1 are retrieval heads


@dataclass
class HeadScores:
    """Per-head detection scores: ``scores[layer, head]`` (NaN = not measured), with how they
    were obtained. ``n_used`` counts accepted trials (copy) or usable queries (qr); ``adapter``:
    the head adapter merged into the model they were measured on (:attr:`LLM.adapter
    <attnrank.llm.models.LLM.adapter>`; such scores are not saved as the base model's)."""

    scores: np.ndarray
    method: str
    params: dict[str, Any] = field(default_factory=dict)
    data: str = ""
    seconds: float = 0.0
    n_total: int = 0
    n_used: int = 0
    note: str = ""
    model_id: str = ""
    fingerprint: str = ""
    trials: list[dict[str, Any]] = field(default_factory=list)
    adapter: str = ""

    def ranked(self) -> list[tuple[tuple[int, int], float]]:
        """Measured heads, best first (ties: lower layer, then head)."""
        s = np.asarray(self.scores, dtype=np.float64)
        items = [((int(l), int(h)), float(s[l, h])) for l, h in zip(*np.nonzero(np.isfinite(s)))]
        return sorted(items, key=lambda kv: (-kv[1], kv[0]))

    def top(self, n: int = 16) -> HeadList:
        """The ``n`` best heads (empty when nothing could be measured, see :attr:`note`)."""
        _check_n(n)
        return [pair for pair, _ in self.ranked()[:n]]

    def top_positive(self, n: int = 16) -> HeadList:
        """The ``n`` best heads that scored above 0: for copy-paste scores, a head that never
        copied is no retrieval head (``top`` filled a set with them, tied at 0, in head order)."""
        _check_n(n)  # (n=-1 returned all but the weakest: a Python slice)
        return [pair for pair, v in self.ranked() if v > 0][:n]

    def above(self, threshold: float = RETRIEVAL_THRESHOLD) -> HeadList:
        """Heads scoring strictly above ``threshold``, best first."""
        return [pair for pair, v in self.ranked() if v > threshold]

    def save(
        self, n: int = 16, *, heads: HeadList | None = None, name: str | None = None, root: Path | None = None
    ) -> Path:
        """Register ``heads`` (default: the top ``n``) with the full score matrix."""
        heads = self.top(n) if heads is None else heads
        if self.adapter:
            raise InputError(
                f"these {self.method} heads were measured on {self.model_id!r} with head adapter {self.adapter} "
                "merged in, and the registry keys head sets by the base weights' fingerprint, whose heads they "
                "are not; detect on the model without the adapter to register a set"
            )
        if not heads:
            raise InputError(
                f"no {self.method} heads to save for {self.model_id!r}: {self.note or 'no head has a finite score'}"
            )
        return save_head_set(
            self.model_id,
            self.fingerprint,
            self.method,
            heads,
            name=name,
            scores=self.scores,
            data=self.data,
            root=root,
            params={
                **self.params,
                "top": len(heads),
                "n_total": self.n_total,
                "n_used": self.n_used,
                "seconds": round(self.seconds, 2),
            },
        )


def _check_n(n: Any) -> None:
    if not is_count(n):
        raise InputError(f"n={n!r} heads: give a whole number >= 1 (the number of best heads to keep)")
