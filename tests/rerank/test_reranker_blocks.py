"""The reranker in block-attention mode: same scoring over block rows, reusable states, options."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _cli import cli_text
from _tiny import rerank_docs
from typer.testing import CliRunner

from attnrank.cli import app
from attnrank.errors import InputError
from attnrank.llm.blocks import build_block_prompts
from attnrank.llm.capture import capture_blocks
from attnrank.llm.rows import document_scores, token_scores
from attnrank.rerank.attention import AttentionReranker
from attnrank.rerank.config import RerankConfig
from attnrank.types import Document

HEADS = [(1, 0), (2, 3), (3, 1)]
QUERY = "What is the capital of France?"


def test_block_scores_are_the_icr_aggregation_of_block_rows(llm):
    docs = rerank_docs()
    rr = AttentionReranker(llm, HEADS, attention="block", signals=None)
    got = rr.score(QUERY, docs)
    prompt = build_block_prompts(llm.tokenizer, QUERY, docs)
    prefix = rr.capturer.prefill(prompt.prefix_ids)
    w = capture_blocks(rr.capturer, prompt, prefix, fingerprint=llm.fingerprint, positions="rotated")
    expected = document_scores(token_scores(w.rows), w.spans)
    np.testing.assert_allclose(got, expected, atol=1e-9)
    full = AttentionReranker(llm, HEADS, signals=None).score(QUERY, docs)
    assert not np.allclose(got, full, atol=1e-9)  # block mode is another attention pattern


def test_warm_queries_reuse_states(llm):
    docs = rerank_docs()
    rr = AttentionReranker(llm, HEADS, attention="block", block_positions="shared", signals=None)
    cold = rr.rank(QUERY, docs)
    assert rr.states.misses == len(docs) and rr.states.hits == 0
    warm = rr.rank(QUERY, list(reversed(docs)))  # other order: shared positions keep the states valid
    assert rr.states.hits == len(docs)
    assert {d.id: d.score for d in warm} == pytest.approx({d.id: d.score for d in cold}, abs=1e-5)
    off = AttentionReranker(llm, HEADS, attention="block", state_cache_mb=0, signals=None)
    off.rank(QUERY, docs)
    assert len(off.states) == 0


def test_rotated_positions_reuse_states_across_orders(llm):
    docs = rerank_docs()
    rr = AttentionReranker(llm, HEADS, attention="block", block_positions="rotated", signals=None)
    first = rr.score(QUERY, docs)
    rr.score(QUERY, list(reversed(docs)))  # other slots: the same cached states, rotated elsewhere
    assert rr.states.hits == len(docs) and rr.states.misses == len(docs)
    again = rr.score(QUERY, docs)
    np.testing.assert_allclose(again, first, atol=1e-6)
    seq = AttentionReranker(llm, HEADS, attention="block", block_positions="sequential", signals=None).score(
        QUERY, docs
    )
    shared = AttentionReranker(llm, HEADS, attention="block", block_positions="shared", signals=None).score(QUERY, docs)
    assert np.abs(first - seq).max() > 1e-9 and np.abs(first - shared).max() > 1e-9


def test_sequential_positions_follow_the_prompt_order(llm):
    docs = rerank_docs()
    rr = AttentionReranker(llm, HEADS, attention="block", block_positions="sequential", signals=None)
    a = rr.score(QUERY, docs)
    shared = AttentionReranker(llm, HEADS, attention="block", block_positions="shared", signals=None).score(QUERY, docs)
    assert np.isfinite(a).all() and np.abs(a - shared).max() > 1e-9


@pytest.mark.parametrize(
    "options, fragment",
    [
        (dict(attention="sparse"), "attention="),
        (dict(attention="block", block_positions="zigzag"), "block_positions"),
        (dict(passage_states="x"), "attention='block'"),
        (dict(attention="block", block_positions="sequential", passage_states="x"), "shared block positions"),
        (dict(state_cache_mb=-1), "state_cache_mb"),
    ],
)
def test_bad_block_options(options, fragment):
    with pytest.raises(InputError, match=fragment):
        RerankConfig.preset("icr", **options)


runner = CliRunner()


def _index_with_states(corpus, ix, storage: str, args: list[str]):
    """`attnrank index CORPUS --passage-states STORAGE` with the reranker options ``args``."""
    return runner.invoke(app, ["index", str(corpus), "--index-dir", str(ix), "--passage-states", storage, *args, "-q"])


def _block_search(ix) -> list[str]:
    """A block-attention `search --rerank 3` over the index ``ix`` (reranker options to be added)."""
    return ["search", "cell therapy", "--index-dir", str(ix), "--rerank", "3", "--attention", "block", "--heads", "all"]


def test_index_builds_passage_states_for_a_token_cut_and_a_precision(tmp_path, scifact_mini, tiny_dir, caplog):
    """index had no --max-doc-tokens or --dtype: a search with either refused the store (re-encoding
    every passage), and its advice, a rebuild with the same options, could not be followed."""
    ix = tmp_path / "ix"
    args = ["--preset", "fused", "--model", str(tiny_dir), "--max-doc-words", "40", "--max-doc-tokens", "30"]
    args += ["--dtype", "float32"]
    r = _index_with_states(scifact_mini, ix, "float16", args)
    assert r.exit_code == 0, r.output
    header = json.loads((ix / "passage_states" / "states.json").read_text())
    assert header["max_doc_tokens"] == 30
    search = _block_search(ix)
    with caplog.at_level("WARNING"):
        r = runner.invoke(app, [*search, *args, "-q"])
    assert r.exit_code == 0, r.output
    assert "not reading the index's passage states" not in caplog.text and "another setup" not in caplog.text
    r = runner.invoke(app, ["index", str(scifact_mini), "--index-dir", str(tmp_path / "x"), "--max-doc-tokens", "30"])
    assert r.exit_code == 2 and "--max-doc-tokens configure(s) --passage-states" in r.output


def test_index_builds_passage_states_for_the_heads_a_search_reads(tmp_path, scifact_mini, tiny_dir, caplog):
    """A search with --heads of shallower layers than the preset's refused the index's store (its
    deepest layer is another), and index had no --heads to build one for them: the refusal's advice,
    a rebuild, could not be followed."""
    ix = tmp_path / "ix"
    args = ["--preset", "fused", "--model", str(tiny_dir), "--max-doc-words", "40"]
    r = _index_with_states(scifact_mini, ix, "float16", [*args, "--heads", "0-0,1-1"])
    assert r.exit_code == 0, r.output
    assert json.loads((ix / "passage_states" / "states.json").read_text())["deepest_layer"] == 1
    search = ["search", "cell therapy", "--index-dir", str(ix), "--rerank", "3", "--attention", "block", *args, "-q"]
    for heads, read in (("0-0,1-1", True), ("1-0", True), ("all", False)):  # (the tiny model has 3 layers)
        caplog.clear()
        with caplog.at_level("WARNING", logger="attnrank.rerank.over_index"):
            r = runner.invoke(app, [*search, "--heads", heads])
        assert r.exit_code == 0, r.output
        assert ("not reading the index's passage states" not in caplog.text) is read, (heads, caplog.text)
    assert "deepest_layer: store 1, reranker 2" in caplog.text
    # refused before the corpus is read: a head outside the model, and --heads without --passage-states
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    r = _index_with_states(bad, tmp_path / "x", "float16", [*args, "--heads", "7-0"])
    assert r.exit_code == 2 and "--heads '7-0'" in r.output, r.output
    r = _index_with_states(bad, tmp_path / "x", "float16", [*args, "--heads", "auto"])  # (nothing registered)
    assert r.exit_code == 1 and "no head set is registered" in r.output + str(r.exception), r.output
    r = runner.invoke(app, ["index", str(bad), "--index-dir", str(tmp_path / "y"), "--heads", "0-0", "-q"])
    assert r.exit_code == 2 and "--heads configure(s) --passage-states" in r.output, r.output


def test_index_force_never_replaces_the_folder_of_the_states_model(tmp_path, scifact_mini):
    """`index --force --passage-states --model models/tiny --index-dir models` encoded the states,
    then replaced models/ (the model folder with it): exit 0, an index recording a deleted model."""
    from _tiny import save_tiny

    model = save_tiny(tmp_path / "models" / "tiny", layers=2)
    args = ["--preset", "fused", "--model", str(model), "--max-doc-words", "40", "--force"]
    r = _index_with_states(scifact_mini, tmp_path / "models", "float16", args)
    assert r.exit_code != 0 and "it is or contains the model" in (r.output + str(r.exception)), r.output
    assert (model / "config.json").is_file()


def test_index_passage_states_serve_block_search(tmp_path, scifact_mini, tiny_dir, caplog):
    ix = tmp_path / "ix"
    args = ["--preset", "fused", "--model", str(tiny_dir), "--max-doc-words", "40"]
    r = _index_with_states(scifact_mini, ix, "int8", args)
    assert r.exit_code == 0, r.output
    assert (ix / "passage_states" / "states.json").is_file() and "bytes/token" in r.output
    search = _block_search(ix)
    r = runner.invoke(app, [*search, *args, "-q"])
    assert r.exit_code == 0, r.output
    assert "attention=" in r.output
    # A reranker with another truncation does not read the index's own store (it was attached
    # unasked): it reranks without it and says why. Before, the search failed, asking to drop a
    # --passage-states that was never given.
    with caplog.at_level("WARNING", logger="attnrank.rerank.over_index"):
        r = runner.invoke(app, [*search, "--preset", "fused", "--model", str(tiny_dir), "--max-doc-words", "80", "-q"])
    assert r.exit_code == 0, r.output
    assert "not reading the index's passage states" in caplog.text and "max_doc_words" in caplog.text
    # rerank --index reads them as search --rerank does (it recomputed every state, and embedded
    # the candidates again instead of reading the index's vectors)
    ids = [json.loads(line)["_id"] for line in (scifact_mini / "corpus.jsonl").read_text().splitlines()[:3]]
    run = tmp_path / "run.trec"
    run.write_text("".join(f"0 Q0 {d} {i + 1} {3 - i} bm25\n" for i, d in enumerate(ids)))
    rerank = ["rerank", "--run", str(run), "--queries", str(scifact_mini / "queries.jsonl"), "--index-dir", str(ix)]
    rerank += ["--depth", "3", "--attention", "block", "--heads", "all", "-q"]
    for words, warned in (("40", False), ("80", True)):
        caplog.clear()
        with caplog.at_level("WARNING", logger="attnrank.rerank.over_index"):
            out = tmp_path / f"reranked-{words}.trec"
            r = runner.invoke(
                app, [*rerank, "--preset", "fused", "--model", str(tiny_dir), "--max-doc-words", words, "-o", str(out)]
            )
        assert r.exit_code == 0, r.output
        assert ("not reading the index's passage states" in caplog.text) is warned, caplog.text
    # and the server over the index, as search does (it recomputed every state)
    from attnrank.rerank.config import RerankConfig
    from attnrank.serve.engine import build_engine

    config = RerankConfig.preset("fused", model=str(tiny_dir), max_doc_words=40, heads="all")
    engine = build_engine(config, index=ix, prune=False, generate=False)
    assert engine.reranker.config.passage_states == str(ix / "passage_states")
    # whose /health tells what the stored states serve
    import httpx

    from attnrank.serve.app import create_app
    from attnrank.serve.background import background_server

    with background_server(create_app(engine)) as base:
        assert (
            httpx.post(f"{base}/v1/search", json={"query": "cell therapy", "top_k": 2, "depth": 3}).status_code == 200
        )
        stored = httpx.get(f"{base}/health").json()["passage_states"]["stored"]
    assert stored["served"] == 3 and stored["stale"] == 0 and stored["storage"] == "int8"
    assert stored["folder"] == str(ix / "passage_states") and stored["passages"] > 3
    # a damaged store the index holds, attached unasked, is skipped with a warning too: the search
    # failed, advising to drop a --passage-states that was never given
    values = ix / "passage_states" / "values.npy"  # values zeroed past the array's header, its size kept
    raw = bytearray(values.read_bytes())
    raw[256:] = bytes(len(raw) - 256)
    values.write_bytes(bytes(raw))
    caplog.clear()
    with caplog.at_level("WARNING", logger="attnrank.rerank.over_index"):
        r = runner.invoke(app, [*search, "--preset", "fused", "--model", str(tiny_dir), "--max-doc-words", "40", "-q"])
    assert r.exit_code == 0, r.output
    assert "not reading the index's passage states" in caplog.text and "are damaged" in caplog.text, caplog.text
    assert "drop --passage-states" not in caplog.text  # (never given: the fault alone is said)
    header = ix / "passage_states" / "states.json"
    header.write_bytes(b"{" + b" " * (header.stat().st_size - 1))  # (its size kept: the index's own check passes)
    caplog.clear()
    with caplog.at_level("WARNING", logger="attnrank.rerank.over_index"):
        r = runner.invoke(app, [*search, "--preset", "fused", "--model", str(tiny_dir), "--max-doc-words", "40", "-q"])
    assert r.exit_code == 0, r.output
    assert "not reading the index's passage states" in caplog.text and "no readable" in caplog.text


def test_texts_sent_to_rerank_are_not_taken_for_the_stored_passages_of_their_positions(tmp_path, tiny_dir, caplog):
    """A server's /v1/rerank (and a plain text given to rank) names its texts "0", "1", ...; over an
    index whose corpus numbers its ids so, every request warned that passage '0' had changed since
    its states were stored, and /health counted it stale (the corpus's own text too, sent without
    its title). A caller's own id with another text is still told."""
    import httpx

    from attnrank.rerank.config import RerankConfig
    from attnrank.serve.app import create_app
    from attnrank.serve.background import background_server
    from attnrank.serve.engine import build_engine

    texts = ["Paris is the capital of France.", "Berlin lies on the Spree.", "Bananas grow in the tropics."]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": str(i), "title": "T", "text": t}) + "\n" for i, t in enumerate(texts)))
    ix = tmp_path / "ix"
    args = ["--preset", "fused", "--model", str(tiny_dir), "--heads", "all"]
    assert _index_with_states(corpus, ix, "float16", args).exit_code == 0
    config = RerankConfig.preset("fused", model=str(tiny_dir), heads="all")
    engine = build_engine(config, index=ix, prune=False, generate=False)
    store = engine.reranker.store
    with caplog.at_level("WARNING", logger="attnrank.llm.statestore"), background_server(create_app(engine)) as base:
        for body in (
            {"query": "capital?", "documents": ["Madrid is in Spain.", "Rome is in Italy."]},
            {"query": "capital?", "documents": texts},
        ):
            assert httpx.post(f"{base}/v1/rerank", json=body).status_code == 200
        assert httpx.get(f"{base}/health").json()["passage_states"]["stored"]["stale"] == 0
    engine.reranker.rank("capital?", ["Madrid is in Spain.", "Rome is in Italy."])  # plain texts: positions too
    engine.reranker.score("capital?", ["Vienna is in Austria.", "Rome is in Italy."])  # (score as rank)
    # a framework's documents (LangChain, LlamaIndex, Haystack) are named by their positions as well
    from attnrank.integrations.documents import rank_text_first

    rank_text_first(engine.reranker, "capital?", [Document("1", "Oslo is in Norway."), Document("2", "Bern.")], None)
    assert store.stale == 0 and "changed since its states were stored" not in caplog.text
    engine.reranker.rank("capital?", [Document("0", "Lisbon is in Portugal."), Document("x", "Rome.")])  # own ids
    assert store.stale == 1 and "passage '0' changed" in caplog.text


