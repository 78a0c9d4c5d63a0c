"""Copy-paste retrieval heads on tiny random models: the copy-paste rule (Wu et al.), ROUGE-1
recall, the argmax capture against eager attention, and the copy detector end to end."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import torch
from _tiny import tiny_model

from attnrank.errors import InputError
from attnrank.heads import copypaste
from attnrank.heads.copypaste import (
    copy_paste_counts,
    copy_paste_score,
    detect_copy_heads,
    rouge1_recall,
)
from attnrank.heads.niah import Needle, build_niah_prompt, load_haystack, load_needles
from attnrank.llm.attention import AttentionCapturer


@pytest.fixture(scope="module")
def eager(llm):
    """The same weights with eager attention (output_attentions=True): the reference."""
    model = tiny_model("llama", layers=4, heads=4, kv_heads=2, max_positions=16384)
    model.config._attn_implementation = "eager"
    model.load_state_dict(llm.model.state_dict())
    return model


def test_copy_paste_rule_on_a_hand_made_argmax():
    prompt = [5, 6, 7, 8, 9, 10, 11, 12]  # needle span = positions 2..5 (tokens 7, 8, 9, 10)
    answer = [7, 8, 9, 99]
    argmax = np.array(
        [
            [2, 3, 4, 0],  # copies 7, 8, 9 from the needle: 3 events
            [2, 2, 4, 5],  # 7 yes, 8 no (points at 7), 9 yes, 99 no: 2 events
            [0, 1, 6, 7],  # never inside the span
            [3, 3, 3, 3],  # inside, token 8 matches only at t=1: 1 event
        ]
    )
    np.testing.assert_array_equal(copy_paste_counts(argmax, answer, prompt, (2, 6)), [3, 2, 0, 1])
    np.testing.assert_allclose(copy_paste_score(argmax, answer, prompt, (2, 6)), [0.75, 0.5, 0.0, 0.25])


def test_rouge1_recall():
    ref = "take a walk in Chaoyang Park"
    assert rouge1_recall("Take a WALK in Chaoyang park!", ref) == 1.0
    assert rouge1_recall("a walk", ref) == pytest.approx(2 / 6)
    assert rouge1_recall("", ref) == 0.0 and rouge1_recall("anything", "") == 0.0
    assert rouge1_recall("a a a", "a b") == 0.5  # clipped counts


def test_argmax_capture_equals_eager_argmax(llm, eager):
    ids = torch.randint(0, 250, (1, 40), generator=torch.Generator().manual_seed(3))
    heads = [(0, 1), (1, 3), (2, 0), (2, 2)]
    capturer = AttentionCapturer(llm.model, heads)
    top = capturer.capture(ids, query_start=25, reduce="argmax")
    assert top.dtype == torch.int64 and top.shape == (4, 15)
    with torch.no_grad():
        att = eager(input_ids=ids, output_attentions=True).attentions
    expected = torch.stack([att[l][0, h, 25:].argmax(-1) for l, h in heads])
    torch.testing.assert_close(top, expected)
    # with a prefilled prefix the indices are absolute positions
    prefix = capturer.prefill(ids[:, :30])
    torch.testing.assert_close(capturer.capture(ids[:, 30:], prefix=prefix, reduce="argmax"), expected[:, 5:])
    with pytest.raises(InputError, match="reduce='max'"):
        capturer.capture(ids, reduce="max")


# --------------------------------------------------------------------------- NIAH data
@pytest.fixture(scope="module")
def niah(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    folder = root / "niah" / "retrieval_head"
    folder.mkdir(parents=True)
    needles = [
        {
            "needle": "The best thing to do in Beijing is to take a walk in Chaoyang Park.",
            "question": "What is the best thing to do in Beijing?",
            "real_needle": "take a walk in Chaoyang Park",
        },
        {
            "needle": "Mr Green is disliked because he is mean.",
            "question": "Why is Mr Green disliked?",
            "real_needle": "Because he is mean.",
        },
    ]
    (folder / "needles.jsonl").write_text("\n".join(json.dumps(n) for n in needles) + "\n")
    sentences = " ".join(f"Sentence number {i} of the book is here." for i in range(80))
    for part in (1, 2, 3):
        dump = json.dumps(
            {"rows": [{"row_idx": 0, "row": {"text": f'Chapter {part}: "Hi"\n{sentences}', "prompt": "p"}}]},
            separators=(",", ":"),
        )
        dump += ',{"row_idx":1,"row":{"text":"truncated mid-str'  # as the shared dumps end
        with gzip.open(folder / f"haystack_part{part}_p1.txt.gz", "wt", encoding="utf-8") as f:
            f.write(dump)
    (root / "niah" / "PaulGrahamEssays").mkdir()
    (root / "niah" / "PaulGrahamEssays" / "a.txt").write_text(sentences)
    return root


def test_haystack_reads_the_truncated_dump(niah):
    text = load_haystack(niah / "niah", 2)
    assert text.startswith('Chapter 2: "Hi"\nSentence number 0') and "truncated" not in text
    assert load_haystack(niah / "niah", None).startswith("Sentence number 0")


@pytest.mark.parametrize("depth", [0, 50, 100])
def test_needle_prompt(llm, niah, depth):
    text = load_haystack(niah / "niah", 1)
    needle = Needle("Mr Green is disliked because he is mean.", "Why?", "Because he is mean.")
    p = build_niah_prompt(llm.tokenizer, text, needle, 300, depth)
    assert abs(len(p.ids) - 300) <= 3
    s, e = p.needle_span
    assert llm.tokenizer.decode(p.ids[s:e]) == "because he is mean."  # case-insensitive match
    body = p.text.split("<|im_start|>user\n")[1]
    if depth == 0:
        assert body.startswith(needle.needle)
    elif depth == 100:
        assert needle.needle + "\nBased on the content of the book" in body
    else:
        assert ". " + needle.needle in body  # at a sentence boundary
    with pytest.raises(InputError, match="context length 20 does not fit"):
        build_niah_prompt(llm.tokenizer, text, needle, 20, 50)
    # the limit named counts the whole haystack, not the slice tokenized for the cut (about 1,000
    # characters where the needle leaves no room)
    n = len(llm.tokenizer(text, add_special_tokens=False)["input_ids"])
    assert len(llm.tokenizer(text[:1016], add_special_tokens=False)["input_ids"]) < n
    for length in (20, n + 1000):
        with pytest.raises(InputError, match=f"the haystack has {n};"):
            build_niah_prompt(llm.tokenizer, text, needle, length, 50)


def test_copy_detector_without_accepted_trials(llm, niah):
    res = detect_copy_heads(llm, data=niah, lengths=[200], depths=[0, 100], needles=[0], max_new_tokens=4)
    assert res.n_total == 2 and res.n_used == 0 and res.scores.shape == (4, 4)
    assert np.isnan(res.scores).all() and res.top() == [] and res.above() == []
    assert "no trial was accepted" in res.note and "2 trials" in res.note
    with pytest.raises(InputError, match="no copy heads to save"):
        res.save(root=niah / "reg")


def test_copy_detector_with_an_accepted_trial(llm, eager, niah, monkeypatch):
    """Force the answer to be the needle itself; the scores must equal the copy-paste rule on
    the eager model's argmax over the teacher-forced prompt + answer."""
    seen = {}

    def fake_answer(_llm, ids, _n):
        s, e = seen["span"]
        return list(ids[s:e])

    real_build = copypaste.build_niah_prompt

    def build(*a, **kw):
        p = real_build(*a, **kw)
        seen.update(span=p.needle_span, ids=p.ids)
        return p

    monkeypatch.setattr(copypaste, "generate_answer", fake_answer)
    monkeypatch.setattr(copypaste, "build_niah_prompt", build)
    res = detect_copy_heads(llm, data=niah, lengths=[200], depths=[50], needles=[0], max_new_tokens=4)
    assert res.n_used == 1 and res.trials[0]["accepted"] and res.note == ""
    s, e = seen["span"]
    ids = seen["ids"] + seen["ids"][s : e - 1]
    with torch.no_grad():
        att = eager(input_ids=torch.tensor([ids]), output_attentions=True).attentions
    q0 = len(seen["ids"]) - 1
    argmax = np.stack([att[l][0, h, q0:].argmax(-1).numpy() for l in range(4) for h in range(4)])
    expected = copy_paste_score(argmax, seen["ids"][s:e], seen["ids"], (s, e)).reshape(4, 4)
    np.testing.assert_allclose(res.scores, expected)
    assert np.isfinite(res.scores).all() and len(res.top(5)) == 5


