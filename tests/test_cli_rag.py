"""The ``ask`` command's checks before any model or index loads."""

from __future__ import annotations

import re

import pytest
from _cli import cli_text
from _tiny import save_tiny
from typer.testing import CliRunner

from attnrank.cli import app

runner = CliRunner()


def test_ask_reads_the_model_config_once_for_both_head_options(tmp_path, monkeypatch):
    """--heads and --prune-heads are both checked against the model's shape: one config read."""
    from transformers import AutoConfig

    model = save_tiny(tmp_path / "model", layers=3)  # a path no earlier test has read
    read, original = [], AutoConfig.from_pretrained

    def counted(source, *args, **kwargs):
        read.append(str(source))
        return original(source, *args, **kwargs)

    monkeypatch.setattr(AutoConfig, "from_pretrained", counted)
    args = ["ask", "q", "--index-dir", str(tmp_path / "no-index"), "--model", str(model)]
    r = runner.invoke(app, [*args, "--heads", "2-3", "--prune-heads", "0-0,1-1"])
    assert r.exit_code == 1 and "no-index" in r.output + str(r.exception)  # stopped at the index, after both checks
    assert read == [str(model)]


class _Stop(Exception):
    pass


def test_ask_prunes_with_the_pruners_own_settings_unless_given(tmp_path, monkeypatch, built_retriever):
    """A reranking preset's block attention was handed to the pruner (and --state-cache-mb never
    was), so `ask` pruned otherwise than `attnrank prune` and Pipeline.from_model with the same flags."""
    from attnrank.pipeline import Pipeline
    from attnrank.prune.config import PruneConfig

    built_retriever.save(tmp_path / "ix")
    seen: list[PruneConfig] = []

    def capture(*args, prune=None, **kwargs):
        seen.append(prune)
        raise _Stop

    monkeypatch.setattr(Pipeline, "from_model", staticmethod(capture))
    base = ["ask", "vitamin D?", "--index-dir", str(tmp_path / "ix"), "-q"]
    runner.invoke(app, [*base, "--preset", "fused"])
    runner.invoke(app, [*base, "--no-rerank", "--attention", "block", "--state-cache-mb", "64"])
    default = PruneConfig()
    assert (seen[0].attention, seen[0].block_positions, seen[0].state_cache_mb) == (
        default.attention,
        default.block_positions,
        default.state_cache_mb,
    )
    assert (seen[1].attention, seen[1].block_positions, seen[1].state_cache_mb) == ("block", "rotated", 64)


def test_ask_names_a_missing_profile_or_probe_before_any_model_loads(home, tmp_path, monkeypatch, built_retriever):
    """--reorder without a registered slot profile and --method probe without a probe were named
    only after the model had loaded."""
    from attnrank.llm import models

    model = save_tiny(tmp_path / "model", layers=2)
    built_retriever.save(tmp_path / "ix")
    loads: list[object] = []
    monkeypatch.setattr(models, "_load_cached", lambda *a: loads.append(a))
    base = ["ask", "vitamin D?", "--index-dir", str(tmp_path / "ix"), "--model", str(model), "-q"]
    r = runner.invoke(app, [*base, "--reorder"])
    assert r.exit_code == 1 and "slot profile" in str(r.exception)
    r = runner.invoke(app, [*base, "--method", "probe"])
    assert r.exit_code == 1 and "sentence probe" in str(r.exception)
    assert loads == []


