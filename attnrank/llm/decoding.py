"""Plain greedy decoding, whatever the checkpoint's own generation settings say.

``model.generate`` fills every setting left unset in the configuration it is given from the
model's ``generation_config`` (transformers 5): a checkpoint that ships a repetition penalty
(Qwen2/2.5-Instruct: 1.05-1.1) would then penalise every token already in the prompt, the
passages' included, so an answer copied out of its context (the generator's, and Wu et al.'s
copy-paste trials, :mod:`attnrank.heads.copypaste`) would be discouraged. :func:`greedy_config`
sets the logits processors that apply to greedy search to values that change nothing, and
:func:`own_settings_off` hides the rest of the checkpoint's settings (suppressed or banned tokens,
a sequence bias, a minimum length, a forced end) while a call generates: some of those cannot be
given a value that changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

# The checkpoint's generation settings a plain greedy call keeps: its special token ids.
TOKEN_IDS = ("eos_token_id", "pad_token_id", "bos_token_id", "decoder_start_token_id")

NEUTRAL = {  # the processors greedy search applies, each switched off
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "min_new_tokens": 0,  # (and so no min_length: setting both makes transformers warn at every call)
}


def greedy_config(
    max_new_tokens: int, *, eos_token_id: int | Sequence[int] | None = None, pad_token_id: int | None = None
) -> Any:
    """A ``GenerationConfig`` for greedy search (one beam, no sampling) of at most
    ``max_new_tokens`` tokens, stopping at ``eos_token_id``, with every penalty switched off."""
    from transformers import GenerationConfig

    eos = list(eos_token_id) if isinstance(eos_token_id, Sequence) else eos_token_id
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        eos_token_id=eos or None,
        pad_token_id=pad_token_id,
        **NEUTRAL,
    )


@contextmanager
def own_settings_off(model: Any) -> Iterator[None]:
    """While inside (under the model's forward lock: it swaps an attribute of the model), the
    model's ``generation_config`` holds only the checkpoint's special token ids
    (:data:`TOKEN_IDS`), so that ``model.generate`` fills nothing else from it."""
    from transformers import GenerationConfig

    kept = getattr(model, "generation_config", None)
    if kept is None:  # (nothing to fill from)
        yield
        return
    ids = {k: getattr(kept, k, None) for k in TOKEN_IDS}
    model.generation_config = GenerationConfig(**{k: v for k, v in ids.items() if v is not None})
    try:
        yield
    finally:
        model.generation_config = kept


class FirstLine:
    """A stopping criterion: stop once the text generated after ``prompt_length`` tokens holds a
    line break after some non-blank text. For a prompt without a chat template (a base model's
    ``...\\nAnswer:``), where nothing else ends the answer: the model goes on with the next
    "Question:" of an imagined exam. Decodes the new tokens at each step (an answer is short)."""

    def __init__(self, tokenizer: Any, prompt_length: int):
        self.tokenizer = tokenizer
        self.prompt_length = prompt_length

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        done = [ended_line(self.tokenizer.decode(row[self.prompt_length :].tolist())) for row in input_ids]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def ended_line(text: str) -> bool:
    """Whether ``text`` holds a line break after non-blank text."""
    return "\n" in text.lstrip()


def first_line(text: str) -> str:
    """``text``'s first non-blank line, stripped."""
    return text.strip().split("\n", 1)[0].strip()
