"""Answer generation, the retrieve → rerank → prune → answer pipeline, and the prune/ask CLI, on a
tiny random Llama; one slow test runs `ask` with the real default model."""

from __future__ import annotations

import logging
import math
import re
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from attnrank.cli import app
from attnrank.errors import InputError, ModelError
from attnrank.generate import Answer, Generator
from attnrank.pipeline import Pipeline, PipelineResult
from attnrank.prune.config import PruneConfig
from attnrank.prune.context import PrunedContext
from attnrank.prune.pruner import ContextPruner
from attnrank.rerank.attention import AttentionReranker
from attnrank.rerank.config import RerankConfig
from attnrank.types import Document, RankedResults, ScoredDocument

runner = CliRunner()
QUESTION = "Does vitamin D reduce the risk of fractures?"


def test_generator_is_greedy_and_streams(llm):
    gen = Generator(llm, max_new_tokens=6)
    docs = [Document("a", "Paris is the capital of France.", "Paris")]
    pieces: list[str] = []
    first = gen.answer("What is the capital of France?", docs, stream=pieces.append)
    again = gen.answer("What is the capital of France?", docs)
    assert isinstance(first, Answer) and first.text == again.text  # greedy: deterministic
    assert 0 < first.tokens <= 6 and first.seconds > 0 and first.prompt_tokens > 0
    assert "".join(pieces) == first.text  # (the tiny random model's answer may be empty: no piece then)
    assert "Paris is the capital of France." in gen.prompt("q?", docs)


def test_an_answer_cut_inside_a_character_ends_without_a_replacement_character():
    """An answer cut by max_new_tokens inside a character of several bytes ended with U+FFFD, in
    the text and in the stream's last flush (the real model, asked for Japanese: "(パッ\ufffd")."""
    import torch
    from _tiny import tiny_llm

    llm = tiny_llm(layers=1)
    tok = llm.tokenizer
    first_byte = tok.convert_tokens_to_ids(tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str("日")[0][0][0])
    head = torch.nn.Linear(llm.model.config.hidden_size, llm.model.config.vocab_size, bias=True)
    with torch.no_grad():  # every step: the first byte of 日 (0xE6), never a whole character
        head.weight.zero_()
        head.bias.fill_(-10.0)
        head.bias[first_byte] = 10.0
    llm.model.lm_head = head
    pieces: list[str] = []
    answer = Generator(llm, max_new_tokens=4).answer("q?", [Document("a", "text")], stream=pieces.append)
    assert answer.truncated and answer.tokens == 4
    assert "\ufffd" not in answer.text and "\ufffd" not in "".join(pieces)


def test_a_generator_by_name_checks_the_answer_length_before_its_load(tmp_path, monkeypatch):
    """It was found at the first answer, after the model had loaded."""
    from _tiny import save_tiny

    from attnrank.llm import models

    path = str(save_tiny(tmp_path / "m", max_positions=256))
    loads: list[object] = []
    monkeypatch.setattr(models, "_load_cached", lambda *a: loads.append(a))
    with pytest.raises(InputError, match="max_new_tokens=256"):
        Generator(path, max_new_tokens=256)
    with pytest.raises(InputError, match="max_new_tokens=256"):  # a path object too (its check read nothing)
        Generator(tmp_path / "m", max_new_tokens=256)
    assert loads == []


def test_generator_bad_input(llm):
    with pytest.raises(InputError, match="max_new_tokens=0 must be"):
        Generator(llm, max_new_tokens=0)
    with pytest.raises(InputError, match="question is empty"):
        Generator(llm).answer("  ", [])
    with pytest.raises(InputError, match="question #0 .* is not valid Unicode"):  # a tokenizer's TypeError before
        Generator(llm).answer("capital \udcff?", [])
    with pytest.raises(InputError, match="exceeds the model's 16384-token context"):
        Generator(llm).answer("q?", [Document("x", "word " * 4000)])


def test_pipeline_end_to_end(llm, built_retriever):
    pipe = Pipeline(
        built_retriever, AttentionReranker(llm), ContextPruner(llm), Generator(llm, max_new_tokens=4), depth=4, top_k=2
    )
    pieces: list[str] = []
    res = pipe.run(QUESTION, budget_tokens=120, stream=pieces.append)
    assert isinstance(res, PipelineResult) and res.question == QUESTION
    assert isinstance(res.first_stage, RankedResults) and len(res.first_stage) == 4
    assert isinstance(res.reranked, RankedResults) and res.reranked.stage == "fused" and len(res.reranked) == 2
    assert set(res.reranked.ids) <= set(res.first_stage.ids)
    assert isinstance(res.pruned, PrunedContext) and res.pruned.budget_tokens == 120
    assert 0 < res.pruned.kept_tokens <= 120 and res.pruned.compression > 1
    assert [d.id for d in res.pruned.docs] == res.reranked.ids  # pruned in reranked order
    assert res.context == res.pruned.documents() and res.sources == [d.id for d in res.context]
    assert isinstance(res.answer, Answer) and res.answer.tokens <= 4
    assert list(res.timings) == ["retrieve", "rerank", "prune", "generate", "total"]
    assert all(v >= 0 for v in res.timings.values())
    assert res.timings["total"] >= sum(v for k, v in res.timings.items() if k != "total") * 0.99


def test_a_pipeline_without_any_budget_is_refused_before_it_searches(llm, built_retriever):
    """budget_tokens=None ("every run gives one") and a run that gave none: found by the pruner,
    after the search and the reranking had run."""
    seen: list[str] = []
    pipe = Pipeline(built_retriever, None, ContextPruner(llm), None, depth=3, top_k=1, budget_tokens=None)
    with pytest.raises(InputError, match="no budget given"):
        pipe.run(QUESTION, checkpoint=seen.append)
    assert seen == []


