"""Sampling a request's next token with a temperature, a nucleus (top-p) and a seed.

A build's ``sample`` is greedy (the arg max), and that is what verification, benchmarks and a
request without a temperature get. A request with ``Sampling(temperature > 0, ...)`` has its
tokens drawn here instead, from its own row of the logits the build computed, so every build
serves sampled requests the same way and no build can change what sampling means:

- the logits are divided by ``temperature`` and turned into probabilities (softmax, float32);
- with ``top_p < 1``, only the most likely tokens whose probabilities sum to ``top_p`` are kept
  (always at least the most likely one), as OpenAI and vLLM define the nucleus;
- the token is drawn by ``torch.multinomial`` with the request's own generator, seeded by
  ``seed`` (the same seed, prompt and build give the same tokens) or at random when None.

Shapes: V = vocab size. It knows nothing about HTTP or scheduling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["MAX_TEMPERATURE", "Sampler", "Sampling"]

MAX_TEMPERATURE = 2.0
"""The highest temperature accepted (OpenAI's bound)."""


@dataclass(frozen=True)
class Sampling:
    """How a request's tokens are drawn: ``temperature > 0``, ``0 < top_p <= 1``, an optional seed."""

    temperature: float
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not 0 < self.temperature <= MAX_TEMPERATURE:
            raise ValueError(f"temperature must be > 0 and <= {MAX_TEMPERATURE}, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be > 0 and <= 1, got {self.top_p}")


class Sampler:
    """Draws one request's tokens (its own generator, on the logits' device)."""

    def __init__(self, sampling: Sampling, device: torch.device | str) -> None:
        self.sampling = sampling
        self.generator = torch.Generator(device=torch.device(device))
        if sampling.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(sampling.seed)

    def draw(self, logits: torch.Tensor) -> int:
        """The next token from one row of logits [V]."""
        scores = logits.float()
        scores = (scores - scores.max()) / self.sampling.temperature  # <= 0: no overflow at any temperature
        probs = torch.softmax(scores, dim=-1)  # [V]
        if self.sampling.top_p >= 1:
            return int(torch.multinomial(probs, 1, generator=self.generator).item())
        ordered, index = probs.sort(descending=True)  # [V], [V]
        before = ordered.cumsum(dim=-1) - ordered  # the mass of the tokens more likely than each
        kept = torch.where(before < self.sampling.top_p, ordered, torch.zeros_like(ordered))
        choice = torch.multinomial(kept, 1, generator=self.generator)  # multinomial renormalises
        return int(index[choice].item())
