"""The HTTP server, live on 127.0.0.1 with a real HTTP client (httpx), on a tiny random LLM."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from starlette.requests import Request

from attnrank.generate import Generator
from attnrank.prune.pruner import ContextPruner
from attnrank.rerank.attention import AttentionReranker
from attnrank.serve import routes, streaming
from attnrank.serve.app import create_app
from attnrank.serve.background import background_server as live_server
from attnrank.serve.engine import Engine
from attnrank.serve.jobs import Cancelled
from attnrank.serve.schemas import Limits

QUERY = "capital of France?"
DOCS = [
    "Berlin is the capital of Germany.",
    "Paris is the capital of France.",
    "Bananas are yellow.",
    "Rome is in Italy.",
]


@pytest.fixture(scope="module")
def engine(llm, built_retriever):
    return Engine(
        AttentionReranker(llm, config="fused", max_doc_words=40),
        ContextPruner(llm),
        Generator(llm, 8),
        built_retriever,
        "tiny-llama",
    )


@pytest.fixture(scope="module")
def url(engine):
    limits = Limits(max_documents=6, max_document_chars=400, max_query_chars=100, max_total_tokens=1500)
    with live_server(create_app(engine, limits=limits)) as base:
        yield base


@pytest.fixture(scope="module")
def roomy_url(engine):
    """The server with room for a few whole SciFact abstracts (the byte-level tokenizer makes
    about 1,500 tokens of one)."""
    limits = Limits(max_documents=6, max_document_chars=400, max_query_chars=100, max_total_tokens=20_000)
    with live_server(create_app(engine, limits=limits)) as base:
        yield base


def test_rerank_cohere_and_tei_shapes(url, engine):
    ref = engine.reranker.rank(QUERY, DOCS)
    order = [int(i) for i in ref.ids]
    body = {
        "model": "tiny-llama",
        "query": QUERY,
        "documents": [DOCS[0], {"text": DOCS[1]}, *DOCS[2:]],
        "top_n": 3,
        "return_documents": True,
    }
    r = httpx.post(f"{url}/v1/rerank", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["id"] and out["meta"]["api_version"]["version"] == "2"
    assert [x["index"] for x in out["results"]] == order[:3]
    # float32; the server's second pass reads the candidates' vectors its reranker kept from the
    # first, embedded in another batch: equal to rounding
    assert [x["relevance_score"] for x in out["results"]] == pytest.approx(ref.scores[:3], abs=1e-6)
    assert [x["document"]["text"] for x in out["results"]] == [DOCS[i] for i in order[:3]]
    r = httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True})
    assert r.status_code == 200
    tei = r.json()
    assert [x["index"] for x in tei] == order and [x["score"] for x in tei] == pytest.approx(ref.scores, abs=1e-6)
    assert tei[0]["text"] == DOCS[order[0]]
    # what Cohere's API takes and this server cannot do is refused (it was dropped without a word)
    for extra, named in (
        ({"rank_fields": ["title"]}, "rank_fields"),
        ({"relevant_spans": {"mode": "enabled"}}, "relevant_spans"),
        ({"max_chunks_per_doc": 3}, "max_chunks_per_doc"),
    ):
        r = httpx.post(f"{url}/v2/rerank", json={"query": QUERY, "documents": DOCS, **extra})
        assert r.status_code == 422 and f"{named}=" in r.text and "not supported" in r.text, r.text
    # and a field neither API has (Voyage's top_k, a misspelling): it was dropped, every document back, 200
    for path, body in (
        ("/v1/rerank", {"documents": DOCS, "top_k": 2}),
        ("/rerank", {"texts": DOCS, "retrun_text": True}),
    ):
        r = httpx.post(f"{url}{path}", json={"query": QUERY, **body})
        assert r.status_code == 422 and ("top_k" in r.text or "retrun_text" in r.text), r.text
    r = httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": DOCS, "truncation_direction": "Right"})
    assert r.status_code == 200, r.text  # (TEI's own field: accepted, as truncate is)
    left = {"query": QUERY, "texts": DOCS, "truncate": True, "truncation_direction": "Left"}
    assert httpx.post(f"{url}/rerank", json=left).status_code == 422  # (the end kept, asked for; the start kept)
    assert httpx.post(f"{url}/rerank", json={**left, "truncation_direction": "banana"}).status_code == 422
    r = httpx.post(f"{url}/v2/rerank", json={"query": QUERY, "documents": DOCS, "priority": 1})  # (cohere SDK's)
    assert r.status_code == 200, r.text
    r = httpx.post(f"{url}/v2/rerank", json={"query": QUERY, "documents": DOCS, "rank_fields": ["text"]})
    assert r.status_code == 200, r.text


def test_rerank_explain_tokens_add_up(url):
    r = httpx.post(f"{url}/v1/rerank", json={"query": QUERY, "documents": DOCS, "explain": True})
    assert r.status_code == 200
    for res in r.json()["results"]:
        ex = res["explanation"]
        counted = [t["score"] for t in ex["tokens"] if t["counted"]]
        # the explanation's score is the attention part of the (fused) relevance score
        assert sum(counted) == pytest.approx(ex["score"], abs=5e-7 * len(ex["tokens"]) + 1e-12)
        assert "".join(t["text"] for t in ex["tokens"]).endswith(DOCS[res["index"]])


def test_lists_are_counted_before_their_items_are_read(url):
    """The document count was checked after every item was validated: a body within max_body_bytes
    held 4.7 million one-letter documents, 26 s and 3.3 GB before the 413. Items that are no
    documents at all show the order: the count answers first."""
    for path, field in (("/v1/rerank", "documents"), ("/rerank", "texts"), ("/v1/prune", "documents")):
        r = httpx.post(f"{url}{path}", json={"query": QUERY, field: [5] * 7})
        assert r.status_code == 413 and r.json()["message"].startswith(f"{field}=7 > max_documents=6"), (path, r.text)
        r = httpx.post(f"{url}{path}", json={"query": QUERY, field: [5] * 6})  # within the count: the items' turn
        assert r.status_code == 422, (path, r.text)


def test_a_body_past_every_limit_and_a_body_not_utf8_are_answered_as_documented(url):
    """FastAPI's own body limit ran before the server's and answered a body over twice the prune
    limit in plain text ("Content Too Large"), and a body not UTF-8 got 400 {"detail"}: the README
    promises 413 and 422 with a message naming the limit or the field."""
    r = httpx.post(f"{url}/v1/rerank", content=b"x" * 300_000, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "max_body_bytes=95920" in r.json()["message"], r.text
    body = '{"query": "café", "documents": ["a"]}'.encode("latin-1")  # (é is one byte, 0xE9: no UTF-8)
    r = httpx.post(f"{url}/v1/rerank", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["message"].startswith("the body could not be read as JSON"), r.text
    r = httpx.get(f"{url}/v1/nothing-here")  # other HTTP errors as FastAPI answers them
    assert r.status_code == 404


def test_error_statuses_name_the_limit(url):
    def post(path, body):
        return httpx.post(f"{url}{path}", json=body)

    r = post("/rerank", {"query": QUERY, "texts": ["x"] * 7})
    assert r.status_code == 413 and "max_documents=6" in r.json()["message"]
    # counted before the documents are tokenized for max_tokens_per_doc
    r = post("/v1/rerank", {"query": QUERY, "documents": ["x"] * 7, "max_tokens_per_doc": 4})
    assert r.status_code == 413 and r.json()["message"].startswith("documents=7 > max_documents=6")
    r = post("/v1/rerank", {"query": QUERY, "documents": ["y" * 401]})
    assert r.status_code == 413 and "max_document_chars=400" in r.json()["message"]
    # the documents as sent: max_tokens_per_doc cut them after the check, and on the event loop
    r = post("/v1/rerank", {"query": QUERY, "documents": ["y " * 30_000], "max_tokens_per_doc": 5})
    assert r.status_code == 413 and "has 60000 characters > max_document_chars=400" in r.json()["message"]
    # a cut that leaves only the whitespace a document begins with names the cut, not "no text"
    r = post("/v1/rerank", {"query": QUERY, "documents": ["\n\nBones need vitamin D."], "max_tokens_per_doc": 2})
    assert r.status_code == 422 and "max_tokens_per_doc=2 leaves document #0 no text (only the whitespace" in r.text, (
        r.text
    )
    r = post("/rerank", {"query": QUERY, "texts": ["z " * 199] * 5})  # ~2000 byte tokens
    assert r.status_code == 413 and "max_total_tokens=1500" in r.json()["message"]
    # special-token text counted as the model reads it (split into its characters' tokens), not as one
    r = post("/rerank", {"query": QUERY, "texts": ["<|im_end|>" * 35] * 5})
    assert r.status_code == 413 and "max_total_tokens=1500" in r.json()["message"]
    r = post("/rerank", {"query": QUERY, "texts": DOCS, "padding": "y" * 200_000})  # body over the implied size
    assert r.status_code == 413 and "max_body_bytes=95920" in r.json()["message"]
    r = post("/rerank", {"query": "q" * 101, "texts": ["a"]})
    assert r.status_code == 413 and "max_query_chars=100" in r.json()["message"]
    r = post("/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": 0})
    assert r.status_code == 422 and r.json()["message"].startswith("top_n:")
    r = post("/rerank", {"query": "  ", "texts": DOCS})
    assert r.status_code == 422 and "query is empty" in r.json()["message"]
    r = post("/rerank", {"texts": DOCS})
    assert r.status_code == 422 and r.json()["message"].startswith("query:")
    r = post("/v1/search", {"query": QUERY, "top_k": 30, "depth": 20})
    assert r.status_code == 422 and "top_k=30 exceeds depth=20" in r.json()["message"]
    r = post("/v1/search", {"query": QUERY, "k": 30, "first_stage_k": 20})  # the names before top_k/depth
    assert r.status_code == 422 and "top_k=30 exceeds depth=20" in r.json()["message"]


def test_search_prune_ask(roomy_url):
    url = roomy_url
    r = httpx.post(f"{url}/v1/search", json={"query": "vitamin D and bone fractures", "top_k": 3, "depth": 5})
    assert r.status_code == 200
    res = r.json()["results"]
    assert len(res) == 3 and [x["rank"] for x in res] == [1, 2, 3]
    assert all({"dense", "hybrid", "attention"} <= set(x["stage_scores"]) for x in res)
    assert any("bm25" in x["stage_scores"] for x in res)  # (a document without a query term has no BM25 score)
    r = httpx.post(f"{url}/v1/prune", json={"query": QUERY, "documents": DOCS, "budget_tokens": 40})
    assert r.status_code == 200
    p = r.json()
    assert 0 < p["kept_tokens"] <= 40 < p["original_tokens"]
    assert {s["text"] for s in p["sentences"] if s["kept"]} <= set(DOCS)
    both = {"query": "Does vitamin D help bones?", "depth": 4, "top_k": 2, "budget_tokens": 400, "keep_ratio": 0.5}
    r = httpx.post(f"{url}/v1/ask", json=both)  # keep_ratio was dropped without a word
    assert r.status_code == 422 and "both size the pruned context" in r.json()["message"], r.text
    # an error before the first token is an HTTP status: it was a 200 stream with an error event
    r = httpx.post(f"{url}/v1/ask", json={"query": QUERY, "depth": 2, "top_k": 1, "budget_tokens": 1}, timeout=60)
    assert r.status_code == 422 and "fits the budget of 1 tokens" in r.json()["message"], r.text
    # /v1/prune too: an empty context answered 200, read as a pruned one
    r = httpx.post(f"{url}/v1/prune", json={"query": QUERY, "documents": DOCS, "budget_tokens": 1}, timeout=60)
    assert r.status_code == 422 and "fits the budget of 1 tokens" in r.json()["message"], r.text
    with httpx.stream(
        "POST",
        f"{url}/v1/ask",
        json={"query": "Does vitamin D help bones?", "depth": 4, "top_k": 2, "budget_tokens": 400, "max_new_tokens": 6},
        timeout=60,
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = list(r.iter_text())
    parsed = [(e.split("\n")[0][7:], json.loads(e.split("\n")[1][6:])) for e in "".join(events).strip().split("\n\n")]
    assert parsed[-1][0] == "done" and 1 <= len(parsed[-1][1]["sources"]) <= 2
    tokens = "".join(d["text"] for kind, d in parsed if kind == "token")
    assert tokens.strip() == parsed[-1][1]["answer"]
    assert isinstance(parsed[-1][1]["truncated"], bool)  # (whether max_new_tokens cut the answer)
    gc.collect()  # a finished stream, collected, is not counted as abandoned
    queue = _wait_for(url, lambda q: q["running"] == 0)
    assert queue["disconnected"] == 0 and queue["cancelled"] == 0


def test_health_reports_the_reused_passage_states(url, engine):
    """/health shows what the reranker's state cache holds and serves (what --state-cache-mb
    sizes): a request over the same passages again is served from it."""
    before = httpx.get(f"{url}/health").json()["passage_states"]["reranker"]
    body = {"model": "tiny-llama", "query": QUERY, "documents": DOCS}
    for _ in range(2):
        assert httpx.post(f"{url}/v1/rerank", json=body).status_code == 200
    after = httpx.get(f"{url}/health").json()["passage_states"]
    assert after["reranker"] == engine.reranker.states.stats()
    assert after["reranker"]["hits"] >= before["hits"] + len(DOCS) and after["reranker"]["held"] >= len(DOCS)
    assert 0 < after["reranker"]["bytes"] <= after["reranker"]["budget_bytes"] == 1024 << 20
    assert set(after) == {"reranker", "pruner"}


def test_index_routes_need_an_index(llm):
    app = create_app(Engine(AttentionReranker(llm), model_name="tiny"))
    with live_server(app) as base:
        r = httpx.post(f"{base}/v1/search", json={"query": QUERY})
        assert r.status_code == 404 and "--index" in r.json()["message"]
        r = httpx.post(f"{base}/v1/ask", json={"query": QUERY})
        assert r.status_code == 404
        assert httpx.get(f"{base}/health").json()["index_documents"] is None


class GatedReranker:
    """The real reranker behind a gate: each call waits until the test opens it, so that the
    test controls when the worker is busy (the server and the model are the real ones)."""

    def __init__(self, inner):
        self.inner, self.llm = inner, inner.llm
        self.gate, self.entered = threading.Event(), threading.Event()
        self.calls = 0

    def rank(self, *args, **kwargs):
        self.calls += 1
        self.entered.set()
        assert self.gate.wait(30)
        return self.inner.rank(*args, **kwargs)


def _wait_for(base, pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        q = httpx.get(f"{base}/health").json()["queue"]
        if pred(q):
            return q
        time.sleep(0.02)
    raise AssertionError(f"queue never reached the state: {q}")


def test_queue_full_answers_503_with_retry_after(llm):
    gated = GatedReranker(AttentionReranker(llm))
    app = create_app(Engine(gated), max_queued=1)
    server, tokenized = app.state.server, []
    check, truncate = server.check, server.truncate
    server.check = lambda *a: (tokenized.append("check"), check(*a))[1]  # (a spy: what the routes tokenize)
    server.truncate = lambda *a: (tokenized.append("truncate"), truncate(*a))[1]
    with live_server(app) as base, ThreadPoolExecutor(2) as pool:
        body = {"query": QUERY, "texts": DOCS}
        running = pool.submit(httpx.post, f"{base}/rerank", json=body, timeout=30)
        assert gated.entered.wait(10)
        queued = pool.submit(httpx.post, f"{base}/rerank", json=body, timeout=30)
        _wait_for(base, lambda q: q["queued"] == 1)
        before = len(tokenized)
        r = httpx.post(f"{base}/rerank", json=body, timeout=5)  # (a wait for room would time out: no 503)
        assert r.status_code == 503
        assert int(r.headers["Retry-After"]) >= 1 and "queue is full" in r.json()["message"]
        cut = {"query": QUERY, "documents": DOCS, "max_tokens_per_doc": 3}
        assert httpx.post(f"{base}/v1/rerank", json=cut, timeout=5).status_code == 503
        assert len(tokenized) == before  # refused before their documents were tokenized (or cut)
        gated.gate.set()
        assert running.result().status_code == 200 and queued.result().status_code == 200
        q = httpx.get(f"{base}/health").json()["queue"]
        assert q["rejected"] == 2 and q["done"] == 2


def test_client_disconnect_cancels_work(llm):
    gated = GatedReranker(AttentionReranker(llm))
    with live_server(create_app(Engine(gated), max_queued=4)) as base:
        body = {"query": QUERY, "texts": DOCS}
        with pytest.raises(httpx.ReadTimeout):  # client gives up while its job runs
            httpx.post(f"{base}/rerank", json=body, timeout=1.5)
        assert gated.entered.wait(10)
        with pytest.raises(httpx.ReadTimeout):  # ... and while its job waits in the queue
            httpx.post(f"{base}/rerank", json=body, timeout=1.5)
        # the server notices both closed connections (it polls every 50 ms) while the model is busy;
        # the abandoned job no longer counts as queued
        _wait_for(base, lambda q: q["queued"] == 0 and q["disconnected"] == 2)
        gated.gate.set()
        q = _wait_for(base, lambda q: q["queued"] == 0 and q["running"] == 0 and q["cancelled"] == 2)
        assert q["done"] == 0 and gated.calls == 1  # the queued job never reached the model
        r = httpx.post(f"{base}/rerank", json=body, timeout=30)  # the server still serves
        assert r.status_code == 200 and gated.calls == 2


def test_an_answer_whose_client_left_before_its_first_token_is_cancelled(llm, built_retriever):
    """Nothing is written to an /v1/ask stream before its first token, so the server must notice
    a client that gave up meanwhile by itself (here while the reranker holds the job)."""
    gated = GatedReranker(AttentionReranker(llm, config="fused", max_doc_words=40))
    pruner = CountingPruner(ContextPruner(llm))
    engine = Engine(gated, pruner, Generator(llm, 8), built_retriever, "tiny")
    with live_server(create_app(engine)) as base:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{base}/v1/ask", json={"query": QUERY, "depth": 3, "top_k": 1}, timeout=1.5)
        assert gated.entered.wait(10)
        _wait_for(base, lambda q: q["disconnected"] == 1 and q["running"] == 1)  # noticed while it runs
        gated.gate.set()
        q = _wait_for(base, lambda q: q["running"] == 0 and q["cancelled"] == 1)
        assert q["done"] == 0 and pruner.calls == 0  # stopped before the next stage


def test_an_answer_stream_dropped_before_it_began_cancels_its_job(llm):
    """A response the server never began (its client left first) never runs its stream's
    ``finally``: dropping the stream must cancel the job all the same."""
    server = create_app(Engine(AttentionReranker(llm))).state.server
    gate = threading.Event()

    def work(job):
        gate.wait(10)
        job.check()
        return "answered for nobody"

    async def drop_unstarted():
        job = server.jobs.submit(work)
        stream = streaming.event_stream(Request({"type": "http"}), server, job, asyncio.Queue(), {})
        del stream  # as the server drops a response it never began
        gc.collect()
        await asyncio.sleep(0)  # (the finalizer cancels from the event loop)
        assert job.cancelled and server.jobs.counts["disconnected"] == 1
        gate.set()
        with pytest.raises(Cancelled):
            await job.future

    try:
        asyncio.run(drop_unstarted())
    finally:
        server.jobs.close()


class CountingPruner:
    """The real pruner, its calls counted."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def prune(self, *args, **kwargs):
        self.calls += 1
        return self.inner.prune(*args, **kwargs)