class Stop(Exception):
    pass


def test_a_checkpoint_sees_each_stage_before_it_runs_and_can_stop_the_run(llm, built_retriever):
    pipe = Pipeline(built_retriever, AttentionReranker(llm), ContextPruner(llm), Generator(llm, 2), depth=3, top_k=1)
    seen: list[str] = []
    pipe.run(QUESTION, budget_tokens=200, checkpoint=seen.append)
    assert seen == ["rerank", "prune", "generate"]
    with pytest.raises(InputError, match=r"no sentence .* fits the budget of 60 tokens \(the shortest has \d+\)"):
        pipe.run(QUESTION, budget_tokens=60)  # answered from an empty context before

    class CountingPruner:  # the real pruner, counted
        def __init__(self, inner):
            self.inner, self.calls = inner, 0

        def prune(self, *args, **kwargs):
            self.calls += 1
            return self.inner.prune(*args, **kwargs)

    def stop_at_prune(stage: str) -> None:
        if stage == "prune":
            raise Stop

    pruner = CountingPruner(ContextPruner(llm))
    pipe = Pipeline(built_retriever, AttentionReranker(llm), pruner, Generator(llm, 2), depth=3, top_k=1)
    with pytest.raises(Stop):
        pipe.run(QUESTION, budget_tokens=200, checkpoint=stop_at_prune)
    assert pruner.calls == 0


def test_pipeline_without_optional_stages(built_retriever):
    res = Pipeline(built_retriever, depth=5, top_k=3).run(QUESTION)
    assert res.reranked is None and res.pruned is None and res.answer is None
    assert res.sources == res.first_stage.ids[:3] and list(res.timings) == ["retrieve", "total"]
    with pytest.raises(InputError, match="top_k=6 exceeds depth=5"):
        Pipeline(built_retriever, depth=5, top_k=6)
    with pytest.raises(InputError, match="question '' is empty"):
        Pipeline(built_retriever).run("")
    with pytest.raises(InputError, match=r"question \['what\?'\] is a list, not a text"):  # (it was "empty")
        Pipeline(built_retriever).run(["what?"])  # type: ignore[arg-type]


def test_pipeline_with_plain_candidates(llm):
    """Fixed candidates as Documents or strings (what the reranker and pruner accept); before,
    run() failed with AttributeError: 'Document' object has no attribute 'score'."""
    docs = [Document("p", "Paris is the capital of France. It is big.", "Paris"), Document("b", "Berlin is cold.")]
    pipe = Pipeline(None, AttentionReranker(llm), ContextPruner(llm), depth=2, top_k=2)
    res = pipe.run("capital of France?", docs, budget_tokens=30)
    assert res.first_stage.ids == ["p", "b"] and res.first_stage.stage == "given"
    assert list(res.timings) == ["rerank", "prune", "total"]  # no retrieval ran: no "retrieve" time
    assert sorted(res.reranked.ids) == ["b", "p"] and res.pruned.kept_tokens <= 30
    assert {d.title for d in res.context} <= {"Paris", ""}
    plain = Pipeline(None, depth=2, top_k=1).run("capital?", ["Paris is in France.", "Berlin is cold."])
    assert plain.sources == ["0"] and plain.context[0].text == "Paris is in France."


def test_no_answer_is_generated_from_no_passage(llm):
    """An empty context (no candidates given, or no hit) was answered from nothing, exit 0."""
    pipe = Pipeline(None, generator=Generator(llm, 3))
    with pytest.raises(InputError, match="no passage was retrieved for 'capital of France\\?'"):
        pipe.run("capital of France?", candidates=[])


def test_given_candidates_with_a_repeated_id_are_refused_without_a_reranker_too():
    docs = [Document("a", "Paris is in France."), Document("a", "Berlin is cold.")]
    with pytest.raises(InputError, match="candidate #1 repeats the id 'a'"):
        Pipeline(None, depth=2, top_k=2).run("capital?", docs)
    ranked = RankedResults("capital?", [ScoredDocument("a", 2.0, 1, "x")])
    ranked.results.append(ScoredDocument("a", 1.0, 2, "y"))  # (refused where made since; a list edited after)
    with pytest.raises(InputError, match="candidate #1 repeats the id 'a'"):  # as a RankedResults too
        Pipeline(None, depth=2, top_k=2).run("capital?", ranked)
    with pytest.raises(InputError, match="the candidates are 5, a int"):  # (list(5): a TypeError)
        Pipeline(None, depth=2, top_k=2).run("capital?", 5)
    with pytest.raises(InputError, match="question #0 .* is not valid Unicode"):  # before any stage runs
        Pipeline(None, depth=2, top_k=2).run("capital \udcff?", docs)
    with pytest.raises(InputError, match="reorder='profile.json' is not True, False or a SlotProfile"):
        Pipeline(None, reorder="profile.json")  # failed at the first run, after every stage