def test_index_rejects_state_options_without_states(tmp_path, scifact_mini):
    r = runner.invoke(app, ["index", str(scifact_mini), "--index-dir", str(tmp_path / "ix"), "--preset", "icr", "-q"])
    assert r.exit_code != 0 and "--passage-states" in r.output


def test_block_context_beyond_the_window_is_scored_in_windows(llm):
    """Rotated positions place the query after every block: past ``max_prompt_tokens`` the
    candidates are split into round-robin windows, as the full prompt is (before, the query sat
    beyond the limit, past the model's context for long lists, without a word)."""
    docs = rerank_docs()
    prompt = build_block_prompts(llm.tokenizer, QUERY, docs)
    extent = prompt.suffix_start("rotated") + max(len(prompt.real_suffix_ids), len(prompt.calibration_suffix_ids))
    limit = extent - 1
    small = AttentionReranker(llm, HEADS, attention="block", signals=None, max_prompt_tokens=limit)
    wins = small.windows(QUERY, docs)
    assert len(wins) > 1 and sorted(i for w in wins for i in w.doc_index) == list(range(len(docs)))
    whole = AttentionReranker(llm, HEADS, attention="block", signals=None)
    assert len(whole.windows(QUERY, docs)) == 1
    for w in wins:  # each window is the block prompt of its own documents, within the limit
        alone = whole.windows(QUERY, [docs[i] for i in w.doc_index])[0]
        np.testing.assert_allclose(w.rows, alone.rows, atol=1e-6)
        assert len(w.input_ids) < limit
    assert small.rank(QUERY, docs).ids != [] and sorted(small.rank(QUERY, docs).ids) == sorted(d.id for d in docs)
    shared = AttentionReranker(
        llm, HEADS, attention="block", block_positions="shared", signals=None, max_prompt_tokens=limit
    )
    assert len(shared.windows(QUERY, docs)) == 1  # shared positions: the query follows the longest block only