def test_ask_refuses_a_budget_no_sentence_fits_before_any_model_loads(home, tmp_path, monkeypatch, built_retriever):
    """The refusal came after the model had loaded and reranked (22 s with the default model):
    reranking keeps some of the candidates, so a budget below every sentence of all of them is
    refused before; without reranking, the first stage's top k are the passages pruned."""
    from attnrank.llm import models

    model = save_tiny(tmp_path / "model", layers=2, max_positions=16384)  # (room for whole abstracts)
    built_retriever.save(tmp_path / "ix")
    loads: list[object] = []
    monkeypatch.setattr(models, "_load_cached", lambda *a: loads.append(a))
    base = ["ask", "vitamin D?", "--index-dir", str(tmp_path / "ix"), "--model", str(model), "-k", "2", "-q"]
    r = runner.invoke(app, [*base, "--depth", "4", "--budget-tokens", "1"])
    assert r.exit_code == 1 and "no sentence of the 4 candidates fits the budget of 1 tokens" in str(r.exception)
    r = runner.invoke(app, [*base, "--no-rerank", "--keep-ratio", "0.0001"])
    assert r.exit_code == 1 and "keeps 0 tokens; raise keep_ratio (--keep-ratio)" in str(r.exception)
    assert loads == []


def test_ask_takes_neighbours_as_the_python_api_does(tmp_path, monkeypatch, built_retriever):
    """Pipeline(neighbours=...) had no CLI option in ask (prune had one)."""
    from attnrank.pipeline import Pipeline

    built_retriever.save(tmp_path / "ix")
    seen: list[dict] = []

    def capture(*args, **kwargs):
        seen.append(kwargs)
        raise _Stop

    monkeypatch.setattr(Pipeline, "from_model", staticmethod(capture))
    base = ["ask", "vitamin D?", "--index-dir", str(tmp_path / "ix"), "-q"]
    runner.invoke(app, [*base, "--neighbours", "2"])
    runner.invoke(app, base)
    assert [s["neighbours"] for s in seen] == [2, 0]
    r = runner.invoke(app, [*base, "--no-prune", "--neighbours", "1"])
    assert r.exit_code == 2 and "--neighbours" in r.output


def test_prune_has_an_option_for_every_pruner_setting(tmp_path, monkeypatch, dl19_mini):
    """`attnrank prune` had only --model, --heads, --method and --attention: the device, dtype,
    block positions, state cache, calibration, filters, prompt and sentence settings of
    PruneConfig could not be set from the command line."""
    from attnrank.prune import pruner

    seen = []

    def capture(self, *args, config=None, **kwargs):
        seen.append((args, config, kwargs))
        raise _Stop

    monkeypatch.setattr(pruner.ContextPruner, "__init__", capture)
    corpus = ["prune", "q", "--corpus", str(dl19_mini / "passages.jsonl"), "--budget-tokens", "9"]
    flags = [
        "--no-calibrate", "--token-filter", "--sink", "--length-norm", "none", "--instruction", "ie",
        "--order", "forward", "--focus-hint", "It is", "--max-sentence-words", "12", "--max-prompt-tokens",
        "500", "--device", "CPU", "--dtype", "float32", "--attention", "block", "--block-positions",
        "shared", "--state-cache-mb", "8", "--method", "focus", "--heads", "all",
    ]  # fmt: skip
    r = runner.invoke(app, [*corpus, *flags])
    assert isinstance(r.exception, _Stop), r.output
    ((args, config, kwargs),) = seen
    assert not args and not kwargs
    got = {k: getattr(config, k) for k in ("calibrate", "token_filter", "sink", "length_norm", "instruction")}
    assert got == {"calibrate": False, "token_filter": True, "sink": True, "length_norm": "none", "instruction": "ie"}
    assert (config.order, config.focus_hint, config.max_sentence_words, config.max_prompt_tokens) == (
        "forward", "It is", 12, 500,
    )  # fmt: skip
    assert (config.device, config.dtype, config.attention, config.block_positions, config.state_cache_mb) == (
        "cpu", "float32", "block", "shared", 8,
    )  # fmt: skip
    assert (config.method, config.heads) == ("focus", "all")
    r = runner.invoke(app, [*corpus, "--method", "probe", "--length-norm", "none"])
    assert r.exit_code == 2 and "--length-norm 'none' would be ignored" in cli_text(r)
    r = runner.invoke(app, [*corpus, "--order", "sideways"])
    assert r.exit_code == 2 and "order='sideways' is not one of" in cli_text(r)


