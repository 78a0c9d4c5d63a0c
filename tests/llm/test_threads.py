"""One model, several threads: captures and generation from different threads give each what it
would get alone (a capture switches the model's attention implementation and hooks its deepest
layer for one pass; another thread's pass used to run through both)."""

from __future__ import annotations

import threading

import numpy as np

from attnrank.generate import Generator
from attnrank.llm.recording import forward_lock
from attnrank.rerank.attention import AttentionReranker
from attnrank.types import Document

DOCS = [
    Document("p", "Paris is the capital and largest city of France.", "Paris"),
    Document("b", "Berlin is the capital of Germany.", "Berlin"),
    Document("r", "Rome is the capital of Italy.", "Rome"),
]
QUESTION = "What is the capital of France?"


def test_captures_and_generation_on_one_model_from_many_threads(llm):
    reranker = AttentionReranker(llm, heads=[(1, 0), (2, 1)])
    generator = Generator(llm, max_new_tokens=4)
    before = llm.model.config._attn_implementation
    alone = reranker.rank(QUESTION, DOCS).scores
    answer = generator.answer(QUESTION, DOCS).text
    errors: list[BaseException] = []
    ranks: list[list[float]] = []
    answers: list[str] = []
    start = threading.Barrier(4)

    def work(job):
        try:
            start.wait()
            for _ in range(6):
                job()
        except BaseException as e:  # reported by the assertion below
            errors.append(e)

    jobs = [
        lambda: ranks.append(reranker.rank(QUESTION, DOCS).scores),
        lambda: ranks.append(reranker.rank(QUESTION, DOCS).scores),
        lambda: answers.append(generator.answer(QUESTION, DOCS).text),
        lambda: answers.append(generator.answer(QUESTION, DOCS).text),
    ]
    threads = [threading.Thread(target=work, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:2]
    assert len(ranks) == 12 and all(np.allclose(r, alone, atol=1e-6) for r in ranks)
    assert answers == [answer] * 12
    assert llm.model.config._attn_implementation == before  # each pass restored what it switched


def test_a_model_and_its_decoder_share_one_reentrant_lock(llm):
    lock = forward_lock(llm.model)
    assert forward_lock(llm.model.get_decoder()) is lock
    with lock, forward_lock(llm.model):  # reentrant: an adapter's lock around a capture's own
        pass
