"""Copy-paste retrieval heads (Wu et al., ICLR 2025).

**Copy-paste retrieval score** (Wu, Wang, Xiao, Peng & Fu, "Retrieval Head Mechanistically
Explains Long-Context Factuality", arXiv 2404.15574). Needle-in-a-haystack trials over a grid of
context lengths (tokens) × needle depths (% of the haystack); the answer is decoded greedily.
Head h *copies* at decoding step t when its top-1 attended position i lies in the needle span
(the ``real_needle`` tokens) and ``prompt[i]`` equals the generated token ``y_t``; the trial
score is ``RS_h = #copy steps / |needle span|``. Only trials whose answer reaches ROUGE-1
recall > 0.5 against ``real_needle`` count, and RS_h is averaged over them (heads with
RS_h > 0.1 are retrieval heads). Implementation: the answer is generated once with plain
``model.generate``; then one teacher-forced pass over ``prompt + answer[:-1]`` reads every
head's argmax key for rows ``len(prompt) − 1 + t`` (the causal row that produced ``y_t``). The
trials' data and prompts: :mod:`attnrank.heads.niah`.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from ..config import COPY_DEPTHS, COPY_HAYSTACK, COPY_LENGTHS, COPY_MAX_NEW_TOKENS
from ..errors import InputError
from ..llm.attention import AttentionCapturer
from ..llm.decoding import greedy_config, own_settings_off
from ..llm.recording import decoder_of, forward_lock
from ..llm.rotary import rotary_switch
from ..types import is_count
from .niah import Needle, NiahPrompt, book_part, build_niah_prompt, load_haystack, load_needles, niah_folder
from .scores import HeadScores

logger = logging.getLogger(__name__)

_LENGTH_SLACK = 16  # tokens a NIAH prompt may run over its nominal length
ROUGE_ACCEPT = 0.5  # Wu et al.: ROUGE-1 recall > 50 (of 100)


def rouge1_recall(prediction: str, reference: str) -> float:
    """ROUGE-1 recall on lowercase alphanumeric words: clipped unigram overlap / |reference|.

    Wu et al. score with ``rouge_score`` and its Porter stemmer; words are not stemmed here (no
    dependency for one threshold), so an answer that inflects a needle's word ("take" for
    "taking") counts less, and a trial near the threshold may be rejected where theirs is not."""
    pred, ref = (Counter(re.findall(r"[a-z0-9]+", t.lower())) for t in (prediction, reference))
    total = sum(ref.values())
    return sum(min(c, pred[w]) for w, c in ref.items()) / total if total else 0.0


def copy_paste_counts(
    argmax: np.ndarray, answer: Sequence[int], prompt: Sequence[int], span: tuple[int, int]
) -> np.ndarray:
    """Copy events per head: ``argmax[h, t]`` = head h's top-1 key when generating ``answer[t]``;
    an event is ``span[0] <= argmax[h, t] < span[1]`` and ``prompt[argmax[h, t]] == answer[t]``."""
    argmax = np.asarray(argmax, dtype=np.int64)
    prompt_arr, answer_arr = np.asarray(prompt), np.asarray(answer)[: argmax.shape[1]]
    inside = (argmax >= span[0]) & (argmax < span[1])
    same = prompt_arr[np.clip(argmax, 0, len(prompt_arr) - 1)] == answer_arr[None, :]
    return (inside & same).sum(axis=1)


def copy_paste_score(
    argmax: np.ndarray, answer: Sequence[int], prompt: Sequence[int], span: tuple[int, int]
) -> np.ndarray:
    """Wu et al.'s per-trial retrieval score RS_h = copy events / needle span length."""
    return copy_paste_counts(argmax, answer, prompt, span) / max(1, span[1] - span[0])