def test_abandoned_jobs_give_back_their_queue_place(llm):
    gated = GatedReranker(AttentionReranker(llm))
    with live_server(create_app(Engine(gated), max_queued=1)) as base, ThreadPoolExecutor(2) as pool:
        body = {"query": QUERY, "texts": DOCS}
        running = pool.submit(httpx.post, f"{base}/rerank", json=body, timeout=30)
        assert gated.entered.wait(10)
        with pytest.raises(httpx.ReadTimeout):  # waits in the only queue place, then gives up
            httpx.post(f"{base}/rerank", json=body, timeout=1.5)
        _wait_for(base, lambda q: q["disconnected"] == 1)
        waiting = pool.submit(httpx.post, f"{base}/rerank", json=body, timeout=30)
        _wait_for(base, lambda q: q["queued"] == 1 or q["rejected"] == 1)
        gated.gate.set()
        assert running.result().status_code == 200
        assert waiting.result().status_code == 200  # not 503: nobody live was waiting
        assert httpx.get(f"{base}/health").json()["queue"]["rejected"] == 0


def test_index_routes_keep_to_the_limits(url):
    def post(path, body):
        return httpx.post(f"{url}{path}", json=body, timeout=30)

    r = post("/v1/search", {"query": QUERY, "top_k": 3, "depth": 7})
    assert r.status_code == 413 and r.json()["message"].startswith("depth=7 > max_documents=6;")
    r = post("/v1/search", {"query": QUERY, "top_k": 7, "rerank": False})
    assert r.status_code == 413 and "top_k=7 > max_documents=6" in r.json()["message"]
    r = post("/v1/prune", {"query": QUERY, "top_k": 7})
    assert r.status_code == 413 and "top_k=7 > max_documents=6" in r.json()["message"]
    r = post("/v1/prune", {"query": QUERY, "top_k": 3})  # three abstracts: far over 1500 tokens
    assert r.status_code == 413 and "max_total_tokens=1500" in r.json()["message"]
    r = post("/v1/ask", {"query": QUERY, "depth": 7, "top_k": 2})
    assert r.status_code == 413 and "depth=7 > max_documents=6" in r.json()["message"]
    # The passages a search or an answer would feed the model count against max_total_tokens too.
    r = post("/v1/search", {"query": QUERY, "top_k": 2, "depth": 3})
    assert r.status_code == 413 and "max_total_tokens=1500; ask for fewer (lower depth)" in r.json()["message"]
    r = post("/v1/ask", {"query": QUERY, "depth": 3, "top_k": 2})
    assert r.status_code == 413 and "max_total_tokens=1500; ask for fewer" in r.json()["message"]
    r = post("/v1/search", {"query": QUERY, "top_k": 6, "rerank": False})  # no model reads them
    assert r.status_code == 200 and len(r.json()["results"]) == 6
    # defaults the client never sent keep within the limits: top_k 10 and depth 20 were refused
    # ("top_k=10 > max_documents=6"), naming fields the request did not hold
    r = post("/v1/search", {"query": QUERY, "rerank": False})
    assert r.status_code == 200 and len(r.json()["results"]) == 6
    r = post("/v1/search", {"query": QUERY, "top_k": 2})  # depth 6 here: six abstracts, over the tokens
    assert r.status_code == 413 and "max_total_tokens=1500" in r.json()["message"]
    r = post("/v1/ask", {"query": QUERY, "top_k": 2})
    assert r.status_code == 413 and "max_total_tokens=1500" in r.json()["message"]
    # a top_k not sent keeps within a depth sent ("top_k=6 exceeds depth=5" named a field never sent),
    # and a depth not sent follows a top_k sent, which is then the one named
    r = post("/v1/search", {"query": QUERY, "depth": 1})
    assert r.status_code == 200 and len(r.json()["results"]) == 1
    r = post("/v1/ask", {"query": QUERY, "top_k": 7})
    assert r.status_code == 413 and r.json()["message"].startswith("top_k=7 > max_documents=6")