def test_index_checks_the_passage_states_preset_before_reading_the_corpus(tmp_path, monkeypatch):
    """A preset that is not one exited 1, and one without attention exited 2, both after the whole
    corpus was read and torch imported."""
    import attnrank.cli.retrieval as retrieval

    def unread(*_):
        raise AssertionError("the corpus was read")

    monkeypatch.setattr(retrieval, "_read_corpus", unread)
    args = ["index", str(tmp_path / "c.jsonl"), "--index-dir", str(tmp_path / "ix"), "--passage-states", "int8"]
    r = runner.invoke(app, [*args, "--preset", "bogus"])
    assert r.exit_code == 2 and "preset 'bogus' is not one of" in cli_text(r), r.output
    r = runner.invoke(app, [*args, "--preset", "signals"])
    assert r.exit_code == 2 and "--preset signals computes no attention" in cli_text(r), r.output


def test_a_store_of_another_model_or_cut_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    """Only the store's folder was checked before the load; its model and cut were compared when
    it opened, after the model had loaded (minutes for a large one)."""
    from _tiny import save_tiny

    from attnrank.llm import models
    from attnrank.llm.attention import AttentionCapturer
    from attnrank.llm.statestore import StoreSetupError
    from attnrank.llm.statestore_write import write_store

    built, other = save_tiny(tmp_path / "built", layers=2), save_tiny(tmp_path / "other", layers=3)
    llm = models.load_llm(str(built), dtype="float32")
    store = tmp_path / "states"
    write_store(
        store, AttentionCapturer(llm.model, [(1, 0)]), llm.tokenizer, rerank_docs(), model_id=llm.model_id,
        fingerprint=llm.weights_key, storage="float16", max_doc_words=300,
    )  # fmt: skip
    loads: list[object] = []
    monkeypatch.setattr(models, "_load_cached", lambda *a: loads.append(a))
    block = dict(attention="block", block_positions="shared", heads="1-0", passage_states=str(store))
    for model, cut, fragment in [(other, 300, "fingerprint: store"), (built, 100, "max_doc_words: store 300")]:
        config = RerankConfig.preset("qrhead", calibrate=False, max_doc_words=cut, **block)
        with pytest.raises(StoreSetupError, match=fragment):
            AttentionReranker(str(model), config=config)
    assert loads == []


