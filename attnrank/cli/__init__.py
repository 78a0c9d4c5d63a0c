"""The ``attnrank`` command line (Typer).

One module per concern; each registers its commands on :data:`app` when imported:

- :mod:`attnrank.cli.retrieval`: ``index``, ``search``, ``eval``
- :mod:`attnrank.cli.rerank`: ``rerank``
- :mod:`attnrank.cli.demo`: ``demo``
- :mod:`attnrank.cli.rag`: ``prune``, ``ask``
- :mod:`attnrank.cli.heads`: the ``heads`` sub-app (``show``); ``detect`` in :mod:`attnrank.cli.heads_detect`, ``train`` in :mod:`attnrank.cli.heads_train`
- :mod:`attnrank.cli.train`: ``train`` (the fusion weights of the default preset, or of ``fused``)
- :mod:`attnrank.cli.batch`: ``batch`` (Ray Data) and ``merge-shards``

:mod:`attnrank.cli.labelled` holds what the commands that learn from labelled queries share.

This module holds the app, the console entry point :func:`main` and the helpers the commands share.
Heavy modules (torch, transformers, FAISS) are imported inside the commands, so ``attnrank --help``
stays fast.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer

from ..errors import AttnrankError, InputError

app = typer.Typer(
    name="attnrank",
    help="Retrieve with BM25 + dense embeddings, rerank with an LLM (its query likelihood or its attention), prune and answer, and evaluate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # an option error is one plain 'Error: ...' line, not a box wrapped at 80 columns
)
logger = logging.getLogger("attnrank")

Quiet = typer.Option(False, "--quiet", "-q", help="No progress bars or info logs.")
Verbose = typer.Option(False, "--verbose", "-v", help="Log at INFO level.")
# the training commands' shared options (one declaration each, as Quiet and Verbose)
Device = typer.Option("cpu", help="cpu | cuda | cuda:N | auto.")
Folds = typer.Option(5, "--folds", help="k of the held-out k-fold report (>= 2).")
FoldSeed = typer.Option(0, "--seed", help="Fold shuffle seed.")
Save = typer.Option(True, "--save/--no-save", help="Register the result in the user registry.")
# ... and their labelled queries: a dataset of the shared data, or files of the user's own
Data = typer.Option(
    None, "--data", help="Shared data folder (niah/, scifact/, trec_dl/, hotpotqa/, locomo/); default $ATTNRANK_DATA."
)
Dataset = typer.Option(
    None, "--dataset", help="scifact (train qrels) | dl19 (NIST qrels, BM25 top-100) | hotpotqa | locomo."
)
Queries = typer.Option(None, "--queries", help="Queries file (instead of --dataset).")
Qrels = typer.Option(None, "--qrels", help="Qrels file, TREC or BEIR (instead of --dataset).")
Corpus = typer.Option(None, "--corpus", help="Corpus (instead of --dataset).")
SkipInvalid = typer.Option(
    False, "--skip-invalid", help="Skip the corpus's bad records (each reported) instead of failing."
)
Run = typer.Option(
    None,
    "--run",
    help="TREC run giving the candidates in first-stage order (default: BM25 over the corpus; with --dataset, "
    "DL19's BM25 run, HotpotQA's paragraphs and LoCoMo's turns by BM25, as the benchmarks rank them).",
)
TrainRun = typer.Option(
    None,
    "--run",
    help="TREC run giving the candidates in first-stage order (default: BM25 over the corpus; with --dataset, "
    "DL19's BM25 run, HotpotQA's paragraphs and LoCoMo's turns by BM25, as the benchmarks rank them; with "
    "--index/--index-dir the hits that search --rerank reranks).",
)
Rel = typer.Option(None, "--rel", help="Minimum relevant label (default 1; 2 for dl19).")
Verify = typer.Option(
    False,
    "--verify",
    help="Recompute the SHA-256 of every index file before use (slower; "
    "catches any changed byte, not only structural damage).",
)


def _setup(quiet: bool = False, verbose: bool = False) -> bool:
    level = logging.INFO if verbose and not quiet else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(level)  # basicConfig sets it once; a command may set up again (serve: INFO)
    logging.getLogger("attnrank").setLevel(level)
    if quiet:  # transformers draws its own weight-loading bars; it reads this when imported (lazily)
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        if "transformers" in sys.modules:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
    return not quiet


# ``--name`` was the index option of ``index`` (and an alias in ``search``); every command now says
# ``--index``. The old spelling still works, hidden from --help, with a warning.
OldName = typer.Option(None, "--name", hidden=True, help="Deprecated spelling of --index.")


def _index_name(index: Optional[str], old_name: Optional[str]) -> Optional[str]:
    """The index name from ``--index``, or from the deprecated ``--name`` (with a warning)."""
    if old_name is None:
        return index
    if index is not None and index != old_name:
        raise typer.BadParameter(f"--index {index!r} and --name {old_name!r} disagree; give --index only")
    logger.warning("--name is deprecated and will be removed; use --index %s", old_name)
    return old_name


def _index_path(name: Optional[str], index_dir: Optional[Path]) -> Path:
    from ..config import index_root

    if index_dir is not None and name:
        raise typer.BadParameter(f"give --index {name} or --index-dir {index_dir}, not both")
    if index_dir is not None:
        return index_dir
    if not name:
        raise typer.BadParameter(
            "give --index NAME (stored under ./indexes, or $ATTNRANK_INDEX_DIR) or --index-dir DIR"
        )
    if "/" in name or name.startswith("."):
        raise typer.BadParameter(f"index name {name!r} must be a plain name; use --index-dir for a path")
    # (" " made a folder named by a space, "a\nb" one whose name holds a line break)
    if name != name.strip() or not name.isprintable():
        raise typer.BadParameter(
            f"index name {name!r} is blank, has whitespace around it or holds a character that does not print "
            "(a control character, a line break, a space other than ' '); give a plain name such as 'scifact'"
        )
    return index_root() / name


def _positive(value: int, option: str, what: str, minimum: int = 1) -> int:
    """``value`` if it is at least ``minimum``, else an option error (exit 2) naming the user's value."""
    if value < minimum:
        raise typer.BadParameter(f"{option} {value} must be at least {minimum} ({what})")
    return value


