"""The reranker of an index's own documents (``search --rerank``, ``rerank --index``, ``serve
--index``): what the index holds for them is read, not computed again."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..config import PASSAGE_STATES_FOLDER
from ..llm.models import LLM
from ..llm.statestore import StoreDamagedError, StoreSetupError
from .attention import AttentionReranker
from .config import RerankConfig

logger = logging.getLogger(__name__)


def index_reranker(
    config: RerankConfig, index: str | Path, retriever: Any, llm: LLM | None = None
) -> AttentionReranker:
    """The reranker of the documents of the index folder ``index`` (loaded as ``retriever``; on
    ``llm`` if given, else the configuration's model): the index's stored passage states attached
    where ``config`` reads block states at reusable positions and names no store itself (a store
    the setup cannot use, or cannot read, is warned of and skipped: it was not asked for), and the candidates'
    dense signal read from the index's vectors rather than embedded again."""
    stored = Path(index) / PASSAGE_STATES_FOLDER
    attach = config.attention == "block" and config.block_positions != "sequential"  # (sequential: none reused)
    found = attach and config.passage_states is None and stored.is_dir()
    try:
        reranker = AttentionReranker(llm, config=config.with_options(passage_states=str(stored)) if found else config)
    except (StoreSetupError, StoreDamagedError) as e:  # the index's own store, attached unasked: not for this setup
        if not found:
            raise
        # (the fault alone: the error's advice, to drop --passage-states, named an option the user never gave)
        logger.warning("not reading the index's passage states: %s; the passages are encoded afresh", e.fault)
        reranker = AttentionReranker(llm, config=config)
    reranker.use_index(retriever)  # the hits' dense signal from the index's vectors, not a second embedding
    return reranker