@pytest.mark.parametrize("positions", ["rotated", "shared"])
def test_block_windows_keep_below_a_sliding_window(positions):
    """Windows were cut by positions alone: 12 passages in one block-attention window held more
    tokens than a sliding-window model keeps, refused after every block had been encoded."""
    import numpy as np
    from _tiny import tiny_model, tiny_tokenizer

    from attnrank.llm.models import LLM
    from attnrank.types import Document

    model = tiny_model("mistral", layers=2, sliding_window=256, max_positions=2048)
    llm = LLM(model=model, tokenizer=tiny_tokenizer(), model_id="tiny-mistral", fingerprint="test")
    kw = dict(config="icr", attention="block", block_positions=positions, query_span="last")  # (the query's rows)
    reranker = AttentionReranker(llm, heads="0-1,1-2", **kw)
    docs = [Document(f"d{i}", f"topic {i} text about the subject number {i}") for i in range(12)]
    windows = reranker.windows("topic 3", docs)
    assert len(windows) > 1 and sorted(i for w in windows for i in w.doc_index) == list(range(12))
    # the query's rows come after every block in the cache: a window of prefix and blocks within the
    # window, but not with the suffix, left its first ~60 tokens (the prefix, a passage's start) unread
    for w in windows:
        assert np.all(w.real.sum(0) > 0), "a context token no query row of a sliding layer read"
    assert {d.id for d in reranker.rank("topic 3", docs)} == {d.id for d in docs}
    with pytest.raises(
        InputError,
        match=r"document 'long' with the block prompt's prefix is \d+ tokens; this model's sliding window of 256 takes at most 255",
    ):
        reranker.rank("topic 3", [*docs, Document("long", "word " * 60)])
    with pytest.raises(  # within the window alone, not with the query's suffix after it
        InputError,
        match=r"document 'mid' with the block prompt's prefix and the query's suffix is \d+ tokens; a sliding-window "
        "layer of the heads reads at most 255 with the query",
    ):
        reranker.rank("topic 3", [*docs, Document("mid", "word " * 30)])
    # and a passage-state store refuses it before encoding any (it was written, then every search refused it)
    with pytest.raises(InputError, match="document 'mid' with the block prompt's prefix and the query's suffix"):
        reranker.check_passage_states([*docs, Document("mid", "word " * 30)])
    reranker.check_passage_states(docs)