def test_ask_refuses_block_options_no_stage_reads(tmp_path, built_retriever):
    """With --no-rerank the pruner alone reads --attention, and --block-positions and
    --state-cache-mb only in block mode: otherwise they were accepted and sized nothing."""
    built_retriever.save(tmp_path / "ix")
    base = ["ask", "vitamin D?", "--index-dir", str(tmp_path / "ix"), "-q", "--no-rerank"]
    r = runner.invoke(app, [*base, "--block-positions", "shared"])
    assert r.exit_code == 2 and "--block-positions configure(s) block attention" in cli_text(r)
    r = runner.invoke(app, [*base, "--state-cache-mb", "0"])
    assert r.exit_code == 2 and "--state-cache-mb" in r.output
    r = runner.invoke(app, [*base, "--no-prune", "--attention", "block"])
    assert r.exit_code == 2 and "--no-rerank --no-prune turns both attention stages off" in cli_text(r)
    # a reranker without attention leaves them to the pruner: with --no-prune, to no stage
    on = [a for a in base if a != "--no-rerank"]
    r = runner.invoke(app, [*on, "--preset", "signals", "--no-prune", "--attention", "block"])
    assert r.exit_code == 2 and "--no-prune turns pruning off, but --attention configure(s) it" in cli_text(r)
    # nothing but the answer runs: --model was read by no stage, and the answer came from --generator-model
    r = runner.invoke(app, [*base, "--no-prune", "--generator-model", "g", "--model", "/no/such/model"])
    assert r.exit_code == 2 and "--model is read by no stage" in cli_text(r), cli_text(r)


@pytest.fixture
def served(monkeypatch) -> list:
    """The (reranker config, pruner config) pairs `attnrank serve` builds its engine with; the
    command stops there (_Stop), before any model or socket."""
    pytest.importorskip("uvicorn")
    from attnrank.serve import engine

    seen: list = []

    def capture(rerank, *, index=None, prune=True, **kwargs):
        seen.append((rerank, prune))
        raise _Stop

    monkeypatch.setattr(engine, "build_engine", capture)
    return seen


def test_serve_builds_its_pruner_as_ask_does(served):
    """The server's pruner took only the reranker's heads: --attention, --block-positions and
    --state-cache-mb reached the reranker alone."""
    seen = served
    r = runner.invoke(app, ["serve", "--preset", "fused", "--attention", "block", "--state-cache-mb", "32"])
    assert isinstance(r.exception, _Stop), r.output
    r = runner.invoke(app, ["serve", "--preset", "fused", "--heads", "0-1"])
    assert isinstance(r.exception, _Stop), r.output
    (rerank, prune), (_, plain) = seen
    assert (prune.attention, prune.state_cache_mb, prune.block_positions) == ("block", 32, "rotated")
    assert (prune.model, prune.dtype, prune.heads) == (rerank.model, rerank.dtype, "all")
    # a preset's block attention is the reranker's; the pruner reads every head, as ask's does
    # without --prune-heads (it read the reranker's --heads)
    assert plain.attention == "full" and plain.heads == "all"
    # --quiet: no info logs (the access log's line per request either), as every command's (it had none)
    import logging

    access = logging.getLogger("attnrank.serve.access")
    access.setLevel(logging.NOTSET)
    r = runner.invoke(app, ["serve", "--quiet"])
    assert isinstance(r.exception, _Stop), r.output
    assert access.level != logging.INFO and logging.getLogger("attnrank").level == logging.WARNING


