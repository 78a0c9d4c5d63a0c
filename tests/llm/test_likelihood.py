"""continuation_logprob: batched, left-padded log-likelihoods equal each sequence scored alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tiny import tiny_model, tiny_tokenizer

from attnrank.errors import InputError
from attnrank.llm.likelihood import continuation_logprob
from attnrank.llm.models import LLM

CONTEXTS = ["Passage: the cat sat on the mat.\nQuestion:", "Passage: x\nQuestion:", "A longer passage " * 6]
QUERY = " where did the cat sit?"


def _reference(llm: LLM, context: list[int], cont: list[int]) -> float:
    """The mean log-probability of ``cont`` after ``context``, one unpadded sequence, every logit."""
    ids = torch.tensor([context + cont])
    with torch.inference_mode():
        logp = torch.log_softmax(llm.model(input_ids=ids).logits[0].float(), -1)
    n = len(context)
    return float(np.mean([logp[n + i - 1, t].item() for i, t in enumerate(cont)]))


# Phi-3's config defaults its special token ids to ones past the tiny vocabulary
FAMILIES = {"llama": {}, "qwen2": {}, "mistral": {}, "gemma": {}, "Phi3": {"pad_token_id": 0, "eos_token_id": 1}}


@pytest.mark.parametrize("family", [*FAMILIES, "Gemma3Text"])
def test_batched_scores_equal_each_sequence_scored_alone(family):
    tok = tiny_tokenizer()
    model = tiny_model(family, layers=2, max_positions=512, **FAMILIES.get(family, {}))
    llm = LLM(model=model, tokenizer=tok, model_id=f"tiny-{family}", fingerprint="t")
    contexts = [tok(c, add_special_tokens=False)["input_ids"] for c in CONTEXTS]
    cont = tok(QUERY, add_special_tokens=False)["input_ids"]
    want = [_reference(llm, c, cont) for c in contexts]
    got = continuation_logprob(llm, contexts, cont)  # one left-padded batch
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    one_each = continuation_logprob(llm, contexts, cont, batch_tokens=1)  # every sequence alone
    np.testing.assert_allclose(one_each, want, rtol=0, atol=1e-5)
    assert len(set(np.round(got, 6))) == len(got)  # the contexts do change the score


def test_bad_inputs_are_refused_naming_the_limit(llm):
    with pytest.raises(InputError, match="continuation is empty"):
        continuation_logprob(llm, [[1, 2]], [])
    with pytest.raises(InputError, match="context #1 is empty"):
        continuation_logprob(llm, [[1, 2], []], [3])
    with pytest.raises(InputError, match="over the 16384-token context"):
        continuation_logprob(llm, [[1] * 16384], [3])
    with pytest.raises(InputError, match="batch_tokens=0"):
        continuation_logprob(llm, [[1]], [3], batch_tokens=0)
