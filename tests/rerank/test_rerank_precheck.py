"""An attention preset's passage that no prompt holds even alone, refused with the tokenizer alone
before the model loads (attnrank.rerank.precheck), as the loaded reranker refuses it."""

from __future__ import annotations

import json

from _tiny import RERANK_QUERY, rerank_docs

from attnrank.errors import InputError
from attnrank.llm.prompts import build_rerank_prompts
from attnrank.rerank.config import RerankConfig
from attnrank.rerank.precheck import check_prompts_before_load
from attnrank.types import Document

DOCS = [*rerank_docs(), Document("long", "A much longer passage than the others, " * 8)]


def _refusal(check, *args) -> str | None:
    try:
        check(*args)
    except InputError as e:
        return str(e)
    return None


def _config(tiny_dir, **kw) -> RerankConfig:
    return RerankConfig(model=str(tiny_dir), heads="all", signals=None, attention="full", **kw)


def test_the_early_refusal_is_the_loaded_rerankers_where_it_refuses(tiny_dir):
    """At every budget around the long passage's prompt the early check refuses what the loaded
    reranker refuses, in its words, and never what it accepts (it measures without the calibration
    prompt, which a query of several words makes the shorter)."""
    from attnrank.llm.models import load_llm
    from attnrank.llm.tokenizers import load_tokenizer
    from attnrank.rerank.attention import AttentionReranker

    tok = load_tokenizer(str(tiny_dir))
    alone = len(build_rerank_prompts(tok, RERANK_QUERY, [DOCS[-1]]).real.input_ids)
    llm = load_llm(str(tiny_dir))
    seen = set()
    for budget in range(alone - 3, alone + 3):
        config = _config(tiny_dir, max_prompt_tokens=budget)
        loaded = _refusal(AttentionReranker(llm, config=config).check_batch, [RERANK_QUERY], [DOCS], ["q1"])
        early = _refusal(check_prompts_before_load, config, [RERANK_QUERY], [DOCS], ["q1"])
        assert early == loaded, budget
        seen.add(early is None)
    assert seen == {True, False}  # (both sides: refused, then fits)
    assert "query 'q1': document #4 ('long') does not fit max_prompt_tokens" in str(
        _refusal(check_prompts_before_load, _config(tiny_dir, max_prompt_tokens=alone - 1), [RERANK_QUERY], [DOCS])
    ).replace("query #0", "query 'q1'")


def test_block_attention_is_left_to_the_reranker(tiny_dir):
    """Block attention (its blocks are cut and checked as they are built): no early refusal."""
    config = RerankConfig(model=str(tiny_dir), heads="all", signals=None, attention="block", max_prompt_tokens=8)
    assert _refusal(check_prompts_before_load, config, [RERANK_QUERY], [DOCS]) is None


def test_rerank_refuses_a_passage_no_prompt_holds_before_the_model_loads(tmp_path, tiny_dir, monkeypatch):
    """It was refused only after the model had loaded (seconds; minutes for a large model)."""
    from typer.testing import CliRunner

    from attnrank.cli import app
    from attnrank.llm import models, tokenizers

    corpus, queries, run = tmp_path / "c.jsonl", tmp_path / "q.jsonl", tmp_path / "run.trec"
    corpus.write_text("".join(json.dumps({"_id": d.id, "title": d.title, "text": d.text}) + "\n" for d in DOCS))
    queries.write_text(json.dumps({"_id": "q1", "text": RERANK_QUERY}) + "\n")
    run.write_text("".join(f"q1 Q0 {d.id} {i + 1} {10 - i} bm25\n" for i, d in enumerate(DOCS)))
    budget = (
        len(build_rerank_prompts(tokenizers.load_tokenizer(str(tiny_dir)), RERANK_QUERY, DOCS[-1:]).real.input_ids) - 1
    )
    loads = []
    monkeypatch.setattr(models, "_load_cached", lambda *a: loads.append(a))
    args = [
        "rerank",
        "--run",
        str(run),
        "--queries",
        str(queries),
        "--corpus",
        str(corpus),
        "-o",
        str(tmp_path / "out.trec"),
    ]
    options = ["--model", str(tiny_dir), "--preset", "qrhead", "--heads", "all", "--attention", "full"]
    r = CliRunner().invoke(app, [*args, *options, "--max-prompt-tokens", str(budget), "-q"])
    said = r.output + str(r.exception)
    assert r.exit_code == 1 and f"query 'q1': document #4 ('long') does not fit max_prompt_tokens={budget}" in said, (
        said
    )
    assert loads == []


def _over_an_index(monkeypatch, tmp_path, tiny_dir, built_retriever, command: list[str]) -> tuple[int, str, list]:
    """``command`` over the saved SciFact slice with an attention preset whose 200-token prompts hold
    no abstract: (exit code, what it said, the model loads it made)."""
    from typer.testing import CliRunner

    from attnrank.cli import app
    from attnrank.llm import models

    built_retriever.save(tmp_path / "ix")
    loads: list = []
    monkeypatch.setattr(models, "_load_cached", lambda *a: loads.append(a))
    options = ["--model", str(tiny_dir), "--preset", "qrhead", "--heads", "all", "--attention", "full"]
    index = ["--index-dir", str(tmp_path / "ix"), "--max-prompt-tokens", "200"]
    r = CliRunner().invoke(app, [*command, *index, *options])
    return r.exit_code, r.output + str(r.exception), loads


def test_search_refuses_a_passage_no_prompt_holds_before_the_model_loads(
    tmp_path, tiny_dir, built_retriever, monkeypatch
):
    """The same over an index's first-stage hits: refused once they are found, before the model loads."""
    code, said, loads = _over_an_index(
        monkeypatch, tmp_path, tiny_dir, built_retriever, ["search", "vitamin D", "--rerank", "3"]
    )
    assert code == 1 and "query 'q1': " in said and "fits max_prompt_tokens=200 even alone" in said, said
    assert loads == []


def test_ask_refuses_a_passage_no_prompt_holds_before_the_model_loads(tmp_path, tiny_dir, built_retriever, monkeypatch):
    """ask's reranker found it only inside the pipeline, once the model had loaded; refused now in
    the words of its rank()."""
    ask = ["ask", "vitamin D", "--depth", "3", "-k", "2"]
    code, said, loads = _over_an_index(monkeypatch, tmp_path, tiny_dir, built_retriever, ask)
    assert code == 1 and said.startswith("no document fits max_prompt_tokens=200 even alone"), said
    assert loads == []