def generate_answer(llm: Any, ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy answer ids, cut after EOS or after a newline once some text was produced."""
    model, tok = llm.model, llm.tokenizer
    x = torch.tensor([ids], device=llm.device)
    with forward_lock(model), torch.inference_mode(), own_settings_off(model):
        out = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            generation_config=greedy_config(  # (its end-of-sequence ids: the model's own)
                max_new_tokens, pad_token_id=tok.eos_token_id if tok.pad_token_id is None else tok.pad_token_id
            ),
        )
    answer: list[int] = []
    for t in out[0, len(ids) :].tolist():
        answer.append(t)
        text = tok.decode(answer, skip_special_tokens=True)
        if t == tok.eos_token_id or "\n" in text.lstrip():  # a newline after some text
            break
    return answer


def copy_trial(
    llm: Any, capturer: Any, prompt: NiahPrompt, needle: Needle, max_new_tokens: int
) -> tuple[np.ndarray, str, float]:
    """One NIAH trial: (RS_h over ``capturer.heads``, answer text, ROUGE-1 recall)."""
    answer = generate_answer(llm, prompt.ids, max_new_tokens)
    text = llm.tokenizer.decode(answer, skip_special_tokens=True)
    if not answer:
        return np.zeros(len(capturer.heads)), text, 0.0
    ids = prompt.ids + answer[:-1]
    argmax = (
        capturer.capture(torch.tensor([ids], device=llm.device), query_start=len(prompt.ids) - 1, reduce="argmax")
        .cpu()
        .numpy()
    )
    return (
        copy_paste_score(argmax, answer, prompt.ids, prompt.needle_span),
        text,
        rouge1_recall(text, needle.real_needle),
    )


class CopyInputs(NamedTuple):
    """What :func:`check_copy_inputs` checked: the NIAH folder, all its needles, the chosen needle
    indices, the haystack lengths (tokens), the answer's token limit and the depths (%)."""

    folder: Path
    needles: list[Needle]
    chosen: list[int]
    lengths: list[int]
    max_new_tokens: int
    depths: list[float]


def check_copy_inputs(
    data: str | Path | None,
    haystack: str,
    needles: Sequence[int] | None,
    depths: Sequence[float],
    lengths: Sequence[int] = COPY_LENGTHS,
    max_new_tokens: int = COPY_MAX_NEW_TOKENS,
) -> CopyInputs:
    """What :func:`detect_copy_heads` reads, checked before a model loads: the NIAH folder, its
    needles, the chosen needle indices, the depths, the lengths, the answer's token limit and every
    haystack the trials will read (a missing book part, or an essays folder without essays, which
    read as an empty haystack)."""
    if haystack not in ("book", "essays"):
        raise InputError(f"haystack={haystack!r} is not 'book' or 'essays'")
    depths, lengths = list(depths), list(lengths)  # (iterators: read once, then empty: no trial ran)
    folder = niah_folder(data)
    all_needles = load_needles(folder)
    chosen = list(range(len(all_needles))) if needles is None else list(needles)
    if not chosen or not depths:  # (no trial would run: an all-NaN result blaming the model)
        raise InputError(f"needles={chosen} and depths={depths} must each give at least one; e.g. depths 0,50,100")
    # (no answer: transformers' ValueError half-way through the trials)
    if not lengths or not is_count(max_new_tokens):
        raise InputError(
            f"lengths={lengths} must give at least one haystack length and max_new_tokens={max_new_tokens!r} "
            "must be an integer >= 1 (the answer's length limit); e.g. lengths 1000,2000, max_new_tokens 50"
        )
    bad = [n for n in chosen if not 0 <= n < len(all_needles)]
    if bad:
        raise InputError(
            f"needles {bad} are out of range: {folder}/retrieval_head/needles.jsonl holds "
            f"{len(all_needles)}; give indices 0..{len(all_needles) - 1}"
        )
    bad_depths = [d for d in depths if not 0 <= d <= 100]
    if bad_depths:
        raise InputError(f"depths {bad_depths} are not percentages in [0, 100]; give e.g. 0,50,100")
    if haystack == "essays" and not any((folder / "PaulGrahamEssays").glob("*.txt")):
        raise InputError(
            f"{folder / 'PaulGrahamEssays'} holds no essays (*.txt); pass a data folder that has them, "
            "or use the book haystack (haystack='book', --haystack book)"
        )
    for part in sorted({n % 3 + 1 for n in chosen}) if haystack == "book" else []:
        book_part(folder, part)
    return CopyInputs(folder, all_needles, chosen, [int(n) for n in lengths], int(max_new_tokens), depths)


def check_copy_lengths(tokenizer: Any, inputs: CopyInputs, haystack: str) -> None:
    """That each chosen needle's prompt fits the shortest and the longest of the checked lengths
    (prompt tokens, as :func:`build_niah_prompt` cuts it with ``tokenizer``): longer than the needle
    and question, and no longer than the haystack fills; checked with the tokenizer alone, where a
    length that does not fit failed a detection half-way through its trials (the lengths between
    fit when both ends do)."""
    texts: dict[int | None, str] = {}
    for n in inputs.chosen:
        part = n % 3 + 1 if haystack == "book" else None
        if part not in texts:
            texts[part] = load_haystack(inputs.folder, part)
        for length in sorted({min(inputs.lengths), max(inputs.lengths)}):
            build_niah_prompt(tokenizer, texts[part], inputs.needles[n], length, 50.0)


def detect_copy_heads(
    llm: Any,
    *,
    data: str | Path | None = None,
    lengths: Sequence[int] = COPY_LENGTHS,
    depths: Sequence[float] = COPY_DEPTHS,
    needles: Sequence[int] | None = None,
    haystack: str = COPY_HAYSTACK,
    max_new_tokens: int = COPY_MAX_NEW_TOKENS,
) -> HeadScores:
    """Wu et al.'s copy-paste retrieval score of every head over the trial grid.

    ``needles``: indices into ``needles.jsonl`` (default all 3); ``haystack``: ``"book"`` (each
    needle with its own book part, as Retrieval_Head) or ``"essays"`` (Paul Graham essays)."""
    inputs = check_copy_inputs(data, haystack, needles, depths, lengths, max_new_tokens)
    folder, all_needles, chosen, lengths, max_new_tokens, depths = inputs
    if max(lengths) + max_new_tokens > llm.context_length:  # (every trial rejected, the note blaming the model)
        raise InputError(
            f"lengths up to {max(lengths)} plus max_new_tokens={max_new_tokens} exceed the {llm.context_length}-token "
            f"context of {llm.model_id}; give lengths up to {llm.context_length - max_new_tokens}"
        )
    switch = rotary_switch(decoder_of(llm.model))
    # (a prompt is cut to about its length: the needle's joins re-tokenized move it by a few tokens)
    crossing = [n for n in lengths if switch is not None and n - _LENGTH_SLACK <= switch < n + max_new_tokens]
    if switch is not None and crossing:  # (the answer decoded past the switch, the pass reading it with one set)
        raise InputError(
            f"lengths {crossing} with max_new_tokens={max_new_tokens} cross position {switch}, where the rotary "
            f"frequencies of {llm.model_id} switch (LongRoPE or dynamic NTK): a trial's answer would be generated "
            f"with other frequencies than the pass that reads its attention; give lengths up to "
            f"{switch - max_new_tokens} or above {switch + _LENGTH_SLACK}"
        )
    check_copy_lengths(llm.tokenizer, inputs, haystack)  # (a length too short failed half-way through the trials)
    capturer = AttentionCapturer(llm.model)
    L, H = llm.num_layers, llm.num_heads
    start, total, trials = time.perf_counter(), np.zeros(L * H), []
    for n in chosen:
        text = load_haystack(folder, n % 3 + 1 if haystack == "book" else None)
        for length in lengths:
            for depth in depths:
                prompt = build_niah_prompt(llm.tokenizer, text, all_needles[n], int(length), float(depth))
                rs, answer, recall = copy_trial(llm, capturer, prompt, all_needles[n], max_new_tokens)
                accepted = recall > ROUGE_ACCEPT
                total += rs if accepted else 0.0
                trials.append(
                    {
                        "needle": n,
                        "length": len(prompt.ids),
                        "depth": depth,
                        "answer": answer,
                        "rouge1_recall": round(recall, 4),
                        "accepted": accepted,
                    }
                )
                logger.info(
                    "needle %d, %d tokens, depth %g%%: recall %.2f %s",
                    n,
                    len(prompt.ids),
                    depth,
                    recall,
                    "accepted" if accepted else "rejected",
                )
    used = sum(bool(t["accepted"]) for t in trials)
    note = (
        ""
        if used
        else (
            f"no trial was accepted: in all {len(trials)} trials the answer's ROUGE-1 "
            f"recall against real_needle was <= {ROUGE_ACCEPT} (the model did not retrieve "
            "the needle), so no copy-paste score is defined; try shorter lengths or a "
            "stronger model"
        )
    )
    scores = (total / used if used else np.full(L * H, np.nan)).reshape(L, H)
    params = {
        "lengths": list(lengths),
        "depths": list(depths),
        "needles": chosen,
        "haystack": haystack,
        "max_new_tokens": max_new_tokens,
        "rouge1_recall_accept": ROUGE_ACCEPT,
    }
    data_desc = (
        f"NIAH ({'Retrieval_Head book haystacks' if haystack == 'book' else 'Paul Graham essays'}), "
        f"needles {chosen}, {used}/{len(trials)} trials accepted"
    )
    if note:
        logger.warning(note)
    return HeadScores(
        scores,
        "copy",
        params,
        data_desc,
        time.perf_counter() - start,
        len(trials),
        used,
        note,
        llm.model_id,
        llm.fingerprint,
        trials,
        adapter=llm.adapter,
    )