def test_from_model_checks_reorder_and_the_pruning_window_before_the_model_loads(tmp_path, monkeypatch, home):
    """A profile path, or reorder=True with no profile registered for the model, was refused when
    the pipeline was made, after the shared model had loaded and every stage was built."""
    from _tiny import save_tiny

    from attnrank.llm import models

    path = str(save_tiny(tmp_path / "m"))
    loads: list[object] = []
    monkeypatch.setattr(models, "_load_cached", lambda *a: loads.append(a))
    with pytest.raises(InputError, match="reorder='profile.json' is not True, False or a SlotProfile"):
        Pipeline.from_model(None, path, rerank=False, prune=False, reorder="profile.json")
    with pytest.raises(InputError, match="slot profile"):
        Pipeline.from_model(None, path, rerank=False, prune=False, reorder=True)
    # a pruning window no prompt fits, found with the tokenizer alone (after the load before)
    with pytest.raises(InputError, match="max_prompt_tokens=40 leaves no room for a passage"):
        Pipeline.from_model(None, path, rerank=False, prune=PruneConfig(max_prompt_tokens=40))
    with pytest.raises(InputError, match="head pairs 99-0 are out of range"):  # the pruner's heads too
        Pipeline.from_model(None, path, rerank=False, prune=PruneConfig(heads="99-0"))
    # and the reranker's, and its window (the reranker, given the loaded model, skipped both)
    with pytest.raises(InputError, match="head pairs 99-0 are out of range"):
        Pipeline.from_model(None, path, rerank=RerankConfig.preset("icr", heads="99-0"), prune=False)
    with pytest.raises(InputError, match="max_prompt_tokens=16"):
        Pipeline.from_model(None, path, rerank=RerankConfig.preset("icr", max_prompt_tokens=16), prune=False)
    assert loads == []


def test_given_candidates_are_cut_to_depth_before_reranking():
    """run(candidates=...) reranks the top ``depth`` of the list, as it would a search's hits; it
    reranked every candidate given, so depth was ignored (and 100 candidates cost 100 passages)."""

    class Recorder:  # a reranker that keeps its input order and records what it was asked to rank
        seen: list[str] = []

        def rank(self, query, candidates, k=None, **_):
            Recorder.seen = candidates.ids
            return candidates.top_k(k)

    pipe = Pipeline(None, Recorder(), depth=2, top_k=1)
    res = pipe.run("capital?", ["Paris is in France.", "Berlin is cold.", "Rome is warm."])
    assert Recorder.seen == ["0", "1"] and res.first_stage.ids == ["0", "1", "2"] and res.sources == ["0"]


def test_pipeline_reorders_passages_by_slot_profile(llm, built_retriever, tmp_path, monkeypatch):
    from attnrank.rerank.position import SlotProfile, store_profile

    # a profile that attends most to the last slot: the best passage goes last
    profile = SlotProfile(
        3, (0.0, 0.1, 0.5), (0.0,) * 3, llm.model_id, llm.fingerprint, 1, "2026-01-01", calibrated=False
    )
    with pytest.raises(InputError, match="holds calibrated scores"):  # a residual bias, not the basin
        Pipeline(built_retriever, depth=4, top_k=3, reorder=replace(profile, calibrated=True))
    plain = Pipeline(built_retriever, depth=4, top_k=3).run(QUESTION)
    res = Pipeline(built_retriever, depth=4, top_k=3, reorder=profile).run(QUESTION)
    best = plain.sources
    assert res.sources == [best[2], best[1], best[0]]
    monkeypatch.setenv("ATTNRANK_HOME", str(tmp_path))
    with pytest.raises(InputError, match="no raw-attention slot profile is registered"):
        Pipeline.from_model(built_retriever, llm, rerank=False, prune=False, reorder=True)
    store_profile(profile)
    pipe = Pipeline.from_model(
        built_retriever, llm, rerank=False, prune=False, generate=True, reorder=True, max_new_tokens=1, depth=4, top_k=3
    )
    assert pipe.reorder == profile and pipe.run(QUESTION).sources == res.sources
    # a run that keeps 2 passages (pruning dropped one, or the first stage found 2) reads the profile
    # measured for 2, not the 3-slot one stretched over them, which placed them the other way round
    two = SlotProfile(2, (0.5, 0.0), (0.0,) * 2, llm.model_id, llm.fingerprint, 1, "2026-01-01", calibrated=False)
    store_profile(two)
    pipe = Pipeline.from_model(
        built_retriever, llm, rerank=False, prune=False, reorder=True, max_new_tokens=1, depth=4, top_k=3
    )
    assert pipe._profile_for(3) == profile and pipe._profile_for(2) == two
    kept = [Document("a", "Paris is in France."), Document("b", "Rome is in Italy.")]  # best first
    assert [d.id for d in pipe.run(QUESTION, kept).context] == ["a", "b"]  # two's best slot is the first
    assert Pipeline(built_retriever, depth=4, top_k=3, reorder=profile)._profile_for(2) == profile  # given: stretched


def test_from_model_shares_one_llm(llm, built_retriever):
    pipe = Pipeline.from_model(
        built_retriever, llm, prune=PruneConfig(method="focus"), max_new_tokens=2, depth=3, top_k=1
    )
    assert pipe.reranker.llm is llm and pipe.pruner.llm is llm and pipe.generator.llm is llm
    res = pipe.run(QUESTION, keep_ratio=0.5)
    assert res.pruned.method == "focus" and res.pruned.budget_source == "keep_ratio"
    assert res.pruned.kept_tokens <= res.pruned.budget_tokens


def test_options_a_pipeline_would_drop_are_refused(llm, built_retriever):
    """rerank=None (or 0, {}) built the default reranker, which runs the LLM over every candidate;
    a budget or neighbours without a pruner, and max_new_tokens without a generator, were dropped
    without a word (run() refuses a budget without a pruner)."""
    for value in (None, 0, {}):
        with pytest.raises(InputError, match=rf"rerank={value!r} is not True, False, a preset name or a RerankConfig"):
            Pipeline.from_model(built_retriever, llm, rerank=value)
    with pytest.raises(
        InputError, match=r"budget_tokens=50 size\(s\) the pruned context, but this pipeline has no pruner"
    ):
        Pipeline.from_model(built_retriever, llm, rerank=False, prune=False, generate=False, budget_tokens=50)
    with pytest.raises(InputError, match=r"neighbours=3 size\(s\) the pruned context"):
        Pipeline(built_retriever, neighbours=3)
    with pytest.raises(InputError, match="max_new_tokens=5 sizes the answer, but generate=False"):
        Pipeline.from_model(built_retriever, llm, rerank=False, prune=False, generate=False, max_new_tokens=5)
    assert Pipeline(built_retriever).pruner is None  # the defaults, left alone, are no option given
    assert Pipeline(built_retriever, budget_tokens=None).pruner is None  # no budget is none given either