def named_preset(value: str | None) -> str | None:
    """A ``--preset`` callback: a blank name is refused (the library reads "" as no preset, so
    ``--preset ""``, a shell variable left empty, ran the default without a word)."""
    if value is not None and not value.strip():
        raise typer.BadParameter("--preset is empty; give a preset's name, or leave --preset out for the default")
    return value


@contextmanager
def option_errors() -> Iterator[None]:
    """Inside, an :class:`InputError` (an option's value that the library refuses) is an option
    error: exit 2 with the usage hint, as the parser's own refusals are."""
    try:
        yield
    except InputError as e:
        raise typer.BadParameter(cli_words(str(e))) from None


# The library names its keyword and the option beside it, "skip_invalid=True (CLI: --skip-invalid)":
# on the command line the option alone is the one to pass.
_BOTH_SPELLINGS = re.compile(r"\b\w+=\S+ \(CLI: (--[\w-]+)\)")


def cli_words(message: str) -> str:
    """``message`` as the command line says it: where the library names a keyword with its option
    beside it, the option alone."""
    return _BOTH_SPELLINGS.sub(r"\1", message)


def check_prompt_window(max_prompt_tokens: Optional[int], model: Optional[str]) -> None:
    """``--max-prompt-tokens`` past ``model``'s context (read from its config alone): an option
    error before the corpus is read and the model loads (the library found it at the first prompt)."""
    if max_prompt_tokens is None:
        return
    from ..llm.models import check_prompt_budget  # (torch: only where a window is given)

    try:
        check_prompt_budget(max_prompt_tokens, model)
    except InputError as e:
        raise typer.BadParameter(str(e).replace("max_prompt_tokens=", "--max-prompt-tokens ", 1)) from None


def _check_heads(spec: Optional[str], option: str = "--heads", model: Optional[str] = None) -> None:
    """Read a head list or head file and check it against ``model``'s config (None: the default
    LLM) before any weights load; only the registered sets (``auto``) need the model itself."""
    word = "" if spec is None else spec.strip().lower()
    if spec is None or word in ("all", "auto", "auto-or-all") or word.startswith("auto:"):
        return  # (anything else beginning "auto", e.g. "autox", is read as a list below and refused)
    from ..rerank.resolve import check_head_list

    try:
        check_head_list(spec, model)
    except InputError as e:  # a head list or file that is wrong: an option error (exit 2)
        raise typer.BadParameter(f"{option} {spec!r}: {e}") from None
    except AttnrankError as e:  # the model's config could not be read
        raise AttnrankError(f"{option} {spec!r}: {e}") from None


def _check_output(path: Optional[Path], inputs: Optional[dict[str, Optional[Path]]] = None) -> None:
    """Fail before any work if ``-o PATH`` cannot be a file (a folder, or a parent is a file), is one
    of the ``inputs``, or would replace a non-empty file that is not a run attnrank wrote."""
    from .outputs import check_run_output

    check_run_output(path, inputs)


def _read_corpus(corpus: Path, skip_invalid: bool = False) -> list:
    """The corpus's documents; with ``skip_invalid`` its bad records are skipped and each one
    reported on stderr (the first 20), not silently dropped."""
    from ..corpus import load_corpus

    docs, report = load_corpus(corpus, skip_invalid=skip_invalid)
    if report.skipped:
        typer.echo(f"skipped {len(report.skipped)} invalid record(s):", err=True)
        for where, why in report.skipped[:20]:
            typer.echo(f"  {where}: {why}", err=True)
    return docs


def _check_index(name: Optional[str], index_dir: Optional[Path]) -> None:
    """The index of ``--index``/``--index-dir``, its manifest read and checked (format, its files'
    sizes) without loading it: an index is the command's input, named before its models are."""
    from ..index.store import read_manifest

    read_manifest(_index_path(name, index_dir))


