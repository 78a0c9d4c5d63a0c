"""How likely a causal LM finds one continuation after each of several contexts.

:func:`continuation_logprob` scores ``log p(continuation | context)`` per token, in nats, for a
batch of contexts that share the continuation (the query-likelihood reranker of
:mod:`attnrank.rerank.likelihood` asks it for the query after every passage). The contexts are
left-padded so that every sequence ends with the continuation at the same positions: the model
then computes logits for those few positions only (``logits_to_keep``), not for the whole prompt
over the vocabulary. Position ids count real tokens only, so a padded sequence is scored as the
same sequence alone. Sequences go in batches of about ``batch_tokens`` tokens (padding included),
sorted by length so that little padding is computed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from attnrank.errors import InputError

from .models import LLM
from .recording import forward_lock

DEFAULT_BATCH_TOKENS = 2048


def continuation_logprob(
    llm: LLM,
    contexts: Sequence[Sequence[int]],
    continuation: Sequence[int],
    *,
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
) -> np.ndarray:
    """Mean log-probability (nats per token) of the token ids ``continuation`` following each of
    the token-id lists ``contexts``, one value per context (input order). Each context needs at
    least one token, and context plus continuation must fit the model's context length."""
    cont = [int(t) for t in continuation]
    if not cont:
        raise InputError("the continuation is empty; give at least one token to score")
    if batch_tokens < 1:
        raise InputError(f"batch_tokens={batch_tokens} must be >= 1")
    seqs = [[int(t) for t in c] + cont for c in contexts]
    for i, s in enumerate(seqs):
        if len(s) == len(cont):
            raise InputError(f"context #{i} is empty; the first continuation token needs one token before it")
        if len(s) > llm.context_length:
            raise InputError(
                f"context #{i} with its continuation is {len(s)} tokens, over the {llm.context_length}-token "
                f"context of {llm.model_id}; shorten it (e.g. max_doc_words / max_doc_tokens)"
            )
    out = np.empty(len(seqs))
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    start = 0
    while start < len(order):  # a batch: as many of the next-shortest as fit batch_tokens
        end = start + 1
        while end < len(order) and len(seqs[order[end]]) * (end + 1 - start) <= batch_tokens:
            end += 1
        batch = order[start:end]
        out[batch] = _batch_logprob(llm, [seqs[i] for i in batch], len(cont))
        start = end
    return out


def _batch_logprob(llm: LLM, seqs: list[list[int]], n_cont: int) -> np.ndarray:
    width = max(map(len, seqs))
    pad = llm.tokenizer.pad_token_id
    pad = 0 if pad is None else int(pad)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, s in enumerate(seqs):  # left padding: every continuation ends at the last position
        ids[row, width - len(s) :] = torch.tensor(s)
        mask[row, width - len(s) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    device = llm.device
    with forward_lock(llm.model), torch.inference_mode():
        logits = llm.model(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            position_ids=positions.to(device),
            logits_to_keep=n_cont + 1,
            use_cache=False,
        ).logits
    # logits at position t predict token t + 1: the last n_cont + 1 positions' first n_cont (sliced
    # from the end, so a model that returns every position's logits is read the same)
    logp = torch.log_softmax(logits[:, -(n_cont + 1) : -1].float(), dim=-1)
    target = ids[:, -n_cont:].to(logp.device)
    return logp.gather(-1, target.unsqueeze(-1)).squeeze(-1).mean(-1).cpu().numpy().astype(np.float64)
