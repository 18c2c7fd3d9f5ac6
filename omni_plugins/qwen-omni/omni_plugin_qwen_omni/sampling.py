"""Choosing the next token the way transformers' ``generate`` does, one step at a time.

The stages run their own decoding loops (a thinker that streams each token with the hidden
states its talker needs, a talker that consumes them as they arrive), so they cannot call
``generate``; they use its own logits processors, in the order ``generate`` applies them:
repetition penalty, suppressed tokens, then (sampling only) temperature, top-k, top-p.
Greedy decoding is ``argmax``, sampling one ``multinomial`` draw, as in ``generate``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


class Sampler:
    """The next-token rule of one request. ``temperature`` 0 or None is greedy; ``seed`` makes
    sampling reproducible (a generator of its own: the process's RNG is left alone)."""

    def __init__(
        self,
        *,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        suppress: Sequence[int] = (),
        seed: int | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        from transformers import (
            LogitsProcessorList,
            RepetitionPenaltyLogitsProcessor,
            SuppressTokensLogitsProcessor,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        self.greedy = not temperature
        processors: list[Any] = []
        if repetition_penalty is not None and repetition_penalty != 1.0:
            processors.append(RepetitionPenaltyLogitsProcessor(repetition_penalty))
        if suppress:
            processors.append(SuppressTokensLogitsProcessor(list(suppress), device=device))
        if not self.greedy:
            if temperature != 1.0:
                processors.append(TemperatureLogitsWarper(float(temperature)))  # type: ignore[arg-type]
            if top_k:
                processors.append(TopKLogitsWarper(top_k=int(top_k)))
            if top_p is not None and top_p < 1.0:
                processors.append(TopPLogitsWarper(top_p=float(top_p)))
        self.processors = LogitsProcessorList(processors)
        self.generator: torch.Generator | None = None
        if not self.greedy:
            self.generator = torch.Generator(device=device)
            if seed is not None:
                self.generator.manual_seed(int(seed))
            else:
                self.generator.seed()

    def __call__(self, sequence: torch.Tensor, logits: torch.Tensor) -> int:
        """The next token after ``sequence`` (1 x n ids so far, prompt included), from the last
        position's ``logits`` (1 x vocab)."""
        scores = self.processors(sequence, logits.to(dtype=torch.float32, copy=True))
        if self.greedy:
            return int(torch.argmax(scores, dim=-1)[0])
        probs = torch.softmax(scores, dim=-1)
        return int(torch.multinomial(probs, num_samples=1, generator=self.generator)[0, 0])