# --------------------------------------------------------------------------- answers and bad inputs
class _FixedGenerate:
    """A model whose greedy continuation is fixed (generate_answer's cut is under test)."""

    def __init__(self, continuation):
        self.continuation = continuation

    def generate(self, x, **_):
        return torch.tensor([x[0].tolist() + self.continuation])


@pytest.mark.parametrize(
    "generated, kept",
    [
        ("\nThe best thing\nmore", "\nThe best thing\n"),  # a leading newline is not the end of the answer
        (" \n\nBecause he is mean.\n\nQuestion", " \n\nBecause he is mean.\n"),
        ("Chaoyang Park\nmore", "Chaoyang Park\n"),
    ],
)
def test_answer_is_cut_at_the_first_newline_after_some_text(llm, generated, kept):
    from types import SimpleNamespace

    tok = llm.tokenizer
    stub = SimpleNamespace(
        model=_FixedGenerate(tok(generated, add_special_tokens=False)["input_ids"]), tokenizer=tok, device="cpu"
    )
    assert tok.decode(copypaste.generate_answer(stub, [1, 2, 3], 50)) == kept


def test_bad_needles_and_depths_are_input_errors(llm, niah):
    text = load_haystack(niah / "niah", 1)
    needle = Needle("Mr Green is disliked because he is mean.", "Why?", "Because he is mean.")
    for depth in (-25, 150, float("nan")):
        with pytest.raises(InputError, match=r"not a percentage in \[0, 100\]"):
            build_niah_prompt(llm.tokenizer, text, needle, 300, depth)
    with pytest.raises(InputError, match=r"needles \[-1, 2\] are out of range.*holds 2"):
        detect_copy_heads(llm, data=niah, lengths=[200], depths=[0], needles=[0, -1, 2])
    with pytest.raises(InputError, match=r"depths \[-10\]"):
        detect_copy_heads(llm, data=niah, lengths=[200], depths=[0, -10], needles=[0])
    # no trial, or no answer: an all-NaN result that blamed the model, or transformers' ValueError
    for kw, said in (
        (dict(needles=[]), r"needles=\[\] and depths=\[0\] must each give at least one"),
        (dict(depths=[]), r"depths=\[\] must each give at least one"),
        (dict(lengths=[]), r"lengths=\[\] must give at least one"),
        (dict(max_new_tokens=0), "max_new_tokens=0 must be an integer >= 1"),
    ):
        with pytest.raises(InputError, match=said):
            detect_copy_heads(llm, data=niah, **{"lengths": [200], "depths": [0], "needles": [0], **kw})
    with pytest.raises(InputError, match=r"lengths=\[\] must give at least one"):  # was: min() of an empty sequence
        copypaste.check_copy_inputs(niah, "book", [0], [0], [])
    # iterators were read once by the check, and no trial ran (all-NaN scores, a warning)
    assert copypaste.check_copy_inputs(niah, "book", [0], iter([0, 50]), iter([200, 300])).lengths == [200, 300]
    with pytest.raises(InputError, match=r"exceed the \d+-token context"):  # every trial rejected, blaming the model
        detect_copy_heads(llm, data=niah, lengths=[llm.context_length], depths=[0], needles=[0])