def test_a_block_pruning_prompt_keeps_within_the_sliding_window_of_its_heads_layers():
    """The pruner's block prompt was checked against max_prompt_tokens alone: past a sliding layer's
    window, the query's rows read none of the first passages, scored as irrelevant sentences."""
    from _tiny import tiny_model, tiny_tokenizer

    from attnrank.llm.models import LLM
    from attnrank.prune.pruner import ContextPruner
    from attnrank.types import Document

    model = tiny_model("mistral", layers=2, max_positions=4096, sliding_window=512)
    llm = LLM(model=model, tokenizer=tiny_tokenizer(), model_id="tiny-mistral", fingerprint="test")
    pruner = ContextPruner(llm, heads="0-1,1-2", attention="block")
    few = [Document(f"d{i}", f"Topic {i} is told here. It has a second sentence.") for i in range(2)]
    assert pruner.prune("topic 1", few, budget_tokens=40).documents
    many = [Document(f"d{i}", f"Topic {i} is told here. It has a second sentence.") for i in range(8)]
    with pytest.raises(InputError, match=r"holds \d+ tokens > 511, the most a sliding-window layer of the heads reads"):
        pruner.prune("topic 1", many, budget_tokens=40)
    assert ContextPruner(llm, heads="0-1,1-2").prune("topic 1", many, budget_tokens=40).documents  # full: in chunks