def test_cli_prune_and_ask(tmp_path, tiny_dir, built_retriever):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        '{"id": "p", "title": "Paris", "text": "Paris is the capital of France. It is big. '
        'The Seine flows through it."}\n{"id": "b", "text": "Berlin is in Germany. It is cold."}\n'
    )
    r = runner.invoke(
        app,
        [
            "prune",
            "capital of France?",
            "--corpus",
            str(corpus),
            "--budget-tokens",
            "40",
            "--model",
            str(tiny_dir),
            "-q",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "compression" in r.output and "tok)" in r.output
    r = runner.invoke(app, ["prune", "x", "--corpus", str(corpus), "--budget-tokens", "5", "--keep-ratio", "0.5"])
    assert r.exit_code != 0 and "not both" in r.output
    ix = built_retriever.save(tmp_path / "ix")
    r = runner.invoke(
        app,
        [
            "ask",
            QUESTION,
            "--index-dir",
            str(ix),
            "--depth",
            "3",
            "-k",
            "2",
            "--budget-tokens",
            "80",
            "--max-new-tokens",
            "3",
            "--model",
            str(tiny_dir),
            "-q",
        ],
    )
    assert r.exit_code == 0, r.output
    assert r.output.startswith(f"Q: {QUESTION}\nA: ") and "[sources]" in r.output and "[timings]" in r.output
    args = ["ask", QUESTION, "--index-dir", str(ix), "--depth", "3", "-k", "2", "--max-new-tokens", "3"]
    r = runner.invoke(app, [*args, "--model", str(tiny_dir), "--no-prune", "-q"])  # no budget reaches the pipeline
    assert r.exit_code == 0, r.output
    assert "[sources]" in r.output


@pytest.mark.slow
def test_ask_with_the_default_model_on_a_demo_question(tmp_path):
    from attnrank.demo import demo_corpus_path, demo_queries
    from attnrank.index.retriever import HybridRetriever

    ix = HybridRetriever().index(demo_corpus_path(), show_progress=False).save(tmp_path / "demo")
    q = demo_queries()[0]
    r = runner.invoke(app, ["ask", q["text"], "--index-dir", str(ix), "--max-new-tokens", "24", "-q"])
    assert r.exit_code == 0, r.output
    answer = r.output.split("\nA: ", 1)[1].split("\n[", 1)[0].strip()
    sources = r.output.split("[sources]\n", 1)[1].split("[timings]", 1)[0].strip().splitlines()
    ids = [re.match(r"\d+\. (\S+?)(?: \(|:)", line.strip()).group(1) for line in sources]
    assert answer and 1 <= len(ids) <= 5
    assert set(q["supporting"]) & set(ids), r.output  # a gold passage reached the generator


@pytest.mark.slow
def test_shipped_artifacts_of_the_default_model(tmp_path):
    """The registry entries that ship for SmolLM2-135M: learned head weights, the sentence probe
    and the slot profile, used end to end on the demo corpus (`ask --method probe --reorder`)."""
    from attnrank.demo import demo_corpus_path, demo_queries
    from attnrank.index.retriever import HybridRetriever
    from attnrank.llm.models import load_llm
    from attnrank.rerank.position import load_profile

    llm = load_llm()
    learned = AttentionReranker(llm, scorer="learned", signals=None)
    assert 0 < len(learned.head_list) <= llm.num_layers * llm.num_heads and not learned.learned.config.stages
    ix = HybridRetriever().index(demo_corpus_path(), show_progress=False)
    q = demo_queries()[0]
    hits = ix.search(q["text"], 10)
    ranked = learned.rank(q["text"], hits, k=5)
    assert len(ranked) == 5 and set(ranked.ids) <= set(hits.ids) and ranked.stage == "attention"
    # the shipped fused weights: with the registered heads' attention (fused), and without (the default)
    fused, default = AttentionReranker(llm, config="fused"), AttentionReranker(llm)
    assert fused.uses_attention and len(fused.head_list) == 16 and not default.uses_attention
    for rr in (fused, default):
        res = rr.rank(q["text"], hits, k=5)
        assert res.stage == "fused" and set(res.ids) <= set(hits.ids) and all(math.isfinite(d.score) for d in res)
    assert "attention" in fused.rank(q["text"], hits, k=1)[0].stage_scores
    assert set(q["supporting"]) & set(default.rank(q["text"], hits, k=5).ids)  # a gold passage in the top 5
    pruner = ContextPruner(llm, method="probe")
    pruned = pruner.prune(q["text"], ranked, keep_ratio=0.25)
    assert pruned.method == "probe" and 0 < pruned.kept_tokens <= pruned.budget_tokens
    assert load_profile("auto", llm.model_id, llm.fingerprint, n_slots=5).n_slots >= 5
    assert load_profile("auto", llm.model_id, llm.fingerprint, n_slots=5, calibrated=False).n_slots == 5
    path = ix.save(tmp_path / "demo")
    r = runner.invoke(
        app,
        ["ask", q["text"], "--index-dir", str(path), "--method", "probe", "--reorder", "--max-new-tokens", "8", "-q"],
    )
    assert r.exit_code == 0, r.output
    assert "[sources]" in r.output


def test_generator_names_the_question_when_it_alone_overflows(llm):
    """A question longer than the context was told to 'prune the context harder', which cannot help."""
    gen = Generator(llm, max_new_tokens=4)
    with pytest.raises(InputError, match=r"without passages\).*16384-token context; shorten the question"):
        gen.answer("word " * 4000 + "?", [Document("x", "Paris is in France.")])
    with pytest.raises(InputError, match="lower max_new_tokens"):
        gen.answer("q?", [], max_new_tokens=16384)
    with pytest.raises(InputError, match="prune the context harder"):
        gen.answer("q?", [Document("x", "word " * 4000)])


def test_from_model_refuses_stage_configs_asking_for_another_model(built_retriever, monkeypatch):
    """from_model loads one model from its own arguments: a config's model or device was ignored."""
    import attnrank.pipeline

    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(attnrank.pipeline, "load_llm", loaded)
    with pytest.raises(InputError, match=r"RerankConfig\(model='other/model'\) but the pipeline's model is None"):
        Pipeline.from_model(built_retriever, rerank=RerankConfig.preset("icr", model="other/model"))
    with pytest.raises(InputError, match=r"PruneConfig\(device='cuda'\) but Pipeline.from_model\(device='cpu'\)"):
        Pipeline.from_model(built_retriever, rerank=False, prune=PruneConfig(device="cuda"))


def test_run_query_id_names_given_ranked_candidates():
    """run(candidates=RankedResults, query_id=...) returned the candidates as they were, so the
    query_id given was silently ignored (first_stage.query_id stayed None)."""
    cands = RankedResults("capital?", [ScoredDocument("p", 2.0, 1, "Paris."), ScoredDocument("b", 1.0, 2, "Berlin.")])
    res = Pipeline(None, depth=2, top_k=1).run("capital?", cands, query_id="q7")
    assert res.first_stage.query_id == "q7" and res.first_stage.ids == ["p", "b"] and res.sources == ["p"]
    assert cands.query_id is None  # the caller's results are left as they were
    kept = RankedResults("capital?", cands.results, query_id="q1")
    assert Pipeline(None, depth=2, top_k=1).run("capital?", kept).first_stage.query_id == "q1"


def test_generator_refuses_one_string_as_the_context(llm):
    """Before: answer(q, "Paris is ...") iterated the string, so the model read one [i] passage
    per character and answered from that with no error."""
    gen = Generator(llm, max_new_tokens=2)
    with pytest.raises(InputError, match="context_docs is one str, not a list of passages"):
        gen.answer("What is the capital of France?", "Paris is the capital of France.")
    assert "[2]" not in gen.prompt("What is the capital of France?", ["Paris is the capital of France."])


def test_generator_refuses_a_passage_of_another_type_in_one_line(llm):
    """A dict (or a framework's document) failed inside the prompt builder: AttributeError."""
    gen = Generator(llm, max_new_tokens=2)
    for bad in ({"text": "Paris is the capital of France."}, 3):
        with pytest.raises(
            InputError, match=f"document #1 is a {type(bad).__name__}; pass attnrank.s Document, ScoredDocument or str"
        ):
            gen.answer("What is the capital of France?", [Document("d0", "France"), bad])
    texts = ["Paris is the capital of France.", "Lyon is a city."]
    docs = [Document(str(i), t) for i, t in enumerate(texts)]
    assert gen.prompt("Capital?", texts) == gen.prompt("Capital?", docs)
    from attnrank.llm.prompts import build_answer_prompt  # (the public builder itself, too)

    with pytest.raises(InputError, match="document #0 is a dict"):
        build_answer_prompt(llm.tokenizer, "Capital?", [{"text": "Paris"}])


def test_a_budget_without_a_pruner_is_refused():
    """budget_tokens/keep_ratio size the pruned context: without a pruner they were silently ignored."""
    pipe = Pipeline(None, depth=2, top_k=1)
    with pytest.raises(InputError, match="this pipeline has no pruner"):
        pipe.run("capital?", ["Paris is in France.", "Berlin is cold."], budget_tokens=10)
    with pytest.raises(InputError, match="this pipeline has no pruner"):
        pipe.run("capital?", ["Paris is in France."], keep_ratio=0.5)
    assert pipe.run("capital?", ["Paris is in France."]).context[0].text == "Paris is in France."


def test_a_bad_budget_given_to_run_is_refused_before_the_search_and_the_reranking(llm, built_retriever):
    """keep_ratio=1.5 or budget_tokens=0 were refused by the pruner, after seconds of retrieval and reranking."""

    class Counting(AttentionReranker):
        calls = 0

        def rank(self, *a, **k):
            Counting.calls += 1
            return super().rank(*a, **k)

    pipe = Pipeline(built_retriever, Counting(llm, "all", signals=None), ContextPruner(llm), depth=3, top_k=2)
    for kw, message in ((dict(keep_ratio=1.5), "keep_ratio=1.5"), (dict(budget_tokens=0), "budget_tokens=0")):
        with pytest.raises(InputError, match=message):
            pipe.run("what is a cell?", **kw)
    assert Counting.calls == 0
    assert pipe.run("what is a cell?", keep_ratio=0.5).pruned is not None and Counting.calls == 1


def test_an_answer_cut_at_max_new_tokens_says_so(llm, caplog):
    """An answer stopped by max_new_tokens, not by its end, was printed as a whole one, exit 0."""
    docs = [Document("a", "Paris is the capital of France.", "Paris")]
    with caplog.at_level(logging.WARNING, logger="attnrank.generate"):
        cut = Generator(llm, max_new_tokens=2).answer("What is the capital of France?", docs)
    assert cut.tokens == 2 and cut.truncated  # (the tiny random model ends no turn in two tokens)
    assert "reached max_new_tokens=2 before its end" in caplog.text
    caplog.clear()  # a streaming caller prints the answer and says so itself: no warning inside its line
    with caplog.at_level(logging.WARNING, logger="attnrank.generate"):
        streamed = Generator(llm, max_new_tokens=2).answer("What is the capital of France?", docs, stream=print)
    assert streamed.truncated and "reached max_new_tokens" not in caplog.text
    whole = Answer("Paris", 1, 0.1)
    assert not whole.truncated


def test_generation_stops_at_the_chat_templates_turn_end():
    """A tokenizer whose end-of-sequence token is not the chat template's end of turn (a base
    model's <|endoftext|> under a ChatML template) ran on past <|im_end|>: it stops there now."""
    from _tiny import tiny_model, tiny_tokenizer

    from attnrank.llm.chat import turn_end_ids
    from attnrank.llm.models import LLM

    tok = tiny_tokenizer()
    tok.eos_token = "<|endoftext|>"
    end = tok.convert_tokens_to_ids("<|im_end|>")
    assert turn_end_ids(tok) == [end]
    model = tiny_model("llama", layers=2)
    model.generation_config.eos_token_id = None
    gen = Generator(LLM(model=model, tokenizer=tok, model_id="tiny", fingerprint="f" * 64), max_new_tokens=4)
    assert gen._config(4).eos_token_id == [tok.eos_token_id, end]
    tok.chat_template = None
    assert turn_end_ids(tok) == []  # no template: nothing to add


def test_a_pipeline_with_a_pruner_checks_its_budget_and_neighbours_when_made(llm, built_retriever):
    """They were checked by run(), after the retrieval and the reranking."""
    for kwargs, message in ((dict(budget_tokens=0), "budget_tokens=0"), (dict(neighbours=-1), "neighbours=-1")):
        with pytest.raises(InputError, match=message):
            Pipeline(built_retriever, AttentionReranker(llm), ContextPruner(llm), Generator(llm, 2), **kwargs)


def test_from_model_loads_the_shared_model_only_for_a_stage_that_runs_it(built_retriever, tiny_dir, monkeypatch):
    """Preset signals with no pruner or generator ran no model but loaded one; a generator model
    that cannot load was named only after the shared model had loaded."""
    import attnrank.pipeline

    loads = []
    monkeypatch.setattr(attnrank.pipeline, "load_llm", lambda *a, **k: loads.append(a))
    pipe = Pipeline.from_model(built_retriever, str(tiny_dir), rerank="signals", prune=False, generate=False)
    assert loads == [] and pipe.reranker is not None and not pipe.reranker.uses_llm
    assert pipe.reranker.model_id == str(tiny_dir)  # its registered weights are looked up for this model
    # the precision asked for reaches the candidates' embedder (it stayed "auto": bfloat16 on AMX)
    exact = Pipeline.from_model(
        built_retriever, str(tiny_dir), rerank="signals", prune=False, generate=False, dtype="float32"
    )
    assert exact.reranker.config.dtype == "float32" and exact.reranker.signals.backend == "torch"
    with pytest.raises(InputError, match="generator_model is given but generate=False"):
        Pipeline.from_model(
            built_retriever, str(tiny_dir), rerank="signals", prune=False, generate=False, generator_model=str(tiny_dir)
        )
    with pytest.raises(ModelError, match="no such local model folder"):
        Pipeline.from_model(built_retriever, str(tiny_dir), generator_model="/no/such/generator")
    assert loads == []


def test_from_model_checks_its_counts_before_the_model_loads(tmp_path, monkeypatch, built_retriever):
    """top_k over depth, a budget of 0, neighbours -1 and max_new_tokens 0 were found by the
    constructor or the generator, after the model had loaded and every stage was built."""
    from _tiny import save_tiny

    from attnrank.llm import models
    from attnrank.pipeline import Pipeline

    model = str(save_tiny(tmp_path / "model", layers=2))
    loads: list[object] = []
    monkeypatch.setattr(models, "_load_cached", lambda *a: loads.append(a))
    cases = [
        (dict(top_k=30), "top_k=30 exceeds depth=20"),
        (dict(budget_tokens=0), "budget_tokens=0 must be"),
        (dict(neighbours=-1), "neighbours=-1 must be"),
        (dict(max_new_tokens=0), "max_new_tokens=0 must be"),
        (dict(max_new_tokens=10**6), "max_new_tokens=1000000 leaves no room for the prompt"),  # (found at the answer)
        (dict(topk=5), r"unknown Pipeline option\(s\) \['topk'\]; the options are depth, top_k"),  # was a TypeError
        # what the reranker looks up in the registry (this model has nothing registered)
        (dict(rerank="learned"), "no learned head weights"),
        # each stage's prompt window against the model's context (read from its config)
        (dict(prune=PruneConfig(max_prompt_tokens=10**6)), "max_prompt_tokens=1000000 exceeds the"),
        (dict(rerank=RerankConfig.preset("icr", max_prompt_tokens=10**6)), "max_prompt_tokens=1000000 exceeds the"),
    ]
    for kw, message in cases:
        with pytest.raises(InputError, match=message):
            Pipeline.from_model(built_retriever, model, **kw)
    assert loads == []


def test_generator_decodes_greedily_whatever_the_checkpoint_sets(llm):
    """Its docstring says greedy; the model's generation_config filled in a repetition penalty
    that discouraged copying the answer out of the passages."""
    from _tiny import tiny_model, tiny_tokenizer

    from attnrank.llm.models import LLM

    model = tiny_model("llama", layers=2)
    gen = Generator(LLM(model=model, tokenizer=tiny_tokenizer(), model_id="t", fingerprint="a" * 64), max_new_tokens=6)
    plain = gen.answer("Who is mean?", ["Mr Green is mean."])
    model.generation_config.repetition_penalty = 50.0
    model.generation_config.min_new_tokens = 6
    assert gen.answer("Who is mean?", ["Mr Green is mean."]).text == plain.text
    assert Generator(gen.llm, max_new_tokens=np.int64(3)).max_new_tokens == 3  # numpy integers were refused


def test_greedy_calls_read_none_of_the_checkpoints_own_generation_settings():
    """Tokens the checkpoint suppresses, bans or biases away, its minimum length and forced end
    were filled into every "plain greedy" call (transformers fills what a call leaves unset)."""
    import torch
    from _tiny import tiny_model

    from attnrank.llm.decoding import greedy_config, own_settings_off

    model = tiny_model("llama", layers=2)
    x = torch.tensor([[1, 5, 7, 9]])

    def run() -> list[int]:
        with torch.inference_mode(), own_settings_off(model):
            config = greedy_config(6, eos_token_id=2, pad_token_id=0)
            return model.generate(x, attention_mask=torch.ones_like(x), generation_config=config)[0, 4:].tolist()

    free = run()
    settings = model.generation_config
    settings.suppress_tokens = settings.begin_suppress_tokens = free
    settings.bad_words_ids = [[i] for i in free]
    settings.sequence_bias = {(i,): -100.0 for i in free}
    settings.min_length, settings.forced_eos_token_id = 40, 2
    assert run() == free
    assert model.generation_config is settings and settings.suppress_tokens == free  # put back after the call


def test_another_answer_length_shares_the_model_and_the_stop_tokens(llm):
    """The server built a Generator per /v1/ask request, finding the chat template's stop tokens
    again each time."""
    gen = Generator(llm, max_new_tokens=8)
    short = gen.with_max_new_tokens(2)
    assert (short.max_new_tokens, gen.max_new_tokens) == (2, 8) and short.llm is gen.llm
    assert short._stop_ids is gen._stop_ids
    assert short.answer("Who is mean?", ["Mr Green is mean."]).tokens <= 2
    with pytest.raises(InputError, match="max_new_tokens=0"):
        gen.with_max_new_tokens(0)


def test_inputs_a_pipeline_or_generator_would_misread_are_refused(llm, built_retriever):
    """prune=None (or "focus", a dict) built the default pruner; a bytes question was answered as
    "b'what'"; a passage holding a lone surrogate failed inside the tokenizer; stream= without a
    generator was never called."""
    gen = Generator(llm, max_new_tokens=1)
    for prune in (None, "focus", {"method": "probe"}):
        with pytest.raises(InputError, match=r"prune=.* is not True, False or a PruneConfig"):
            Pipeline.from_model(built_retriever, llm, rerank=False, prune=prune)
    with pytest.raises(InputError, match="question b'what' is a bytes; pass the question as a str"):
        gen.answer(b"what", [])  # type: ignore[arg-type]
    with pytest.raises(InputError, match="context passage"):
        gen.answer("what?", ["bad \ud800 text"])
    with pytest.raises(InputError, match="stream= receives the answer's text, but this pipeline has no generator"):
        Pipeline(built_retriever, depth=3, top_k=1).run(QUESTION, stream=lambda piece: None)


def _chain_generator(follows: dict[str, str], chat: bool = False) -> Generator:
    """A generator (no chat template unless ``chat``, greedy, 8 new tokens) over a one-layer model
    that writes, after each character of ``follows``, the character it maps to: the layer adds
    nothing, so each position's state is its token's embedding, and the output layer reads it."""
    import torch
    from _tiny import tiny_model, tiny_tokenizer

    from attnrank.llm.models import LLM

    tok = tiny_tokenizer()
    if not chat:
        tok.chat_template = None
    model = tiny_model("llama", layers=1)
    model.lm_head.weight = torch.nn.Parameter(torch.zeros_like(model.lm_head.weight))  # (untied)
    ids = {c: tok.convert_tokens_to_ids(tok.tokenize(c))[0] for c in {*follows, *follows.values()}}
    with torch.no_grad():
        model.model.layers[0].self_attn.o_proj.weight.zero_()
        model.model.layers[0].mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        for k, (before, after) in enumerate(follows.items()):
            model.model.embed_tokens.weight[ids[before], k] = 1.0
            model.lm_head.weight[ids[after], k] = 10.0
    return Generator(LLM(model=model, tokenizer=tok, model_id="tiny", fingerprint="f" * 64), max_new_tokens=8)


def test_a_prompt_without_a_chat_template_is_answered_with_its_first_line():
    """A base model's prompt ends "...\\nAnswer:", and nothing ended its answer: it ran on into the
    next line ("Question: ..." of an imagined exam) until max_new_tokens. Here a model that writes
    "A", a line break, then "B" and line breaks for ever (each token chosen by the one before)."""
    gen = _chain_generator({":": "A", "A": "\n", "\n": "B", "B": "\n"})
    assert gen.prompt("Who?").endswith("\nAnswer:")
    answer = gen.answer("Who?")
    assert (answer.text, answer.tokens) == ("A", 2)


def test_a_reorder_profile_of_another_model_than_the_generators_is_warned_of(llm, built_retriever, caplog):
    """Placement follows the attention of the model that reads the passages; a profile measured on
    another model was used for the generator without a word (slot correction warns of it)."""
    from attnrank.rerank.position import SlotProfile

    def profile(fingerprint: str) -> SlotProfile:
        return SlotProfile(3, (0.0, 0.1, 0.5), (0.0,) * 3, "other", fingerprint, 1, "2026-01-01", calibrated=False)

    gen = Generator(llm, max_new_tokens=1)
    with caplog.at_level("WARNING", logger="attnrank.pipeline"):
        Pipeline(built_retriever, generator=gen, depth=4, top_k=3, reorder=profile(llm.fingerprint))
        assert not caplog.text
        Pipeline(built_retriever, generator=gen, depth=4, top_k=3, reorder=profile("0" * 64))
    assert "the reorder profile was measured on other (fingerprint 000000000000)" in caplog.text


def test_from_model_warns_where_a_loaded_model_is_not_moved_as_asked(llm, caplog):
    """from_model(llm, device=..., dtype=...) ran on the loaded model's device and precision
    without a word, where the docstring says they load the shared model."""
    with caplog.at_level("WARNING", logger="attnrank.llm.models"):
        Pipeline.from_model(None, llm, generate=False, prune=False)
        assert caplog.text == ""
        Pipeline.from_model(None, llm, dtype="bfloat16", generate=False, prune=False)
    assert "sets dtype='bfloat16', but the loaded model" in caplog.text


def test_the_streamed_pieces_are_the_answer_word_for_word():
    """The streaming test compared empty texts (the tiny random model writes line breaks), so a
    stream that dropped, repeated or reordered text would pass; ``ask`` prints only the stream.
    Here a model that writes "Paris" and then a line break (each token chosen by the one before)."""
    gen = _chain_generator({":": "P", "P": "a", "a": "r", "r": "i", "i": "s", "s": "\n", "\n": "\n"})
    pieces: list[str] = []
    answer = gen.answer("Where?", stream=pieces.append)
    assert answer.text == "Paris" and "".join(pieces) == "Paris" and len(pieces) > 1


CHAINS = {  # (what each character is followed by; "é": its first byte alone, which decodes to U+FFFD)
    "whitespace around a second line": {":": "\n", "\n": "\t", "\t": "A", "A": " ", " ": "B", "B": "\n"},
    "half a character, then spaces to the limit": {":": "A", "\n": "A", "A": "é", "é": " ", " ": " "},
    "half a character, then the end of the turn": {":": "A", "\n": "A", "A": "é", "é": "<|im_end|>"},
}


@pytest.mark.parametrize(
    ("chain", "chat", "expected"),
    [
        ("whitespace around a second line", False, "A B"),
        ("whitespace around a second line", True, "A B\n\tA"),
        ("half a character, then spaces to the limit", False, "A"),
        ("half a character, then spaces to the limit", True, "A"),
        ("half a character, then the end of the turn", True, "A"),
    ],
)
def test_the_stream_leaves_out_what_the_answer_leaves_out(chain, chat, expected):
    """The pieces were the raw tokens: a client joining /v1/ask's token events (and ``ask``, which
    prints the stream) got the line breaks and tabs before the answer, a base model's second line,
    and a half character's U+FFFD, which the answer leaves out (or kept, where the turn ended)."""
    gen = _chain_generator(CHAINS[chain], chat=chat)
    pieces: list[str] = []
    answer = gen.answer("Where?", stream=pieces.append)
    assert answer.text == expected and "".join(pieces) == expected, pieces


def test_stage_objects_that_cannot_run_are_refused_when_the_pipeline_is_made(tmp_path, monkeypatch):
    """A str path as the retriever, a PruneConfig as the pruner, a preset name as the reranker: each
    an AttributeError at the first run (from_model's after loading the model); generate="no"
    generated; a custom retriever returning a list failed deep in run()."""
    from attnrank.llm import models

    for stage, bad, match in (
        ("retriever", "/tmp/idx", r"retriever is a str, which has no search\(\); pass HybridRetriever.load"),
        ("reranker", "icr", r"reranker is a str, which has no rank\(\)"),
        ("pruner", PruneConfig(), r"pruner is a PruneConfig, which has no prune\(\); pass ContextPruner"),
        ("generator", "gen", r"generator is a str, which has no answer\(\)"),
    ):
        with pytest.raises(InputError, match=match):
            Pipeline(**{"retriever": None, stage: bad})
    loads: list = []
    monkeypatch.setattr(models, "load_llm", lambda *a, **k: loads.append(a))
    with pytest.raises(InputError, match="retriever is a str"):
        Pipeline.from_model(str(tmp_path / "idx"), "any-model", rerank=False)
    with pytest.raises(InputError, match="generate='no' is not True or False"):
        Pipeline.from_model(None, "any-model", rerank=False, generate="no")  # type: ignore[arg-type]
    assert not loads

    class Listing:
        def search(self, query, k, *, query_id=None):
            return [Document("a", "x.")]

    with pytest.raises(InputError, match=r"retriever.search\(\) returned a list, not RankedResults"):
        Pipeline(Listing(), budget_tokens=None).run("q?")


def test_given_scored_candidates_whose_ranks_disagree_with_their_scores_are_said(caplog):
    """They are ordered by score; the candidate ranked 1 was cut by depth without a word."""
    from attnrank.types import ScoredDocument

    given = [
        ScoredDocument("a", 0.1, 1, "alpha"),
        ScoredDocument("b", 0.9, 2, "beta"),
        ScoredDocument("c", 0.5, 3, "c"),
    ]
    with caplog.at_level("WARNING", logger="attnrank.pipeline"):
        res = Pipeline(None, None, depth=2, top_k=2).run("q", candidates=given)
    assert res.first_stage.ids == ["b", "c", "a"]
    assert "rank documents in another order by their scores than by their rank field" in caplog.text
    assert "(first by score: 'b'; rank 1: 'a')" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="attnrank.pipeline"):
        Pipeline(None, None, depth=2, top_k=2).run("q", candidates=sorted(given, key=lambda d: -d.score))
    assert "another order" in caplog.text  # (their rank fields still disagree)
    caplog.clear()
    agreeing = [
        ScoredDocument(d.id, d.score, r, d.text) for r, d in enumerate(sorted(given, key=lambda d: -d.score), 1)
    ]
    with caplog.at_level("WARNING", logger="attnrank.pipeline"):
        Pipeline(None, None, depth=2, top_k=2).run("q", candidates=agreeing)
    assert not caplog.records