def test_lengths_whose_trials_cross_a_rotary_switch_are_refused(niah):
    """A LongRoPE model's prompt prefilled below its switch and its answer decoded past it read
    other frequencies than the teacher-forced pass over both, whose attention scores the trial."""
    from _tiny import tiny_longrope_model, tiny_tokenizer

    from attnrank.llm.models import LLM

    llm = LLM(tiny_longrope_model(max_positions=2000, switch=300), tiny_tokenizer(), "tiny-phi3", "p" * 64)
    with pytest.raises(InputError, match=r"lengths \[290\] with max_new_tokens=20 cross position 300"):
        detect_copy_heads(llm, data=niah, lengths=[200, 290, 400], depths=[0], needles=[0], max_new_tokens=20)


def test_unreadable_niah_files_are_input_errors(tmp_path):
    folder = tmp_path / "retrieval_head"
    folder.mkdir()
    (folder / "needles.jsonl").write_text('{"needle": "a", "question": "b", "real_needle": "a"}\n{"needle": "x"\n')
    with pytest.raises(InputError, match=r"needles.jsonl line 2 is not a needle"):
        load_needles(tmp_path)
    with pytest.raises(InputError, match=r"haystack_part1_p1.txt.gz does not exist.*essays"):
        load_haystack(tmp_path, 1)


def test_top_needs_a_positive_count():
    from attnrank.heads.scores import HeadScores

    res = HeadScores(np.arange(4.0).reshape(2, 2), "copy")
    assert res.top(3) == [(1, 1), (1, 0), (0, 1)]
    for n in (0, -1):  # -1 once kept all heads but the last
        with pytest.raises(InputError, match=f"n={n} heads"):
            res.top(n)


def test_a_copy_set_holds_only_heads_that_copied():
    """heads detect --method copy --top 32 saved heads at 0 (they never copied), chosen by head
    order among the tied: SmolLM2's shipped matrix has 102 heads above 0 and 168 at 0."""
    from attnrank.heads.scores import HeadScores

    res = HeadScores(np.array([[0.0, 0.3], [0.05, 0.0]]), "copy")
    assert res.top(3) == [(0, 1), (1, 0), (0, 0)]  # the third never copied
    assert res.top_positive(3) == [(0, 1), (1, 0)] and res.top_positive(1) == [(0, 1)]
    for n in (0, -1, 2.5):  # (-1 returned every head above 0 but the weakest)
        with pytest.raises(InputError, match=f"n={n!r} heads"):
            res.top_positive(n)


def test_copy_trials_decode_greedily_whatever_the_checkpoint_sets(llm):
    """model.generate filled unset settings from the model's generation_config: a checkpoint's
    repetition penalty (Qwen2.5-Instruct ships 1.05) penalised copying the needle out of the prompt."""
    from _tiny import tiny_model

    from attnrank.llm.models import LLM

    model = tiny_model("llama", layers=2)
    own = LLM(model=model, tokenizer=llm.tokenizer, model_id="t", fingerprint="a" * 64)
    ids = list(range(40, 80))
    plain = copypaste.generate_answer(own, ids, 8)
    model.generation_config.repetition_penalty = 50.0
    model.generation_config.no_repeat_ngram_size = 1
    assert copypaste.generate_answer(own, ids, 8) == plain