def test_a_full_prompt_keeps_within_the_sliding_window_of_its_heads_layers():
    """A full prompt longer than a sliding layer's window: its heads read none of the passages further
    back, recorded as zero attention and ranked as read (Gemma 3, Mistral v0.1). The prompt is cut into
    windows within it now, the pruner's too; a model without such layers reads one prompt as before."""
    from _tiny import tiny_model, tiny_tokenizer

    from attnrank.llm.models import LLM
    from attnrank.prune.pruner import ContextPruner
    from attnrank.types import Document

    docs = [Document(f"d{i}", f"topic {i} text about the subject number {i}, told at some length") for i in range(12)]
    from attnrank.llm.context import read_window

    for window, cut in ((512, True), (None, False)):  # (Mistral's config slides over 4,096 unless told None)
        model = tiny_model("mistral", layers=2, max_positions=4096, sliding_window=window)
        llm = LLM(model=model, tokenizer=tiny_tokenizer(), model_id="tiny-mistral", fingerprint="test")
        reranker = AttentionReranker(llm, heads="0-1,1-2", config="icr")
        windows = reranker.windows("topic 3", docs)
        assert (len(windows) > 1) is cut and sorted(i for w in windows for i in w.doc_index) == list(range(12))
        assert (ContextPruner(llm).max_prompt_tokens == 511) is cut
        assert read_window(reranker.capturer) == (511 if cut else None)
    model = tiny_model("mistral", layers=2, max_positions=4096, sliding_window=512)
    llm = LLM(model=model, tokenizer=tiny_tokenizer(), model_id="tiny-mistral", fingerprint="test")
    reranker = AttentionReranker(llm, heads="0-1,1-2", config="icr")
    long = [*docs, Document("long", "word " * 120)]
    with pytest.raises(InputError, match="does not fit the 511 tokens a sliding-window layer of the heads reads"):
        reranker.rank("topic", long)
    # and a batch names it before its first query is scored (a run's last query lost all the work before it)
    with pytest.raises(InputError, match=r"query #1: document #12 \('long'\) does not fit the 511 tokens"):
        reranker.check_batch(["topic", "topic"], [docs, long])


def test_the_read_window_counts_gemma4s_kv_shared_sliding_layers():
    """Gemma 4's KV-shared layers keep no cache layer of their own (a placeholder without is_sliding):
    heads there read within the window all the same, and were taken to read the whole prompt."""
    from _tiny import tiny_model

    from attnrank.llm.attention import AttentionCapturer
    from attnrank.llm.context import read_window

    types = ["sliding_attention", "full_attention"] * 2
    model = tiny_model(
        "Gemma4Text", layers=4, layer_types=types, num_kv_shared_layers=2, sliding_window=8,
        hidden_size_per_layer_input=8, global_head_dim=8, num_global_key_value_heads=2,
    )  # fmt: skip
    assert read_window(AttentionCapturer(model, [(2, 0)])) == 7  # layer 2: sliding, KV-shared
    assert read_window(AttentionCapturer(model, [(0, 0)])) == 7  # layer 0: sliding, its own cache
    assert read_window(AttentionCapturer(model, [(1, 0), (3, 0)])) is None  # full-attention layers only
