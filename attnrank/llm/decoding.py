"""Plain greedy decoding, whatever the checkpoint's own generation settings say.

``model.generate`` fills every setting left unset in the configuration it is given from the
model's ``generation_config`` (transformers 5): a checkpoint that ships a repetition penalty
(Qwen2/2.5-Instruct: 1.05-1.1) would then penalise every token already in the prompt, the
passages' included, so an answer copied out of its context (the generator's, and Wu et al.'s
copy-paste trials, :mod:`attnrank.heads.copypaste`) would be discouraged. :func:`greedy_config`
sets the logits processors that apply to greedy search to values that change nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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