def test_block_attention_reaches_the_pruner_beside_a_reranker_without_attention(served):
    """--preset likelihood --attention block was refused (the reranker computes no attention), so
    the default reranker could not run beside a block-attention pruner."""
    seen = served
    block = ["--attention", "block", "--block-positions", "shared", "--state-cache-mb", "32"]
    r = runner.invoke(app, ["serve", "--preset", "likelihood", *block])
    assert isinstance(r.exception, _Stop), r.output
    ((rerank, prune),) = seen
    assert rerank.name == "likelihood" and not rerank.uses_attention and rerank.state_cache_mb == 32
    assert (prune.attention, prune.block_positions, prune.state_cache_mb) == ("block", "shared", 32)
    # the positions alone configure no stage that runs: refused, as before
    r = runner.invoke(app, ["serve", "--preset", "likelihood", "--block-positions", "shared"])
    assert r.exit_code == 2 and "--block-positions configure(s) block attention, which neither" in cli_text(r)
    r = runner.invoke(app, ["serve", "--preset", "likelihood", "--heads", "0-1"])  # the reranker's own: refused
    assert r.exit_code == 2 and "--heads configure(s) attention, which --preset likelihood" in cli_text(r)


def test_registry_lookups_fail_before_any_model_or_index_loads(home, tmp_path, monkeypatch, built_retriever):
    """--scorer learned (rerank, search, ask, serve), an 'auto' head set (prune, ask --prune-heads)
    and prune's --method probe with nothing registered were named only after the index and the
    model had loaded (and, for search, after searching)."""
    from attnrank.llm import models

    model = str(save_tiny(tmp_path / "model", layers=2))
    built_retriever.save(tmp_path / "ix")
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"_id": "a", "text": "Vitamin D is made in the skin."}\n')
    from attnrank.index.retriever import HybridRetriever

    loads: list[object] = []
    monkeypatch.setattr(models, "_load_cached", lambda *a: loads.append(a))
    monkeypatch.setattr(HybridRetriever, "load", classmethod(lambda cls, *a, **k: loads.append(("index", a))))
    ix = ["--index-dir", str(tmp_path / "ix")]
    cases = [
        (["search", "vitamin D?", *ix, "--rerank", "5", "--scorer", "learned"], "learned head weights"),
        (["ask", "vitamin D?", *ix, "--scorer", "learned"], "learned head weights"),
        (["ask", "vitamin D?", *ix, "--prune-heads", "auto"], "no head set is registered"),
        (
            ["prune", "vitamin D?", "--corpus", str(corpus), "--budget-tokens", "5", "--heads", "auto"],
            "no head set is registered",
        ),
        (["prune", "vitamin D?", "--corpus", str(corpus), "--budget-tokens", "5", "--method", "probe"], "probe"),
    ]
    try:
        import uvicorn  # noqa: F401
    except ImportError:  # (serve needs the 'serve' extra)
        pass
    else:
        cases.append((["serve", *ix, "--scorer", "learned"], "learned head weights"))
    for args, message in cases:
        quiet = [] if args[0] == "serve" else ["-q"]
        r = runner.invoke(app, [*args, "--model", model, *quiet])
        assert r.exit_code == 1 and message in cli_text(r), (args, cli_text(r))
    assert loads == []


def test_serve_prints_the_address_it_listens_on(tmp_path, monkeypatch):
    """With --port 0 ("a free port") the port was only in uvicorn's INFO line, which the default
    log level drops: the server could not be found."""
    uvicorn = pytest.importorskip("uvicorn")
    from attnrank.rerank.attention import AttentionReranker
    from attnrank.serve import engine

    rr = AttentionReranker(str(save_tiny(tmp_path / "tiny")), config="signals")
    monkeypatch.setattr(engine, "build_engine", lambda *a, **k: engine.Engine(rr, model_name="signals"))
    bound = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: bound.append(sockets[0].getsockname()))
    r = runner.invoke(app, ["serve", "--port", "0", "--preset", "signals"])
    assert r.exit_code == 0, cli_text(r)
    (host, port) = bound[0][:2]
    assert host == "127.0.0.1" and port > 0 and f"attnrank serving on http://127.0.0.1:{port}" in r.output