def test_a_document_id_that_is_not_unicode_is_refused_before_the_model_runs(url):
    """A lone surrogate in an id passed, the pruner ran, and writing the answer failed: a 500."""
    body = {"query": QUERY, "documents": [{"text": DOCS[0], "id": "\ud800"}], "budget_tokens": 5}
    r = httpx.post(f"{url}/v1/prune", content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["message"].startswith("document id #0 ")


def test_prune_refuses_top_k_with_documents(url):
    """top_k with documents (all pruned) was dropped without a word: 200 (`prune` refuses -k with --corpus)."""
    for name in ("top_k", "k"):  # (the name before top_k too)
        body = {"query": QUERY, "documents": DOCS[:2], name: 50, "budget_tokens": 40}
        r = httpx.post(f"{url}/v1/prune", json=body, timeout=30)
        assert r.status_code == 422, r.text
        assert r.json()["message"] == (
            "top_k=50 applies to index hits, but all 2 documents given are pruned; "
            "drop top_k (or drop documents to prune the index's top_k hits)"
        )


def test_search_refuses_depth_without_rerank(url):
    """depth with rerank false (no candidates are reranked) was dropped without a word: 200."""

    def post(path, body):
        return httpx.post(f"{url}{path}", json=body, timeout=30)

    for name in ("depth", "first_stage_k"):  # (the name before depth too)
        r = post("/v1/search", {"query": QUERY, "top_k": 5, name: 1, "rerank": False})
        assert r.status_code == 422, r.text
        assert r.json()["message"] == (
            "depth=1 sizes the first-stage candidates reranked, but rerank is false "
            "(the index's top_k=5 hits come back as they are); drop depth or set rerank true"
        )
    r = post("/v1/search", {"query": QUERY, "top_k": 2, "rerank": False})  # its default depth: not given
    assert r.status_code == 200 and len(r.json()["results"]) == 2


def test_the_default_prune_budget_is_the_package_one(url, monkeypatch):
    """/v1/prune without a budget keeps DEFAULT_BUDGET_TOKENS, as its schema says (it was a literal 300)."""
    from attnrank.config import DEFAULT_BUDGET_TOKENS
    from attnrank.serve.schemas import PruneRequest

    monkeypatch.setattr(routes, "DEFAULT_BUDGET_TOKENS", 37)  # the live server runs in this process
    r = httpx.post(f"{url}/v1/prune", json={"query": QUERY, "documents": DOCS}, timeout=30)
    assert r.status_code == 200 and r.json()["budget_tokens"] == 37, r.text
    assert f"default {DEFAULT_BUDGET_TOKENS} " in PruneRequest.model_fields["budget_tokens"].description


def test_empty_document_lists_are_refused(url):
    r = httpx.post(f"{url}/v1/rerank", json={"query": QUERY, "documents": []})
    assert r.status_code == 422 and r.json()["message"].startswith("documents:")
    r = httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": []})
    assert r.status_code == 422 and r.json()["message"].startswith("texts:")


def test_chunked_body_over_the_limit_names_it(url):
    def chunked(pad: int):
        # (the padding in a text's trailing spaces: a field neither API has is refused now)
        data = json.dumps({"query": QUERY, "texts": [*DOCS[:-1], DOCS[-1] + " " * pad]}).encode()
        return (data[i : i + 4096] for i in range(0, len(data), 4096))  # no Content-Length

    for pad in (200_000, 500_000):  # over the limit; over FastAPI's backstop too
        r = httpx.post(f"{url}/rerank", content=chunked(pad), headers={"content-type": "application/json"})
        assert r.status_code == 413 and "max_body_bytes=95920" in r.json()["message"]
    r = httpx.post(f"{url}/rerank", content=chunked(10), headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 200 and len(r.json()) == len(DOCS)
    # /v1/prune alone has room for documents sent with their sentences (which repeat the text)
    r = httpx.post(f"{url}/v1/prune", content=chunked(100_000), headers={"content-type": "application/json"})
    assert r.status_code == 422 and "not a field of this request" in r.json()["message"]  # past the size check
    r = httpx.post(f"{url}/v1/prune", content=chunked(200_000), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "max_prune_body_bytes=134320" in r.json()["message"]


def test_a_small_declared_length_beside_a_chunked_body_does_not_pass_the_limit(url):
    """With both Content-Length: 10 and Transfer-Encoding: chunked the limit trusted the length,
    and the server read the whole chunked body (200 KB to /v1/search, whose limit is 66 KB)."""
    import socket
    from urllib.parse import urlsplit

    body = json.dumps({"query": QUERY, "padding": "y" * 200_000}).encode()
    chunked = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + 4096]), body[i : i + 4096]) for i in range(0, len(body), 4096)
    )
    host, port = urlsplit(url).hostname, urlsplit(url).port
    head = (
        f"POST /v1/search HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        "Content-Length: 10\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(head + chunked[:90_000])  # past the limit; the server answers before the rest
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status = answer.split(b"\r\n", 1)[0]
    assert b" 413 " in status + b" " and b"max_query_body_bytes" in answer, answer[:300]


def test_one_log_line_per_request(url, caplog):
    with caplog.at_level("INFO", logger="attnrank.serve.access"):
        assert httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": DOCS}).status_code == 200
        assert httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": ["x"] * 7}).status_code == 413
        time.sleep(0.1)
    lines = [r.getMessage() for r in caplog.records if r.name == "attnrank.serve.access"]
    assert len(lines) == 2
    assert (
        lines[0].startswith("POST /rerank 200 latency=") and "queue_wait=0." in lines[0] and "candidates=4" in lines[0]
    )
    assert lines[1].startswith("POST /rerank 413 ") and "queue_wait=-" in lines[1]


def test_a_body_not_read_as_json_is_a_422_naming_the_fix(url):
    body = json.dumps({"query": QUERY, "texts": DOCS}).encode()
    for headers in ({}, {"content-type": "application/x-www-form-urlencoded"}):  # curl -d without the header
        r = httpx.post(f"{url}/rerank", content=body, headers=headers)
        assert r.status_code == 422 and "'content-type: application/json'" in r.json()["message"]
    as_json = {"content-type": "application/json"}
    r = httpx.post(f"{url}/rerank", content=b'{"query": "a", "texts": ["b"', headers=as_json)
    assert r.status_code == 422 and r.json()["message"].startswith("the body is not valid JSON (at character ")
    r = httpx.post(f"{url}/rerank", content=b'{"query": NaN, "texts": ["b"]}', headers=as_json)  # read, not JSON
    assert r.status_code == 422 and r.json()["message"].startswith("query: Input should be a valid string")
    r = httpx.post(f"{url}/rerank", content=b"[1, 2]", headers=as_json)
    assert r.status_code == 422 and r.json()["message"].startswith("body: Input should be")


def test_a_key_given_twice_is_refused_not_read_as_its_last_value(url):
    # Python's json keeps the last of two equal keys: this body was reranked for "Bananas" (200),
    # while whatever read the first "query" (a proxy, a log) saw the other question
    as_json = {"content-type": "application/json"}
    twice = b'{"query": "capital of France?", "texts": ["Paris."], "query": "Bananas"}'
    r = httpx.post(f"{url}/rerank", content=twice, headers=as_json)
    assert r.status_code == 422 and r.json()["message"] == (
        "the body gives the key 'query' twice in one object; send each key once"
    ), r.text
    nested = b'{"query": "q", "documents": [{"text": "Paris.", "id": "a", "id": "b"}], "budget_tokens": 100}'
    r = httpx.post(f"{url}/v1/prune", content=nested, headers=as_json)
    assert r.status_code == 422 and "the key 'id' twice" in r.json()["message"], r.text
    once = b'{"query": "capital of France?", "texts": ["Paris.", "Rome."]}'
    assert httpx.post(f"{url}/rerank", content=once, headers=as_json).status_code == 200


def test_unknown_fields_of_attnrank_bodies_are_refused(url):
    def post(path, body):
        return httpx.post(f"{url}{path}", json=body, timeout=30)

    r = post("/v1/search", {"query": QUERY, "topk": 2})  # else 10 results, the default, without a word
    assert r.status_code == 422 and r.json()["message"].startswith("topk: not a field of this request")
    r = post("/v1/search", {"query": QUERY, "top_k": 2, "k": 3})  # two names of one field
    assert r.status_code == 422 and r.json()["message"].startswith("k: not a field")
    r = post("/v1/prune", {"query": QUERY, "documents": DOCS, "budget": 40})
    assert r.status_code == 422 and r.json()["message"].startswith("budget: not a field")
    r = post("/v1/ask", {"query": QUERY, "depth": 4, "top_k": 2, "max_tokens": 6})
    assert r.status_code == 422 and r.json()["message"].startswith("max_tokens: not a field")
    r = post("/v1/ask", {"query": QUERY, "k": 10})  # was depth here, top_k in /v1/search: 5 of 10 kept
    assert r.status_code == 422 and "k is ambiguous in /v1/ask" in r.json()["message"], r.json()
    r = post("/v1/prune", {"query": QUERY, "documents": DOCS, "keep_ratio": True})  # was a ratio of 1.0
    assert r.status_code == 422 and r.json()["message"].startswith("keep_ratio"), r.json()
    # a document's id, title and pre-split sentences were dropped: its passage came back as "0"
    doc = {"id": "d7", "title": "Bones", "text": DOCS[0], "sentences": [DOCS[0]]}
    r = post("/v1/prune", {"query": QUERY, "documents": [doc, DOCS[1]], "budget_tokens": 1000})
    assert r.status_code == 200, r.text
    assert [(d["id"], d["title"]) for d in r.json()["documents"]] == [("d7", "Bones"), ("1", "")]
    assert r.json()["documents"][0]["metadata"] == {}
    # pre-split sentences are the pruner's sentences=: a list that leaves text out was set aside for
    # the pruner's own split (a log line), and the answer's sentence numbers counted that split
    partial = {"text": "Alpha one. Beta two. Gamma three.", "sentences": ["Alpha one.", "Gamma three."]}
    r = post("/v1/prune", {"query": QUERY, "documents": [partial], "budget_tokens": 1000})
    assert r.status_code == 422 and "leave text of the passage out" in r.json()["message"], r.json()
    # ids name each sentence's document in the answer: two documents under one id were one
    r = post("/v1/prune", {"query": QUERY, "documents": [{"text": DOCS[0], "id": "x"}, {"text": DOCS[1], "id": "x"}]})
    assert r.status_code == 422 and "document #1 repeats the id 'x'" in r.json()["message"], r.json()
    r = post("/v1/prune", {"query": QUERY, "documents": [{"text": DOCS[0], "id": "1"}, DOCS[1]]})
    assert r.status_code == 422 and "document #1 has no id, and its position '1'" in r.json()["message"], r.json()
    r = post("/v1/prune", {"query": QUERY, "documents": [{"text": DOCS[0], "url": "x"}]})
    assert r.status_code == 422 and any(
        e["loc"][-1] == "url" and e["type"] == "extra_forbidden" for e in r.json()["detail"]
    )


def test_cohere_v2_client_reranks_through_the_server(url, engine):
    """Cohere's own client (ClientV2, pointed at this server) posts to /v2/rerank and parses the
    answer: the order and scores are the reranker's."""
    cohere = pytest.importorskip("cohere")
    ref = engine.reranker.rank(QUERY, DOCS)
    client = cohere.ClientV2(api_key="unused", base_url=url, timeout=60)
    got = client.rerank(model="tiny-llama", query=QUERY, documents=DOCS, top_n=2)
    assert [r.index for r in got.results] == [int(i) for i in ref.ids[:2]]
    assert [r.relevance_score for r in got.results] == pytest.approx(ref.scores[:2], abs=1e-6)


def test_max_tokens_per_doc_never_leaves_more_tokens_than_asked(engine):
    """The cut was made at the end of token N, so a character split over tokens N and N + 1 (as
    byte-level tokenizers split non-ASCII characters) came back whole: "ééé" cut to 1 token kept
    "é", 2 tokens."""
    from attnrank.errors import InputError
    from attnrank.llm.texts import tokenize
    from attnrank.serve.server import Server

    server = Server(engine, Limits(), max_queued=1)
    for text in ("ééé", "中文字 and more", "Bones need vitamin D; 骨骼需要维生素D。"):
        for n in range(1, 8):
            try:
                (cut,) = server.truncate([text], n)
            except InputError:  # nothing whole fits: refused, never cut longer
                assert n < len(tokenize(server.tokenizer, text)["input_ids"])
                continue
            assert len(tokenize(server.tokenizer, cut)["input_ids"]) <= n, (text, n, cut)
            assert text.startswith(cut)
    assert server.truncate(["ééé"], 2) == ["é"]


def test_returned_documents_are_the_ones_sent(url):
    body = {"query": QUERY, "documents": DOCS, "max_tokens_per_doc": 5, "return_documents": True}
    r = httpx.post(f"{url}/v1/rerank", json=body, timeout=30)
    assert r.status_code == 200
    results = r.json()["results"]
    assert len(results) == len(DOCS) and all(x["document"]["text"] == DOCS[x["index"]] for x in results)


@pytest.mark.parametrize("rerank", [True, False])
def test_search_results_keep_the_corpus_metadata(llm, rerank):
    from attnrank.index.retriever import HybridRetriever
    from attnrank.types import Document

    docs = [Document(f"d{i}", t, f"T{i}", {"url": f"https://x/{i}"}) for i, t in enumerate(DOCS)]
    index = HybridRetriever().index(docs, show_progress=False)
    with live_server(create_app(Engine(AttentionReranker(llm, config="fused", max_doc_words=40), index=index))) as base:
        body = {"query": QUERY, "top_k": 3, "rerank": rerank, **({"depth": 4} if rerank else {})}  # (no depth unranked)
        r = httpx.post(f"{base}/v1/search", json=body, timeout=60)
    assert r.status_code == 200, r.text
    res = r.json()["results"]
    assert len(res) == 3 and all(x["metadata"] == {"url": f"https://x/{x['id'][1:]}"} for x in res)


def test_prune_keeps_the_corpus_metadata(llm):
    """/v1/prune over the index returns each document's corpus metadata, as /v1/search does (it
    used to drop it); documents sent in the request have none."""
    from attnrank.index.retriever import HybridRetriever
    from attnrank.types import Document

    docs = [Document(f"d{i}", t, f"T{i}", {"url": f"https://x/{i}"}) for i, t in enumerate(DOCS)]
    index = HybridRetriever().index(docs, show_progress=False)
    engine = Engine(AttentionReranker(llm, config="fused", max_doc_words=40), ContextPruner(llm), index=index)
    with live_server(create_app(engine)) as base:
        r = httpx.post(f"{base}/v1/prune", json={"query": QUERY, "top_k": 3, "budget_tokens": 400}, timeout=60)
        sent = httpx.post(f"{base}/v1/prune", json={"query": QUERY, "documents": DOCS[:2], "budget_tokens": 400})
    assert r.status_code == 200, r.text
    got = r.json()["documents"]
    assert got and all(x["metadata"] == {"url": f"https://x/{x['id'][1:]}"} for x in got)
    assert sent.status_code == 200 and all(x["metadata"] == {} for x in sent.json()["documents"])


def test_ask_without_a_pruner_answers_and_refuses_a_budget(llm, built_retriever):
    """A server without a pruner answers /v1/ask over the top passages as they are; a budget in the
    request (which would size nothing) is a 422, not silently ignored."""
    engine = Engine(
        AttentionReranker(llm, config="fused", max_doc_words=40), None, Generator(llm, 4), built_retriever, "tiny"
    )
    with live_server(create_app(engine)) as base:
        r = httpx.post(f"{base}/v1/ask", json={"query": QUERY, "depth": 4, "top_k": 2})
        assert r.status_code == 200 and "event: done" in r.text
        r = httpx.post(f"{base}/v1/ask", json={"query": QUERY, "depth": 4, "top_k": 2, "budget_tokens": 50})
        assert r.status_code == 422 and "runs without a pruner" in r.json()["message"]


def test_the_engine_is_built_from_one_rerank_config(tiny_dir):
    """``attnrank serve`` takes the shared reranking options: the engine's reranker is the config's
    (default preset: the signals with the query likelihood), and its pruner reads every head, as
    ``attnrank ask`` and ``Pipeline.from_model`` prune (it read the heads given to the reranker);
    preset signals reranks without loading a model."""
    from attnrank.rerank.config import RerankConfig
    from attnrank.serve.engine import build_engine

    default = build_engine(RerankConfig.preset(model=str(tiny_dir)), generate=False)
    assert default.reranker.config.name == "likelihood" and not default.reranker.uses_attention
    assert default.reranker.uses_llm and default.reranker._llm is not None
    assert default.pruner is not None and default.pruner.heads is None  # all heads, as `attnrank ask`
    fused = build_engine(RerankConfig.preset("fused", model=str(tiny_dir), heads="0-1,2-3"), prune=True)
    assert fused.reranker.uses_attention and fused.reranker.head_list == [(0, 1), (2, 3)]
    assert fused.pruner is not None and fused.pruner.heads is None  # all heads, as `attnrank ask`
    assert fused.generator is None  # no index: nothing for /v1/ask to answer over
    bare = build_engine(RerankConfig.preset("signals", model=str(tiny_dir)), prune=False)  # no model runs
    assert bare.pruner is None and bare.generator is None and not bare.reranker.uses_attention
    assert bare.model_name == str(tiny_dir) and bare.reranker._llm is None  # and none was loaded
    # the pruner runs on the reranker's model: a PruneConfig asking for another was silently ignored
    from attnrank.errors import InputError
    from attnrank.prune.config import PruneConfig

    with pytest.raises(InputError, match=r"PruneConfig\(model='other'\) but the pipeline's model"):
        build_engine(RerankConfig.preset(model=str(tiny_dir)), prune=PruneConfig(model="other"))
    from attnrank.config import DEFAULT_LLM
    from attnrank.pipeline.checks import check_shared_model

    check_shared_model(None, "auto", "cpu", PruneConfig(model=DEFAULT_LLM))  # the default, named: the same model
    with pytest.raises(InputError, match=r"PruneConfig\(dtype='bfloat16'\)"):
        build_engine(RerankConfig.preset(model=str(tiny_dir), dtype="float32"), prune=PruneConfig(dtype="bfloat16"))


def test_the_engine_checks_its_stages_before_the_model_loads(tiny_dir, monkeypatch, built_retriever, tmp_path):
    """build_engine ran no registry lookup nor head check before the load: heads outside the model
    (the reranker's or the pruner's) failed after it."""
    from attnrank.errors import InputError
    from attnrank.llm import models
    from attnrank.prune.config import PruneConfig
    from attnrank.rerank.config import RerankConfig
    from attnrank.serve.engine import build_engine

    loads: list[object] = []
    monkeypatch.setattr(models, "_load_cached", lambda *a: loads.append(a))
    with pytest.raises(InputError, match="head pairs 99-0 are out of range"):
        build_engine(RerankConfig.preset("icr", model=str(tiny_dir), heads="99-0"), prune=False)
    with pytest.raises(InputError, match="head pairs 99-0 are out of range"):
        build_engine(RerankConfig.preset(model=str(tiny_dir)), prune=PruneConfig(heads="99-0"))
    index = built_retriever.save(tmp_path / "ix")
    with pytest.raises(InputError, match="max_new_tokens=0 must be an integer >= 1"):  # (its generator's)
        build_engine(RerankConfig.preset(model=str(tiny_dir)), index=index, max_new_tokens=0)
    assert loads == []


def test_an_app_served_again_after_its_shutdown_still_answers(llm):
    """Its shutdown stopped the model worker: a second serving hung every request (the worker
    starts again with the app's lifespan, and a job sent to a stopped one is refused)."""
    app = create_app(Engine(AttentionReranker(llm, config="fused", max_doc_words=40), model_name="tiny"))
    for _ in range(2):
        with live_server(app) as base:
            r = httpx.post(f"{base}/rerank", json={"query": QUERY, "texts": DOCS}, timeout=30)
            assert r.status_code == 200 and len(r.json()) == 4
    server = app.state.server

    async def submit():
        return server.jobs.submit(lambda job: None)

    with pytest.raises(Cancelled, match="worker is stopped"):
        asyncio.run(submit())


def test_a_signals_server_loads_no_model_and_refuses_token_options(tmp_path):
    """Reading the reranker's llm to find a tokenizer loaded the model preset signals avoids; its
    token options were then silently ignored."""
    from _tiny import save_tiny

    rr = AttentionReranker(str(save_tiny(tmp_path / "tiny")), config="signals")
    app = create_app(Engine(rr, model_name="signals"))
    assert rr._llm is None and app.state.server.tokenizer is None
    with live_server(app) as base:
        r = httpx.post(f"{base}/v1/rerank", json={"query": QUERY, "documents": DOCS}, timeout=60)
        assert r.status_code == 200 and len(r.json()["results"]) == 4
        r = httpx.post(f"{base}/v1/rerank", json={"query": QUERY, "documents": DOCS, "max_tokens_per_doc": 5})
        assert r.status_code == 422 and "max_tokens_per_doc=5 counts the model's tokens" in r.json()["message"]
        r = httpx.post(f"{base}/v1/rerank", json={"query": QUERY, "documents": DOCS, "explain": True})
        assert r.status_code == 422 and "computes no per-token attention evidence" in r.json()["message"]
        assert app.state.server.jobs.stats()["done"] == 1  # the refused ones never queued
    assert rr._llm is None


JSON = {"content-type": "application/json"}


def test_a_lone_surrogate_is_a_422_naming_the_item(url):
    """The tokenizer met it first (a bare 500), before the reranker's own check."""
    for path, body in (
        ("/v1/rerank", {"query": QUERY, "documents": ["fine", "a\ud800b"]}),
        ("/rerank", {"query": "q\udfff", "texts": DOCS}),
        ("/v1/prune", {"query": QUERY, "documents": ["a\ud800b"]}),
    ):
        r = httpx.post(f"{url}{path}", content=json.dumps(body), headers=JSON, timeout=30)  # "\ud800" escapes
        assert r.status_code == 422, (path, r.text)
        assert "is not valid Unicode" in r.json()["message"]
    r = httpx.post(f"{url}/v1/rerank", content=json.dumps({"query": QUERY, "documents": ["a\ud800b"]}), headers=JSON)
    assert r.json()["message"].startswith("document #0")


def test_a_signals_server_with_a_pruner_counts_the_pruners_tokens(tmp_path, llm):
    """With preset signals the server took no tokenizer, so max_total_tokens was not checked,
    though the pruner's model read every document of /v1/prune."""
    from _tiny import save_tiny

    rr = AttentionReranker(str(save_tiny(tmp_path / "tiny")), config="signals")
    app = create_app(Engine(rr, ContextPruner(llm), model_name="signals"), limits=Limits(max_total_tokens=300))
    assert rr._llm is None and app.state.server.tokenizer is llm.tokenizer
    with live_server(app) as base:
        r = httpx.post(f"{base}/v1/prune", json={"query": QUERY, "documents": ["z " * 199] * 2}, timeout=60)
        assert r.status_code == 413 and "max_total_tokens=300" in r.json()["message"]
        r = httpx.post(f"{base}/v1/prune", json={"query": QUERY, "documents": DOCS, "budget_tokens": 40}, timeout=60)
        assert r.status_code == 200, r.text
    assert rr._llm is None


def test_no_request_within_the_limits_is_refused_for_its_body_size():
    """Documents of non-ASCII text sent as json.dumps writes them (\\uXXXX, 6 bytes; 12 outside the
    BMP) were refused as too large within every stated limit, and so were /v1/prune's documents
    given with their sentences (which repeat the text)."""
    limits = Limits(max_documents=50, max_document_chars=20_000, max_query_chars=10)
    for char in ("é", "😀", "\x01"):
        body = json.dumps({"query": char * 10, "documents": [char * 20_000] * 50, "top_n": 2}).encode()
        assert len(body) <= limits.max_body_bytes, char
        many = Limits(max_documents=10_000, max_document_chars=10, max_query_chars=10)  # small documents
        body = json.dumps({"query": char * 10, "documents": [{"text": char * 10}] * 10_000, "top_n": 2}).encode()
        assert len(body) <= many.max_body_bytes, char  # (each document's own keys and quotes counted too)
        doc = {"id": "d", "text": char * 20_000, "sentences": [char] * 20_000}
        body = json.dumps({"query": char * 10, "documents": [doc] * 50, "budget_tokens": 5}).encode()
        assert limits.max_body_bytes < len(body) <= limits.max_prune_body_bytes, char  # (prune's own limit)


def test_counts_are_whole_numbers_not_booleans_or_fractions(url):
    """Pydantic's lax mode read {"top_k": true} as 1 and 2.0 as 2; the library refuses both."""
    for body in ({"query": QUERY, "top_k": True}, {"query": QUERY, "top_k": 2.5}, {"query": QUERY, "depth": 3.0}):
        r = httpx.post(f"{url}/v1/search", json=body)
        assert r.status_code == 422, (body, r.text)
    r = httpx.post(f"{url}/v1/rerank", json={"query": QUERY, "documents": DOCS, "top_n": True})
    assert r.status_code == 422


def test_switches_are_json_booleans(url):
    """Lax mode read "yes" and 1 as true, and "false" or 0 as false: a mistyped body ran otherwise
    than its writer meant, where a count of the wrong kind is refused."""
    for value in ("yes", 1, "false", 0):
        for route, body in (
            ("/v1/rerank", {"query": QUERY, "documents": DOCS, "return_documents": value}),
            ("/rerank", {"query": QUERY, "texts": DOCS, "return_text": value}),
            ("/rerank", {"query": QUERY, "texts": DOCS, "raw_scores": value}),
            ("/v1/search", {"query": QUERY, "rerank": value}),
        ):
            r = httpx.post(f"{url}{route}", json=body)
            assert r.status_code == 422 and "boolean" in r.text.lower(), (route, body, r.text)
    r = httpx.post(f"{url}/v1/rerank", json={"query": QUERY, "documents": DOCS, "return_documents": True})
    assert r.status_code == 200 and r.json()["results"][0]["document"]["text"]


def test_any_object_with_rank_serves_as_the_reranker():
    """Engine says the reranker is any object with rank(); create_app read its .llm and failed."""
    from attnrank.types import RankedResults, ScoredDocument

    class ByLength:
        def rank(self, query, docs, k=None, **kw):
            scored = sorted(enumerate(docs), key=lambda p: -len(p[1].text))
            out = [ScoredDocument(d.id, float(len(d.text)), r, d.text) for r, (_, d) in enumerate(scored, start=1)]
            return RankedResults(query, out[:k] if k else out)

    with live_server(create_app(Engine(ByLength()))) as base:
        r = httpx.post(f"{base}/v1/rerank", json={"query": "q", "documents": ["a", "abc", "ab"]})
        assert r.status_code == 200 and [x["index"] for x in r.json()["results"]] == [1, 2, 0]


def test_the_prune_body_limit_holds_behind_a_path_prefix_and_with_a_trailing_slash():
    """The larger /v1/prune limit was looked up by the exact path: behind --root-path /api (which
    uvicorn puts into the path) or at /v1/prune/ a prune body with sentences got the smaller one."""
    from attnrank.serve.middleware import BodyLimitMiddleware

    seen = []

    async def app(scope, receive, send):
        seen.append(scope["path"])

    async def send(message):
        if message["type"] == "http.response.start":
            seen.append(message["status"])

    middleware = BodyLimitMiddleware(app, 100, by_path={"/v1/prune": (1000, "max_prune_body_bytes", "fewer")})
    for path, root in (("/api/v1/prune", "/api"), ("/v1/prune/", ""), ("/v1/rerank", "")):
        scope = {"type": "http", "path": path, "root_path": root, "headers": [(b"content-length", b"500")]}
        asyncio.run(middleware(scope, None, send))
    assert seen == ["/api/v1/prune", "/v1/prune/", 413]


def test_a_shutdown_answers_the_queued_jobs_and_lets_the_running_one_finish(llm):
    """uvicorn waits for every open connection before the app's own shutdown, and a queued request
    holds one: a shutdown ran every queued job first (minutes of answers for nobody waiting on them)."""
    gated = GatedReranker(AttentionReranker(llm))
    app = create_app(Engine(gated), max_queued=4)
    body = {"query": QUERY, "texts": DOCS}
    with ThreadPoolExecutor(3) as pool:
        with live_server(app) as base:
            running = pool.submit(httpx.post, f"{base}/rerank", json=body, timeout=30)
            assert gated.entered.wait(10)
            queued = [pool.submit(httpx.post, f"{base}/rerank", json=body, timeout=30) for _ in range(2)]
            _wait_for(base, lambda q: q["queued"] == 2)
            threading.Timer(1.0, gated.gate.set).start()  # the running job ends a second into the shutdown
        assert running.result().status_code == 200
        for r in (f.result() for f in queued):
            assert r.status_code == 503 and r.json()["message"] == "the server is shutting down; retry"
    assert gated.calls == 1


class FailingReranker:
    """A reranker that fails as the library does where a model cannot score (a stand-in for the model)."""

    def rank(self, *args, **kwargs):
        from attnrank.errors import ModelError

        raise ModelError("model tiny cannot score these passages; use another model")


def test_the_librarys_other_errors_are_one_json_line():
    """A ModelError (non-finite attention, a damaged index's scores, ...) was a bare
    'Internal Server Error' in plain text, its one line lost."""
    with live_server(create_app(Engine(FailingReranker()))) as base:
        r = httpx.post(f"{base}/rerank", json={"query": QUERY, "texts": DOCS}, timeout=30)
    assert r.status_code == 500 and r.json() == {"message": "model tiny cannot score these passages; use another model"}


class DamagedStoreReranker:
    """A reranker whose index's passage-state store turns out damaged mid-request, as the library raises it."""

    def rank(self, *args, **kwargs):
        from attnrank.llm.statestore import StoreDamagedError

        raise StoreDamagedError("the passage states at /srv/private/ix/passage_states are damaged; rebuild them")


def test_a_damaged_passage_state_store_is_the_servers_fault_not_the_clients(caplog):
    """It was a 422 (the client's input, not retried) naming the server's paths and the operator's fix."""
    with (
        caplog.at_level("ERROR", logger="attnrank.serve.app"),
        live_server(create_app(Engine(DamagedStoreReranker()))) as base,
    ):
        r = httpx.post(f"{base}/rerank", json={"query": QUERY, "texts": DOCS}, timeout=30)
    assert r.status_code == 500 and "/srv/private" not in r.text and "see the server log" in r.json()["message"]
    assert "/srv/private/ix/passage_states are damaged" in caplog.text


def test_a_loopback_server_answers_its_own_host_names_only(engine):
    """A web page could reach a server on 127.0.0.1 through a name of its own that resolves there
    (DNS rebinding) and read the index's passages; /health named the state folder's path."""
    from attnrank.serve.background import LOOPBACK_HOSTS

    for app in (create_app(engine, allowed_hosts=LOOPBACK_HOSTS), create_app(engine)):  # (and background_server's)
        with live_server(app) as base:
            assert httpx.get(f"{base}/health").status_code == 200
            assert httpx.get(f"{base}/health", headers={"host": "localhost:8000"}).status_code == 200
            r = httpx.get(f"{base}/health", headers={"host": "attacker.example"})
            assert r.status_code == 400 and "Invalid host header" in r.text


def test_prune_refuses_two_budgets_before_it_queues_or_searches(url):
    """/v1/ask checked the budget up front; /v1/prune searched the index in the queue first."""
    before = httpx.get(f"{url}/health").json()["queue"]
    r = httpx.post(f"{url}/v1/prune", json={"query": QUERY, "budget_tokens": 40, "keep_ratio": 0.5}, timeout=30)
    assert r.status_code == 422 and "both size the pruned context" in r.json()["message"]
    after = httpx.get(f"{url}/health").json()["queue"]
    assert after["failed"] == before["failed"] and after["done"] == before["done"]


def test_a_path_with_a_line_break_is_one_log_line(url, caplog):
    """The access log wrote the decoded path: %0A in a URL forged a second request line."""
    with caplog.at_level("INFO", logger="attnrank.serve.access"):
        httpx.get(f"{url}/nothing%0A127.0.0.1%20POST%20/v1/rerank%20200")
        time.sleep(0.1)
    lines = [r.getMessage() for r in caplog.records if r.name == "attnrank.serve.access"]
    assert len(lines) == 1 and "\n" not in lines[0] and lines[0].startswith("GET /nothing%0A127.0.0.1")


def test_search_and_ask_bodies_are_limited_to_a_query(url):
    """Their one text is the query, yet they took a body as large as a rerank's (tens of MB by
    default), buffered and parsed before any count was checked."""
    limit = 12 * 100 + 65_536  # the url fixture's max_query_chars=100
    for path in ("/v1/search", "/v1/ask"):
        body = {"query": QUERY, "padding": "y" * 100_000}
        r = httpx.post(f"{url}{path}", json=body, timeout=30)
        message = r.json()["message"]  # (it named max_body_bytes, the documents' limit, and their fix)
        assert r.status_code == 413 and f"max_query_body_bytes={limit}; send a shorter query" in message, r.text
    r = httpx.post(f"{url}/v1/search", json={"query": QUERY, "top_k": 2, "rerank": False}, timeout=30)
    assert r.status_code == 200


def test_an_unexpected_error_mid_stream_sends_no_exception_text(llm, built_retriever, caplog):
    """After the first token, an error that is not the library's went to the client as its repr
    (paths and all); every other route answers such an error with a fixed message."""

    class BrokenGenerator(Generator):
        def answer(self, question, context_docs=(), stream=None, **kw):
            stream("The ")
            raise RuntimeError("failed reading /home/someone/secret/weights.bin")

    engine = Engine(AttentionReranker(llm, max_doc_words=40), None, BrokenGenerator(llm, 8), built_retriever, "tiny")
    with caplog.at_level("ERROR", logger="attnrank.serve.streaming"), live_server(create_app(engine)) as base:
        r = httpx.post(f"{base}/v1/ask", json={"query": QUERY, "depth": 3, "top_k": 1}, timeout=60)
    assert r.status_code == 200 and "event: error" in r.text
    assert "internal error; see the server log" in r.text and "secret" not in r.text
    assert "secret/weights.bin" in caplog.text  # (the server's log keeps it)


def test_a_document_object_refused_names_its_own_fault_not_the_string_form(url):
    """A document may be a text or an object; pydantic lists the text form's error first, and every
    bad object was answered "documents.0.str: Input should be a valid string"."""
    cases = [
        ("/v1/prune", {"text": "Hello there.", "id": "a", "extra": 1}, "documents.0.extra: not a field"),
        ("/v1/prune", {"id": "a"}, "documents.0.text: Field required"),
        ("/v1/prune", {"text": "Hello there.", "id": 5}, "documents.0.id: Input should be a valid string"),
        ("/v1/rerank", {"txt": "Hello"}, "documents.0.text: Field required"),
        ("/v1/rerank", 5, "documents.0: give a string or a JSON object with the document's fields"),
        ("/v1/prune", {"text": "Hello there.", "Title": "T"}, "documents.0.Title: not a field"),
    ]
    for path, document, message in cases:
        r = httpx.post(f"{url}{path}", json={"query": QUERY, "documents": [document]})
        assert r.status_code == 422 and r.json()["message"].startswith(message), (document, r.json()["message"])
    r = httpx.post(f"{url}/v1/prune", json={"query": QUERY, "documents": ["x"], "TopK": 3})  # (a capital: a field)
    assert r.status_code == 422 and r.json()["message"].startswith("TopK: not a field"), r.json()


def test_a_document_no_prompt_holds_is_refused_with_a_fix_the_client_can_apply(llm, built_retriever):
    """A text of one long "word" (emoji, CJK) passes the reranker's word cut and the server's limits,
    and its 422 advised max_doc_words, max_doc_tokens or max_prompt_tokens: the server's settings,
    which a request cannot set (a field of that name is refused as unknown)."""
    reranker = AttentionReranker(llm, config="fused", max_doc_words=40, max_prompt_tokens=300)
    engine = Engine(reranker, ContextPruner(llm), Generator(llm, 8), built_retriever, "tiny-llama")
    limits = Limits(max_documents=6, max_document_chars=2_000, max_total_tokens=20_000)
    with live_server(create_app(engine, limits=limits)) as base:
        documents = ["\U0001f389" * 150, "Paris is the capital of France."]
        r = httpx.post(f"{base}/v1/rerank", json={"query": QUERY, "documents": documents})
        message = r.json()["message"]
        assert r.status_code == 422 and message.startswith("document #0 ('0') does not fit max_prompt_tokens=300")
        assert "send shorter documents, or cut every document with max_tokens_per_doc" in message
        assert "lower max_doc_words" not in message
        cut = httpx.post(f"{base}/v1/rerank", json={"query": QUERY, "documents": documents, "max_tokens_per_doc": 100})
        assert cut.status_code == 200 and len(cut.json()["results"]) == 2  # (the fix it names works)
        r = httpx.post(f"{base}/rerank", json={"query": QUERY, "texts": documents})  # TEI's has no such field
        assert r.status_code == 422 and "send shorter documents (the server's own cut" in r.json()["message"]
        r = httpx.post(f"{base}/v1/rerank", json={"query": QUERY, "documents": documents[:1]})  # (none fits)
        message = r.json()["message"]
        assert r.status_code == 422 and message.startswith("no document fits max_prompt_tokens=300 even alone")
        assert "with max_tokens_per_doc" in message and "lower max_doc_words" not in message
