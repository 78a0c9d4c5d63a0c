"""``attnrank heads detect``: retrieval heads of a model, detected (QRHead's query-focused
scores, or Wu et al.'s copy-paste) and registered for ``--heads auto``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..config import COPY_DEPTHS, COPY_HAYSTACK, COPY_LENGTHS, COPY_MAX_NEW_TOKENS, check_precision_names
from ..errors import AttnrankError
from ..heads.queryfocused import QR_METHODS
from . import (
    Corpus,
    Data,
    Dataset,
    Device,
    Qrels,
    Queries,
    Quiet,
    Rel,
    Run,
    Save,
    SkipInvalid,
    Verbose,
    _setup,
    option_errors,
)
from .heads import heads_app
from .labelled import LabelledSource, check_saveable, labelled_set, relevant
from .options import Dtype, MaxDocTokens, MaxDocWords, truncation


def _numbers(text: str, what: str, kind: type = int) -> list:
    """Comma-separated ``kind`` values (``int`` token lengths, ``float`` depth percentages)."""
    example = "1000,2000" if kind is int else "0,50,100"
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{what} {text!r} must be comma-separated {kind.__name__}s, e.g. {example}") from None
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:  # (each trial ran twice, counted twice in the scores)
        raise typer.BadParameter(f"{what} {text!r} gives {', '.join(map(str, twice))} twice; give each once")
    return values


def _listed(values: tuple) -> str:
    """``values`` as an option takes them: comma-separated."""
    return ",".join(map(str, values))


@heads_app.command("detect")
def heads_detect(
    method: str = typer.Option(
        "qr",
        "--method",
        help="qr (QRHead QRScore + per-head nDCG@10 + CoRe contrastive) | copy (Wu et al. NIAH copy-paste).",
    ),
    model: Optional[str] = typer.Option(None, help="LLM: HF id, local path or .gguf (default: packaged SmolLM2-135M)."),
    data: Optional[Path] = Data,
    dataset: Optional[str] = Dataset,
    queries: Optional[Path] = Queries,
    qrels: Optional[Path] = Qrels,
    corpus: Optional[Path] = Corpus,
    skip_invalid: bool = SkipInvalid,
    run: Optional[Path] = Run,
    depth: Optional[int] = typer.Option(None, "--depth", help="qr: candidates per query (default 20)."),
    max_queries: Optional[int] = typer.Option(
        None, "--max-queries", help="qr: labelled queries used (default 128, as QRHead; 0: all)."
    ),
    rel: Optional[int] = Rel,
    top: int = typer.Option(
        16, "--top", help="Heads registered per method (copy: at most these, of those that copied at all)."
    ),
    lengths: Optional[str] = typer.Option(
        None, "--lengths", help=f"copy: context lengths in tokens (default {_listed(COPY_LENGTHS)})."
    ),
    depths: Optional[str] = typer.Option(
        None, "--depths", help=f"copy: needle depths in % of the haystack (default {_listed(COPY_DEPTHS)})."
    ),
    haystack: Optional[str] = typer.Option(
        None, "--haystack", help="copy: book (Retrieval_Head haystacks; default) | essays (Paul Graham)."
    ),
    max_new_tokens: Optional[int] = typer.Option(
        None, "--max-new-tokens", help=f"copy: greedy answer length limit (default {COPY_MAX_NEW_TOKENS})."
    ),
    max_doc_words: Optional[int] = MaxDocWords,
    max_doc_tokens: Optional[int] = MaxDocTokens,
    device: str = Device,
    dtype: str = Dtype,
    save: bool = Save,
    name: Optional[str] = typer.Option(
        None,
        "--name",
        help="Register each set as NAME-METHOD (default: METHOD); a registered set of that name is replaced.",
    ),
    quiet: bool = Quiet,
    verbose: bool = Verbose,
) -> None:
    """Detect retrieval heads of a model and register them (used by --heads auto).

    --method qr reads labelled queries (--dataset, or --queries, --qrels and --corpus, with
    --run, --depth, --max-queries and --rel; --max-doc-words and --max-doc-tokens cut each candidate as
    the reranker does); --method copy reads the needle data in --data."""
    progress = _setup(quiet, verbose)
    if method not in ("qr", "copy"):
        raise typer.BadParameter(f"--method {method!r} is not qr or copy")
    if top < 1:
        raise typer.BadParameter(f"--top {top} must be at least 1 (heads registered)")
    if name is not None and (not name.strip() or not save):
        raise typer.BadParameter(
            f"--name {name!r} names the registered sets: give a non-empty name, without --no-save"
            if save
            else "--name names the registered sets, but --no-save registers none; drop one"
        )
    check_saveable(model, save)  # a registry file the save would refuse: named before the detection runs
    qr_only = {
        "--dataset": dataset,
        "--queries": queries,
        "--qrels": qrels,
        "--corpus": corpus,
        "--run": run,
        "--rel": rel,
        "--depth": depth,
        "--max-queries": max_queries,
        "--skip-invalid": skip_invalid or None,
        "--max-doc-words": max_doc_words,
        "--max-doc-tokens": max_doc_tokens,
    }
    copy_only = {"--lengths": lengths, "--depths": depths, "--haystack": haystack, "--max-new-tokens": max_new_tokens}
    other = copy_only if method == "qr" else qr_only
    given = [o for o, v in other.items() if v is not None]
    if method == "qr" and given:  # (copy names them after its data folder, as it did)
        raise typer.BadParameter(f"{', '.join(given)} configure(s) --method copy, not qr; drop them")
    with option_errors():  # (found by load_llm, after the data was read)
        check_precision_names(device, dtype)
    if save:  # (a detection of hours replaced an earlier one of the same name, said only once it had run)
        _say_replaced(model, [_set_name(name, m) for m in (QR_METHODS if method == "qr" else ("copy",))], name)
    if method == "copy":
        results = _detect_copy(
            model,
            device,
            dtype,
            data,
            _listed(COPY_LENGTHS) if lengths is None else lengths,
            _listed(COPY_DEPTHS) if depths is None else depths,
            COPY_HAYSTACK if haystack is None else haystack,
            COPY_MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens,
            given,
        )
    else:
        source = LabelledSource(
            dataset,
            data,
            queries,
            qrels,
            corpus,
            run,
            20 if depth is None else depth,
            128 if max_queries is None else max_queries,
            rel,
            skip_invalid,
        )
        results = _detect_qr(model, device, dtype, progress, source, truncation(max_doc_words, max_doc_tokens))
    for label, res in results.items():  # every method's result shown before any is saved
        ranked = ", ".join(f"{l}-{h} {v:.3f}" for (l, h), v in res.ranked()[:top])
        typer.echo(f"{label}: {ranked or res.note}")
    if save:
        _save_results(results, top, name)


def _save_results(results: dict, top: int, name: str | None) -> None:
    """Register each method's set (its best ``top`` heads; copy: those that copied at all), say
    where heads tie at the cut, and which set ``--heads auto`` now reads; an error where none was saved."""
    from ..heads.scores import RETRIEVAL_THRESHOLD
    from ..registry import load_head_sets

    saved = None
    for label, res in results.items():
        scored = [v for _, v in res.ranked()]
        if res.n_used and len(set(scored)) <= 1:  # every head alike: the "top" would be the first ones
            typer.echo(f"{label}: not saved: every head scored the same")
            continue
        if not res.n_used:
            continue
        heads = res.top_positive(top) if res.method == "copy" else res.top(top)  # (a head that never copied: none)
        if not heads:
            typer.echo(f"{label}: not saved: no head copied")
            continue
        if len(scored) > len(heads) and scored[0] == scored[len(heads)]:
            # every head of the set ties with one left out: the set would be the first heads in layer order,
            # and --heads auto would read it (2 queries: every qr-ndcg head 0.807, saved and read by auto)
            typer.echo(
                f"{label}: not saved: its best {len(heads)} heads all scored {scored[0]:.3f}, as heads past them did, "
                "so the set would be the first heads in layer order; detect on more queries or trials"
            )
            continue
        path = res.save(heads=heads, name=_set_name(name, res.method))
        if res.method == "copy":
            strong = len(set(heads) & set(res.above(RETRIEVAL_THRESHOLD)))
            typer.echo(
                f"{label}: saved the {len(heads)} best heads that copied at all (of the top {top} asked; "
                f"{strong} above Wu et al.'s retrieval-head threshold {RETRIEVAL_THRESHOLD}) to {path}"
            )
        elif len(heads) < top:  # (--top past the model's heads: every head, which "saved top 1000" hid)
            typer.echo(f"{label}: saved all {len(heads)} heads of the model (--top {top} asks for more) to {path}")
        else:
            typer.echo(f"{label}: saved top {top} to {path}")
        cut = len(heads)
        if len(scored) > cut and scored[cut - 1] == scored[cut] and (res.method != "copy" or scored[cut] > 0):
            typer.echo(  # (few queries or trials: scores tie at the cut)
                f"{label}: note: heads scored {scored[cut]:.3f} both in and past the {cut} saved; the set breaks the "
                "tie by layer and head order: detect on more queries or trials to tell them apart"
            )
        saved = res
    if saved is not None:  # the user's sets come first: a copy-paste set outranks a shipped query-focused one
        best = load_head_sets(saved.model_id, saved.fingerprint)[0]
        typer.echo(
            f"--heads auto now reads the {best.source} set {best.name!r} ({best.method}, {len(best.heads)} heads); "
            "--heads auto:METHOD reads another method's set"
        )
    else:  # (exit 0 read as a registered set: --heads auto still reads the one it read before)
        raise AttnrankError(
            "no head set was saved (see above); --heads auto reads what it read before: detect with more queries "
            "or another --method, or pass --no-save to only look"
        )


def _set_name(name: str | None, method: str) -> str:
    """The registry name of ``method``'s set: ``NAME-METHOD`` with ``--name``, else the method's."""
    return method if name is None else f"{name.strip()}-{method}"


def _say_replaced(model: str | None, names: list[str], given: str | None) -> None:
    """Warn, before the detection runs, of the user's registered sets it will replace (by name;
    ``given``: the ``--name`` given, if any)."""
    from ..llm.models import unloaded_model
    from ..registry import load_head_sets

    model_id, fingerprint = unloaded_model(model)
    keep = "give another --name to keep it" if given else "give --name to keep it"
    for s in load_head_sets(model_id, fingerprint):
        if s.source == "user" and (s.model_id, s.fingerprint) == (model_id, fingerprint) and s.name in names:
            typer.echo(
                f"warning: this detection replaces the registered set {s.name!r} of {model_id} (detected "
                f"{s.date}{' on ' + s.data if s.data else ''}); {keep}",
                err=True,
            )


def _detect_copy(model, device, dtype, data, lengths, depths, haystack, max_new_tokens, qr_given=()) -> dict:
    """Wu et al.'s copy-paste detection; every option and the NIAH data checked before the model loads
    (``qr_given``: options of ``--method qr`` the user gave, which copy would ignore)."""
    from ..heads.copypaste import check_copy_inputs, check_copy_lengths, detect_copy_heads
    from ..heads.niah import load_needles, niah_folder
    from ..heads.scores import RETRIEVAL_THRESHOLD
    from ..llm.headspec import format_heads
    from ..llm.modelconfig import model_context_length
    from ..llm.models import load_llm
    from ..llm.tokenizers import load_tokenizer

    lens, deps = _numbers(lengths, "--lengths"), _numbers(depths, "--depths", float)
    if not lens or min(lens) < 1:
        raise typer.BadParameter(f"--lengths {lengths!r} must be token counts >= 1, e.g. 1000,2000")
    if not deps or not all(0 <= d <= 100 for d in deps):
        raise typer.BadParameter(f"--depths {depths!r} must be percentages in [0, 100], e.g. 0,50,100")
    if haystack not in ("book", "essays"):
        raise typer.BadParameter(f"--haystack {haystack!r} is not book or essays")
    if max_new_tokens < 1:
        raise typer.BadParameter(f"--max-new-tokens {max_new_tokens} must be at least 1")
    load_needles(niah_folder(data))  # the data folder first, then the options, then every haystack file
    if qr_given:
        raise typer.BadParameter(f"{', '.join(qr_given)} configure(s) --method qr, not copy; drop them")
    inputs = check_copy_inputs(data, haystack, None, deps, lens, max_new_tokens)  # all of it before the model loads
    context = model_context_length(model)
    if context is not None and max(lens) + max_new_tokens > context:  # positions the model was never trained on
        raise typer.BadParameter(
            f"--lengths {max(lens)} plus --max-new-tokens {max_new_tokens} exceeds the {context}-token context of "
            f"{model or 'the default model'}; give lengths up to {context - max_new_tokens}"
        )
    check_copy_lengths(load_tokenizer(model), inputs, haystack)  # the tokenizer only, not the model
    llm = load_llm(model, dtype=dtype, device=device)
    result = detect_copy_heads(
        llm, data=data, lengths=lens, depths=deps, haystack=haystack, max_new_tokens=max_new_tokens
    )
    typer.echo(f"copy-paste detection: {result.data} ({result.seconds:.1f} s)")
    if result.note:
        raise AttnrankError(result.note)
    typer.echo(f"heads with score > {RETRIEVAL_THRESHOLD}: {format_heads(result.above()) or 'none'}")
    return {"copy": result}


def _detect_qr(model, device, dtype, progress, source: LabelledSource, cut):
    """QRHead detection; the labelled queries and candidates of ``source`` are read before the
    model loads (``cut``: the reranker's truncation options given)."""
    from ..heads.queryfocused import detect_query_focused
    from ..llm.models import load_llm
    from ..rerank.attention import AttentionReranker

    depth = source.depth
    if depth < 1:
        raise typer.BadParameter(f"--depth {depth} must be at least 1 (candidates per query)")
    qs, cands, qr, rel, desc = labelled_set(source)
    if not qs:
        raise AttnrankError(f"{desc}: no labelled query has candidates; give queries, qrels and a corpus that match")
    # a query without a judged candidate scores 0 on every head: it cannot rank them (dropping it
    # keeps their order), and with none left every head tied at 0 and the first ones were registered.
    # (Judged, not >= --rel: qr-ndcg's graded gains read a grade-1 candidate at --rel 2 too)
    found = {q: t for q, t in qs.items() if any(relevant(q, cands, qr, 1))}
    if not found:
        raise typer.BadParameter(
            f"{desc}: no labelled query has a relevant document among its top-{depth} candidates, so no head can "
            "be told from another; raise --depth, or give a run that retrieves the judged documents"
        )
    if len(found) < len(qs):
        typer.echo(f"{len(qs) - len(found)} of {len(qs)} queries have no relevant candidate; detecting on {len(found)}")
    qs = found
    _check_prompts(model, qs, cands, cut)
    llm = load_llm(model, dtype=dtype, device=device)
    reranker = AttentionReranker(llm, None, signals=None, **cut)
    return detect_query_focused(reranker, qs, cands, qr, rel=rel, data=desc, show_progress=progress)


def _check_prompts(model, qs: dict, cands: dict, cut: dict) -> None:
    """A query whose candidate no detection prompt holds, found with the tokenizer before the model
    loads (it failed after the load, advising a max_prompt_tokens that heads detect has no option for)."""
    from ..errors import PromptTooLong
    from ..rerank.config import RerankConfig
    from ..rerank.precheck import check_prompts_before_load

    ids = list(qs)
    config = RerankConfig(model=model, heads="all", signals=None, **cut)  # (the detection's reranker)
    try:
        check_prompts_before_load(config, [qs[q] for q in ids], [cands[q] for q in ids], ids)
    except PromptTooLong as e:
        raise typer.BadParameter(f"{e.fault}; shorten the query, or lower --max-doc-words / --max-doc-tokens") from None