def test_serve_finds_its_port_taken_before_loading_anything(tmp_path, tiny_dir):
    """The port was bound after the index and the model had loaded (minutes): here a model folder
    without weights, whose load would fail first, is never read."""
    import shutil
    import socket

    config_only = tmp_path / "config-only"
    config_only.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        if (tiny_dir / name).exists():
            shutil.copy(tiny_dir / name, config_only / name)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = runner.invoke(app, ["serve", "--model", str(config_only), "--port", str(port)])
    assert r.exit_code == 2 and f"cannot listen on 127.0.0.1:{port}" in cli_text(r), cli_text(r)


def test_prune_prints_no_score_where_everything_was_kept(tmp_path, tiny_dir):
    """A budget over the whole context keeps everything unscored (NaN scores): each line read
    "+nan", like a broken score."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"_id": "a", "text": "Vitamin D is made in the skin. It helps bones."}\n', encoding="utf-8")
    args = ["prune", "vitamin D?", "--corpus", str(corpus), "--model", str(tiny_dir), "-q"]
    r = runner.invoke(app, [*args, "--budget-tokens", "100000"])
    assert r.exit_code == 0, cli_text(r)
    assert "nan" not in r.output and r.output.count("    kept (") == 2, r.output
    r = runner.invoke(app, [*args, "--budget-tokens", "20"])  # scored: a signed score per kept line
    assert r.exit_code == 0 and "kept 1 of 2 sentences" in r.output and "    kept (" not in r.output, cli_text(r)
    assert re.search(r"\n  [+-]\d\.\d{4} \(", r.output), r.output
    r = runner.invoke(app, [*args, "--budget-tokens", "1"])  # no sentence fits: printed with exit 0, as if pruned
    assert r.exit_code == 1 and "no sentence of the passages fits the budget of 1 tokens" in cli_text(r), cli_text(r)


def test_prune_prints_a_passage_of_a_title_alone_as_the_pruned_context_holds_it(tmp_path, tiny_dir):
    """PrunedContext.documents (what ask answers from) keeps a passage of a title alone; prune printed
    the sentences alone, so it left the passage out, and where every passage was one it printed
    "nothing kept" beside "kept everything"."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        '{"_id": "t", "title": "Only a title", "text": ""}\n'
        '{"_id": "b", "title": "B", "text": "Paris is the capital of France. Lyon is a big city."}\n',
        encoding="utf-8",
    )
    args = ["prune", "capital?", "--corpus", str(corpus), "--model", str(tiny_dir), "--budget-tokens", "100", "-q"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0 and "\n[t] Only a title\n  (its title alone: no sentence to prune)\n" in r.output, r.output
    assert r.output.index("[t] Only a title") < r.output.index("[b] B")  # (input order, as documents())
    corpus.write_text('{"_id": "t", "title": "Only a title", "text": ""}\n', encoding="utf-8")
    r = runner.invoke(app, args)
    assert r.exit_code == 0 and "(no sentence to prune;" in r.output and "nothing kept" not in r.output, r.output


def test_block_positions_given_for_the_rerankers_blocks_do_not_reach_a_full_attention_pruner():
    """ask --preset fused --block-positions sequential: the positions are the reranker's blocks';
    handed to the pruner (full attention), its configuration refused them."""
    from attnrank.cli.rerank_config import pruning_config
    from attnrank.rerank.config import RerankConfig

    rerank = RerankConfig.preset("fused", block_positions="sequential")
    prune = pruning_config(rerank, {"--block-positions"})
    assert (prune.attention, prune.block_positions) == ("full", "rotated")
    both = pruning_config(rerank, {"--block-positions", "--attention"})
    assert (both.attention, both.block_positions) == ("block", "sequential")


def test_ask_and_prune_name_a_mistyped_model_before_the_index_loads(tmp_path, monkeypatch, built_retriever):
    """serve and explain named it first; ask and prune loaded (and prune searched) the index first."""
    from attnrank.index.retriever import HybridRetriever

    built_retriever.save(tmp_path / "ix")
    loads: list[object] = []
    monkeypatch.setattr(HybridRetriever, "load", classmethod(lambda cls, *a, **k: loads.append(a)))
    ix, typo = ["--index-dir", str(tmp_path / "ix")], str(tmp_path / "typo")
    for args in (
        ["ask", "q?", *ix, "--model", typo],
        ["ask", "q?", *ix, "--generator-model", typo],
        ["prune", "q?", *ix, "--budget-tokens", "50", "--model", typo],
    ):
        r = runner.invoke(app, args)
        assert r.exit_code != 0 and "typo" in cli_text(r), cli_text(r)
    assert loads == []
    # a pruning window no prompt fits: before the index loads and searches too
    r = runner.invoke(app, ["prune", "q?", *ix, "--budget-tokens", "50", "--max-prompt-tokens", "40"])
    assert r.exit_code == 2 and "--max-prompt-tokens 40 leaves no room for a passage" in cli_text(r), cli_text(r)
    assert loads == []
    # the index is input: one that is not there is still named first (also where a pruning
    # window or --reorder read the model: they named the model first)
    nope = ["--index-dir", str(tmp_path / "nope"), "--model", typo]
    for args in (
        ["ask", "q?", *nope],
        ["ask", "q?", *nope, "--reorder"],
        ["prune", "q?", *nope, "--budget-tokens", "50", "--max-prompt-tokens", "40"],
    ):
        r = runner.invoke(app, args)
        assert r.exit_code != 0 and "no index at" in cli_text(r), (args, cli_text(r))


def test_an_answer_prompt_over_the_context_is_refused_in_asks_own_terms(tmp_path, built_retriever):
    """The refusal came after "Q: ... A:" was printed, and advised pruning harder (smaller
    budget_tokens) under --no-prune, with the library's argument names."""
    from _tiny import save_tiny

    built_retriever.save(tmp_path / "ix")
    small = save_tiny(tmp_path / "small", layers=2, max_positions=600)
    args = ["ask", "vitamin D?", "--index-dir", str(tmp_path / "ix"), "--no-rerank", "--no-prune", "-k", "3"]
    r = runner.invoke(app, [*args, "--generator-model", str(small), "--max-new-tokens", "8", "-q"])
    text = cli_text(r)
    assert r.exit_code == 1 and "with --max-new-tokens 8 it exceeds the model's 600-token context" in text, text
    assert text.rstrip().endswith("lower -k") and "budget" not in text and "Q: vitamin" not in r.output


def test_ask_searches_once_where_its_checks_before_the_load_searched(tmp_path, monkeypatch, built_retriever):
    """Its checks before the model loads searched the first stage, and the pipeline searched it
    again after the load (one more BM25 and dense query per question); the hits are now handed on,
    and their seconds still shown as the retrieve step."""
    from _tiny import save_tiny

    from attnrank.index.retriever import HybridRetriever

    built_retriever.save(tmp_path / "ix")
    model = save_tiny(tmp_path / "m", layers=2, max_positions=4096)
    searched: list[str] = []
    search = HybridRetriever.search

    def counted(self, query, *args, **kwargs):
        searched.append(query)
        return search(self, query, *args, **kwargs)

    monkeypatch.setattr(HybridRetriever, "search", counted)
    args = ["ask", "vitamin D?", "--index-dir", str(tmp_path / "ix"), "--model", str(model), "-q"]
    r = runner.invoke(app, [*args, "--signals", "only", "--depth", "4", "-k", "2", "--max-new-tokens", "2"])
    assert r.exit_code == 0, cli_text(r)
    assert searched == ["vitamin D?"] and re.search(r"\[timings\] retrieve \d+\.\d\d s, rerank", r.output), r.output


def test_prune_and_ask_refuse_a_question_of_invisible_characters_before_anything_loads(tmp_path, dl19_mini):
    """`attnrank prune $'\\u200b'` loaded the model, then failed in the reranker's words."""
    corpus = ["--corpus", str(dl19_mini / "passages.jsonl"), "--model", str(tmp_path / "no-model")]
    r = runner.invoke(app, ["prune", "\u200b", *corpus, "--budget-tokens", "9"])
    assert r.exit_code == 2 and "the QUERY is empty" in cli_text(r), cli_text(r)
    r = runner.invoke(app, ["ask", "\u200b\u2060", "--index-dir", str(tmp_path / "no-index")])
    assert r.exit_code == 2 and "the QUESTION is empty" in cli_text(r), cli_text(r)


def test_ask_advises_only_what_ask_can_do_where_the_context_does_not_fit(tmp_path, built_retriever):
    """With -k 1 and --no-prune the answer prompt's refusal said "lower -k"; a sentence no pruning
    prompt held said "lower max_sentence_words ... or raise max_prompt_tokens", which ask has no
    option for (its --max-prompt-tokens sizes the reranker's prompts)."""
    model = save_tiny(tmp_path / "model", layers=1, max_positions=256)  # (a context no abstract fits)
    built_retriever.save(tmp_path / "ix")
    base = ["ask", "vitamin D?", "--index-dir", str(tmp_path / "ix"), "--model", str(model), "-q", "--no-rerank"]
    base += ["--max-new-tokens", "4"]
    r = runner.invoke(app, [*base, "-k", "1", "--no-prune"])
    assert r.exit_code == 1, r.output
    assert str(r.exception).endswith("prune the context (drop --no-prune) or use a model with a longer context")
    r = runner.invoke(app, [*base, "-k", "2", "--no-prune"])
    assert str(r.exception).endswith("prune the context (drop --no-prune) or lower -k")
    r = runner.invoke(app, [*base, "-k", "1"])  # (an abstract's sentence of 64 words: hundreds of byte tokens)
    message = str(r.exception)
    assert r.exit_code == 1 and re.search(r"of the pruning prompt's \d+ tokens", message), message
    assert message.endswith("or answer from whole passages (--no-prune), or use a model with a longer context")
    assert "max_sentence_words" not in message and "max_prompt_tokens" not in message


def test_prune_names_its_own_flags_and_a_keep_ratio_that_keeps_a_sentence(tmp_path, scifact_mini):
    """prune's refusals named the library's arguments (max_sentence_words, method='focus'), and a
    ratio that kept 0 tokens was told the ratio of one token, which the next check refused again."""
    model = save_tiny(tmp_path / "model", layers=1, max_positions=1024)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        '{"id": "a", "text": "The Moon was first walked on in 1969 by Neil Armstrong, an American astronaut."}\n'
        '{"id": "b", "text": "Cats sleep for most of the day. They hunt at night."}\n'
    )
    base = ["prune", "Who walked on the Moon?", "--corpus", str(corpus), "--model", str(model), "-q"]
    r = runner.invoke(app, [*base, "--keep-ratio", "0.001"])
    ratio = re.search(r"raise keep_ratio \(--keep-ratio\) to at least ([0-9.]+)", str(r.exception))
    assert r.exit_code == 1 and ratio, str(r.exception)
    r = runner.invoke(app, [*base, "--keep-ratio", ratio.group(1)])
    assert r.exit_code == 0, str(r.exception)  # (the ratio advised keeps a sentence)
    r = runner.invoke(app, [*base, "--budget-tokens", "20", "--max-prompt-tokens", "220", "--max-sentence-words", "40"])
    message = str(r.exception)
    assert r.exit_code == 1 and "does not fit --max-prompt-tokens 220 even alone" in message, message
    assert "lower --max-sentence-words (now 40) or raise --max-prompt-tokens" in message
    r = runner.invoke(app, [*base, "--budget-tokens", "20", "--method", "focus", "--focus-hint", " "])
    assert r.exit_code == 2 and "--focus-hint is empty; --method focus needs" in r.output
