"""The contract between the engine and a build: what ``load(model, knobs)`` must return.

A build's entry module defines ``load(model: LoadedModel, knobs: dict[str, object]) -> HotPath``.
The engine knows nothing about how a hot path computes; it only calls these methods.
Builds keep no module-level mutable state: everything lives on the HotPath object, so
releasing it (``close()``) releases every derived tensor, graph and cache.

A hot path may also name the knobs that change nothing for its model, whatever the other
knobs' values, as ``inert_knobs`` (a sequence of knob names; the reference's MoE knobs on a
dense model). The engine records them (``ExperimentRecord.inertKnobs``) and the search holds
them at their defaults, so a dense model's kept build names no MoE setting it never ran.

Shapes: S = prompt length, B = number of slots in one decode step, V = vocab size.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch


class HotPath(Protocol):
    def new_cache(self, max_batch: int, max_seq_len: int) -> Any:
        """A KV cache with ``max_batch`` slots, each able to hold ``max_seq_len`` tokens."""
        ...

    def prefill(self, cache: Any, slot: int, tokens: torch.Tensor) -> torch.Tensor:
        """Run the prompt ``tokens`` [S] (int64, CPU or device) into ``slot`` (which must be empty).

        Returns the logits of the last position: [V] (float32 in the reference build).
        """
        ...

    def decode(self, cache: Any, slots: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """One decode step for ``slots`` [B] (int64) given their last tokens [B] (int64).

        Appends one position to each slot and returns logits [B, V]. Pass ``slots`` on the CPU:
        the hot path reads them on the host (bounds, lengths) without a device sync; ``tokens``
        may stay on the device, as ``sample`` returns them. Slots in one call are distinct.
        """
        ...

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        """Greedy next tokens [B] (int64, on the model's device) from logits [B, V]."""
        ...

    def free(self, cache: Any, slot: int) -> None:
        """Empty ``slot`` so a new request can be prefilled into it."""
        ...

    def close(self) -> None:
        """Release everything this hot path derived from the model (tensors, graphs, caches)."""
        ...
