"""``attnrank index --passage-states``: block states of every passage, built with the index.

The states are those the block-attention reranker of the same ``--preset``/``--model``/
``--max-doc-words`` computes (:mod:`attnrank.llm.statestore`); ``search --rerank N --preset fused``
(or another preset with ``--attention block``) then reads them from the index instead of encoding the passages
(:func:`attnrank.rerank.over_index.index_reranker`, which ``search --rerank``, ``rerank --index`` and
``serve --index`` build their reranker with).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

import typer

from ..config import PASSAGE_STATES_FOLDER, STATE_STORAGES
from ..rerank.config import RerankConfig
from ..types import Document
from . import named_preset, option_errors

PASSAGE_STATES = typer.Option(
    None,
    "--passage-states",
    help=f"Also store every passage's block-attention states ({' | '.join(STATE_STORAGES)}) for "
    "`search --rerank N --preset fused` (block attention).",
)
STATES_PRESET = typer.Option(
    None,
    "--preset",
    callback=named_preset,
    help="With --passage-states: the reranking preset they serve (default: fused).",
)
STATES_DEFAULT_PRESET = "fused"  # the default preset computes no attention; fused is block attention already
STATES_MODEL = typer.Option(None, "--model", help="With --passage-states: the LLM (default: packaged SmolLM2).")
STATES_WORDS = typer.Option(None, "--max-doc-words", min=1, help="With --passage-states: words kept per passage.")
STATES_TOKENS = typer.Option(
    None, "--max-doc-tokens", min=1, help="With --passage-states: tokens kept per passage (after the word cut)."
)
STATES_DTYPE = typer.Option(
    None, "--dtype", help="With --passage-states: the LLM's precision they are computed in (default auto)."
)
STATES_HEADS = typer.Option(
    None,
    "--heads",
    help="With --passage-states: the heads of the searches they serve, as search's --heads (default: the preset's); "
    "the states keep the layers up to the deepest of them.",
)


def check_storage(storage: Optional[str]) -> None:
    if storage is not None and storage not in STATE_STORAGES:
        raise typer.BadParameter(f"--passage-states {storage!r} is not one of {', '.join(STATE_STORAGES)}")


def states_config(
    preset: Optional[str],
    model: Optional[str],
    max_doc_words: Optional[int],
    max_doc_tokens: Optional[int] = None,
    dtype: Optional[str] = None,
    heads: Optional[str] = None,
) -> RerankConfig:
    """The block-attention reranker configuration whose passage states ``--passage-states`` stores,
    checked (exit 2 for a preset that is not one, or computes no attention) before the corpus is read.
    (The token cut, the precision and the heads are the store's too: a search that sets them
    otherwise refuses the store, and none could be built for them. The heads count by their deepest
    layer, the last one the states keep.)"""
    overrides: dict[str, object] = {"attention": "block"}
    if model:
        overrides["model"] = model
    for name, value in (
        ("max_doc_words", max_doc_words),
        ("max_doc_tokens", max_doc_tokens),
        ("dtype", dtype),
        ("heads", heads),
    ):
        if value is not None:
            overrides[name] = value
    name = preset or STATES_DEFAULT_PRESET
    with option_errors():
        base = RerankConfig.preset(name)
    if not base.uses_attention:
        raise typer.BadParameter(
            f"--passage-states are block-attention states, and --preset {name} computes no attention; use "
            "--preset fused (block attention), or qrhead or icr and search with the same preset and --attention block"
        )
    with option_errors():
        return base.with_options(**overrides)


def state_writer(docs: Sequence[Document], storage: str, cfg: RerankConfig, progress: bool) -> Callable[[Path], object]:
    """A callback that writes the passage states of the reranker of ``cfg`` into an index build folder."""
    from ..rerank.attention import AttentionReranker  # torch: only once states are asked for

    reranker = AttentionReranker(config=cfg)
    reranker.check_passage_states(docs)  # (refused once the corpus was embedded, before)

    def write(folder: Path) -> None:
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(docs), desc="passage states", unit="doc")
        t = time.perf_counter()
        header = reranker.write_passage_states(
            folder / PASSAGE_STATES_FOLDER, docs, storage=storage, progress=None if bar is None else bar.update
        )
        if bar is not None:
            bar.close()
        size = sum(p.stat().st_size for p in (folder / PASSAGE_STATES_FOLDER).glob("*.npy"))
        typer.echo(
            f"passage states: {header['tokens']} tokens, {size / 2**20:.1f} MiB ({size / max(header['tokens'], 1):.0f} "
            f"bytes/token, {storage}) in {time.perf_counter() - t:.1f} s"
        )

    return write
