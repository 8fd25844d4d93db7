"""Verification: compare a candidate hot path with the reference build's golden outputs.

Owns: the fixed verification prompts, computing golden outputs from the reference build,
and judging a candidate against them with ``polymorph.contract.api.Gates``.

Protocol (identical for golden and candidate, so differences come from the build alone):
all P prompts are prefilled into slots 0..P-1 of one cache, then K-1 batched decode steps
run over all slots, every prompt in every step (the hot-path contract prefills one slot at a
time; decode is one batched call). Logits and tokens stay on the device until the end, so the
steps run back to back with no host sync between them, and come back in one transfer. The candidate is *teacher-forced*: each decode step is fed the golden
token of the previous step, not its own, so one early mismatch cannot cascade. At every
step the candidate's ``sample(logits)`` is compared with the golden token.

Measures (see ``Verification``):
- ``tokenAgreement``: the fraction of the P*K steps where the candidate's sampled token
  equals the golden token.
- ``logitError``: for each prompt p and step k, ``max_v |l[p,k,v] - ref[p,k,v]| /
  max_v |ref[p,k,v]|``; the maximum over all (p, k). Computed in float32 over finite
  entries only; non-finite logits are reported through ``finite``.
- ``finite``: every candidate logit is finite. A NaN or inf never passes.
``passed`` = finite and tokenAgreement >= gates.tokenAgreement and logitError <=
gates.logitTolerance. A build with NaN output is therefore ``rejected`` (not ``failed``).

It knows nothing about builds on disk beyond asking ``runtime.loader`` for the reference, and
nothing about benchmarks or processes.
Shapes: P = prompts, K = steps, V = vocab size.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from polymorph.contract.api import Gates, Verification
from polymorph.contract.builds import REFERENCE_BUILD
from polymorph_engine.runtime.hotpath import HotPath
from polymorph_engine.runtime.loader import load_hotpath
from polymorph_engine.runtime.model import LoadedModel

__all__ = ["Golden", "default_prompts", "golden", "verify"]


@dataclass(frozen=True)
class Golden:
    """The reference build's greedy continuation of fixed prompts, with its logits."""

    prompts: tuple[tuple[int, ...], ...]
    tokens: torch.Tensor  # [P, K] int64, on CPU
    logits: torch.Tensor  # [P, K, V] float32, on CPU

    @property
    def steps(self) -> int:
        return int(self.tokens.shape[1])

    def save(self, path: str | Path) -> None:
        """Write to ``path`` (a torch file) so another process can verify without the reference."""
        torch.save(
            {"prompts": [list(p) for p in self.prompts], "tokens": self.tokens, "logits": self.logits}, path
        )

    @classmethod
    def load(cls, path: str | Path) -> Golden:
        data = torch.load(path, map_location="cpu", weights_only=True)
        return cls(tuple(tuple(p) for p in data["prompts"]), data["tokens"], data["logits"])


def default_prompts(vocab_size: int, n: int = 4, seed: int = 1234) -> list[list[int]]:
    """``n`` fixed prompts of varied lengths (5 to 20 tokens) of random token ids."""
    rng = random.Random(seed)
    lengths = [5, 12, 20, 8, 16, 3, 10, 14]
    return [[rng.randrange(vocab_size) for _ in range(lengths[i % len(lengths)])] for i in range(n)]


def _run(
    hotpath: HotPath,
    prompts: Sequence[Sequence[int]],
    steps: int,
    device: torch.device,
    forced: torch.Tensor | None,
    vocab_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled tokens [P, K] and logits [P, K, V] (both on CPU); feeds ``forced`` [P, K] if given."""
    n = len(prompts)
    cache: Any = hotpath.new_cache(n, max(len(p) for p in prompts) + steps)
    all_logits: list[torch.Tensor] = []
    all_tokens: list[torch.Tensor] = []

    def record(logits: torch.Tensor, k: int) -> torch.Tensor:
        if tuple(logits.shape) != (n, vocab_size):
            raise ValueError(
                f"the build returned logits of shape {tuple(logits.shape)} at step {k}, expected {(n, vocab_size)}"
            )
        sampled = hotpath.sample(logits)  # [P]
        if tuple(sampled.shape) != (n,):
            raise ValueError(
                f"the build sampled tokens of shape {tuple(sampled.shape)} at step {k}, expected {(n,)}"
            )
        # Kept on the device: one transfer at the end instead of two syncs per step.
        all_logits.append(logits.float())
        all_tokens.append(sampled)
        return sampled

    try:
        first = [
            hotpath.prefill(cache, i, torch.tensor(p, dtype=torch.int64, device=device))
            for i, p in enumerate(prompts)
        ]
        sampled = record(torch.stack(first), 0)  # [P, V]
        slots = torch.arange(n, dtype=torch.int64)  # [P], on the CPU as the contract asks
        feeds = forced.to(device) if forced is not None else None  # [P, K]
        for k in range(1, steps):
            feed = feeds[:, k - 1] if feeds is not None else sampled
            sampled = record(hotpath.decode(cache, slots, feed), k)
    except BaseException:
        with contextlib.suppress(Exception):  # the build's first error is the story, not a later one
            for i in range(n):
                hotpath.free(cache, i)
        raise
    for i in range(n):
        hotpath.free(cache, i)
    return torch.stack(all_tokens, dim=1).to(torch.int64).cpu(), torch.stack(all_logits, dim=1).cpu()


def golden(model: LoadedModel, prompts: list[list[int]], steps: int) -> Golden:
    """Golden outputs: the reference build's greedy tokens and logits for ``steps`` steps per prompt.

    Loads the reference build on ``model`` for the duration of the call and closes it after.
    """
    if not prompts or steps < 1:
        raise ValueError("golden needs at least one prompt and one step")
    hotpath, _, _ = load_hotpath(model, REFERENCE_BUILD)
    try:
        tokens, logits = _run(
            hotpath, prompts, steps, torch.device(model.device), None, model.config.vocab_size
        )
    finally:
        hotpath.close()
    if not bool(torch.isfinite(logits).all()):
        raise RuntimeError(
            "the reference build produced non-finite logits on this model; check the weights and dtype"
        )
    return Golden(tuple(tuple(p) for p in prompts), tokens, logits)


def verify(
    hotpath: HotPath, golden: Golden, gates: Gates, device: torch.device | str = "cpu"
) -> Verification:
    """Judge ``hotpath`` against ``golden`` (see the module docstring for the measures)."""
    vocab_size = int(golden.logits.shape[-1])
    tokens, logits = _run(
        hotpath, golden.prompts, golden.steps, torch.device(device), golden.tokens, vocab_size
    )
    finite_mask = torch.isfinite(logits)
    finite = bool(finite_mask.all())
    agreement = float((tokens == golden.tokens).float().mean())
    diff = torch.where(finite_mask, (logits - golden.logits).abs(), torch.zeros_like(logits))
    scale = golden.logits.abs().amax(dim=-1).clamp_min(1e-6)  # [P, K]
    error = float((diff.amax(dim=-1) / scale).max())
    passed = finite and agreement >= gates.tokenAgreement and error <= gates.logitTolerance
    return Verification(tokenAgreement=agreement, logitError=error, finite=finite, passed=passed)