def _load_index(name: Optional[str], index_dir: Optional[Path], verify: bool = False):
    from ..index.retriever import HybridRetriever

    return HybridRetriever.load(_index_path(name, index_dir), verify=verify)


def _check_rerank_prompts(config, results: list, depth: int) -> None:
    """What :func:`_rerank_heads` would refuse of an attention preset's prompts over the top
    ``depth`` of each of ``results``, found with the tokenizer before the model loads."""
    from ..rerank.precheck import check_prompts_before_load

    check_prompts_before_load(
        config, [r.query for r in results], [r.results[:depth] for r in results], [r.query_id for r in results]
    )


def _rerank_heads(reranker, results: list, depth: int, progress: bool) -> list:
    """Rerank the top ``depth`` of each of ``results`` (the rest keeps its order below them), every
    query checked first: a query the reranker refuses (too long for the likelihood, say) is named
    before the first is reranked, not after hundreds were and nothing was written."""
    reranker.check_batch(
        [r.query for r in results], [r.results[:depth] for r in results], [r.query_id for r in results]
    )
    todo = results
    if progress and len(results) > 1:  # rank() scores one query; the bar counts queries
        from tqdm.auto import tqdm

        todo = tqdm(results, desc="rerank", unit="q")
    return [_rerank_head(reranker, res, depth) for res in todo]


def _rerank_head(reranker, res, depth: int):
    """Rerank the top ``depth`` of ``res``; the rest keeps its order below them."""
    from dataclasses import replace

    from ..types import RankedResults

    head = reranker.rank(res.query, res.results[:depth], query_id=res.query_id)
    floor = min(head.scores, default=0.0)
    # keep the tail below the reranked head, in its first-stage order
    tail = [replace(d, score=floor - i) for i, d in enumerate(res.results[depth:], start=1)]
    return RankedResults(res.query, head.results + tail, res.query_id, stage=head.stage)


def _print_results(res) -> None:
    if not len(res):  # (nothing printed and exit 0 read as a failure to run)
        typer.echo("no hits (no indexed document shares a term with the query, or the index is empty)")
    for d in res:
        stages = " ".join(f"{k}={v:.3f}" for k, v in d.stage_scores.items())
        head = (d.title + ": " if d.title else "") + d.text
        typer.echo(f"{d.rank:>3}. {d.id}  {d.score:.4f}  [{stages}]\n     {head[:110]}")


def _os_message(e: OSError) -> str:
    """One line for an operating-system error: what failed, on which path, and what to do."""
    import errno

    where = f" {e.filename!s}" if e.filename else ""
    if e.filename2:
        where += f" -> {e.filename2!s}"
    hint = {
        errno.ENOSPC: "free some disk space and run again (existing indexes and files were kept)",
        errno.EDQUOT: "free some disk quota and run again (existing indexes and files were kept)",
        errno.EACCES: "check the permissions of that path",
        errno.EPERM: "check the permissions of that path",
        errno.EROFS: "write somewhere writable",
        errno.ENOTDIR: "a part of that path is a file, not a folder",
        errno.EISDIR: "give a file, not a folder",
        errno.ENOENT: "check the path",
        errno.EEXIST: "a file is in the way; choose another path",
        errno.ELOOP: "the path has a symbolic link loop; fix or remove the link",
    }.get(e.errno or 0, "")
    return f"{e.strerror or e}:{where}" + (f"; {hint}" if hint else "")


def main() -> None:
    """Console entry point. Exit codes: 0 success; 1 an attnrank error (bad input file, damaged
    index, a file system error), printed as one line ``error: ...``; 2 an option error (missing or
    invalid option values, reported by the command-line parser with a usage hint); 130 interrupted
    (Ctrl-C: the command-line parser ends it with nothing printed but the shell's ^C)."""
    try:
        app()
    except AttnrankError as e:
        typer.echo(f"error: {cli_words(str(e))}", err=True)
        sys.exit(1)
    except UnicodeDecodeError as e:
        typer.echo(
            f"error: an input file has bytes that are not valid UTF-8 ({e.reason} at byte {e.start}); "
            "re-encode it as UTF-8",
            err=True,
        )
        sys.exit(1)
    except OSError as e:
        typer.echo(f"error: {_os_message(e)}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


# Register the commands (after the shared names above exist: the modules import them from here).
from . import batch, demo, explain, heads, heads_detect, heads_train, rag, rerank, retrieval, serve, train  # noqa: F401

# `attnrank --help` lists the commands in workflow order, whatever the import order above (others last)
_ORDER = ("index", "search", "rerank", "eval", "train", "demo", "prune", "ask")


def _order(info) -> int:
    name = info.name or getattr(info.callback, "__name__", "")
    return _ORDER.index(name) if name in _ORDER else len(_ORDER)


app.registered_commands.sort(key=_order)

__all__ = ["app", "main"]
