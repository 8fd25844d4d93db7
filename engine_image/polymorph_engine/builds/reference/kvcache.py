"""KV caches of the reference build: where each slot's keys and values live between steps.

``ConcatCache`` (knob ``kv_cache = "concat"``) keeps one growing tensor per slot and layer and
concatenates every new position onto it; a decode step pads the rows of the batch to the longest
one and masks the padding. Obviously correct, allocation-heavy.

``StaticCache`` (``kv_cache = "static"``) preallocates [slots + 1, nkv, max_seq_len, D] per layer
and writes new positions in place at ``lengths[slot]``. ``lengths`` lives in a device tensor so a
captured decode step (CUDA graph, torch.compile) reads positions without a host sync. The extra
last slot is scratch: padded rows of a captured batch point at it, so they never touch a real slot.
A bucketed prefill (``store_prefill_rows``) also writes the rows of its padding, past the live
length: they stay masked until decode overwrites them.
Both caches also keep host-side lengths: the host knows every length (a prefill sets it, a decode
adds one), so capacity checks and the attended length cost no device sync.

Caches know nothing about weights or attention: they store, hand back and mask.
Shapes: B = batch rows, T = new positions, L = attended positions, D = head dim.
"""

from __future__ import annotations

import torch


class CacheFullError(ValueError):
    pass


def _check_slot(slot: int, max_batch: int) -> None:
    if not 0 <= slot < max_batch:
        raise ValueError(f"slot {slot} is out of range: this cache has slots 0..{max_batch - 1}")


class _Slots:
    """What both caches check on the host: slot bounds, emptiness and capacity."""

    max_batch: int
    max_seq_len: int
    host_lengths: list[int]

    def begin_prefill(self, slot: int, seq: int) -> None:
        _check_slot(slot, self.max_batch)
        if self.host_lengths[slot]:
            raise ValueError(f"slot {slot} is not empty; free it before prefilling it again")
        if not 0 < seq <= self.max_seq_len:
            raise CacheFullError(f"a prompt of {seq} tokens does not fit: max_seq_len is {self.max_seq_len}")

    def check_slots(self, slots: list[int]) -> None:
        """Each of ``slots`` in range, prefilled and not full: it can take one more position."""
        for s in slots:
            _check_slot(s, self.max_batch)
            if self.host_lengths[s] == 0:
                raise ValueError(f"slot {s} is empty; prefill it before decoding")
            if self.host_lengths[s] >= self.max_seq_len:
                raise CacheFullError(f"slot {s} is full: max_seq_len is {self.max_seq_len}")


class ConcatCache(_Slots):
    def __init__(self, num_layers: int, max_batch: int, max_seq_len: int, device: torch.device) -> None:
        self.num_layers, self.max_batch, self.max_seq_len, self.device = (
            num_layers,
            max_batch,
            max_seq_len,
            device,
        )
        self.k: list[list[torch.Tensor]] = [[] for _ in range(max_batch)]  # [slot][layer] -> [nkv, L, D]
        self.v: list[list[torch.Tensor]] = [[] for _ in range(max_batch)]
        self.host_lengths = [0] * max_batch

    def store_prefill(self, layer: int, slot: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [1, nkv, S, D] for a fresh slot."""
        self.k[slot].append(k[0])
        self.v[slot].append(v[0])

    def end_prefill(self, slot: int, seq: int) -> None:
        self.host_lengths[slot] = seq

    def begin_decode(self, slots: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions [B] of the new tokens and the attention mask [B, 1, 1, L]."""
        self.check_slots(slots)
        lengths = [self.host_lengths[s] for s in slots]
        positions = torch.tensor(lengths, dtype=torch.int64, device=self.device)
        attend = torch.arange(max(lengths) + 1, device=self.device)  # [L]
        mask = attend[None, :] <= positions[:, None]  # [B, L]
        return positions, mask[:, None, None, :]

    def decode_kv(
        self, layer: int, slots: list[int], k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k, v [B, nkv, 1, D]; return every row's keys and values padded: [B, nkv, L, D]."""
        for b, s in enumerate(slots):
            self.k[s][layer] = torch.cat([self.k[s][layer], k[b]], dim=1)
            self.v[s][layer] = torch.cat([self.v[s][layer], v[b]], dim=1)
        longest = max(self.k[s][layer].shape[1] for s in slots)
        keys = k.new_zeros(len(slots), k.shape[1], longest, k.shape[3])
        values = torch.zeros_like(keys)
        for b, s in enumerate(slots):
            n = self.k[s][layer].shape[1]
            keys[b, :, :n] = self.k[s][layer]
            values[b, :, :n] = self.v[s][layer]
        return keys, values

    def end_decode(self, slots: list[int]) -> None:
        for s in slots:
            self.host_lengths[s] += 1

    def free(self, slot: int) -> None:
        _check_slot(slot, self.max_batch)
        self.k[slot], self.v[slot] = [], []
        self.host_lengths[slot] = 0


class StaticCache(_Slots):
    def __init__(
        self,
        num_layers: int,
        max_batch: int,
        max_seq_len: int,
        num_kv_heads: int,
        head_dim: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.num_layers, self.max_batch, self.max_seq_len, self.device = (
            num_layers,
            max_batch,
            max_seq_len,
            device,
        )
        self.scratch = max_batch  # the padding slot of captured batches
        shape = (max_batch + 1, num_kv_heads, max_seq_len, head_dim)
        # Zeros, not empty: masked positions still meet `probs @ v`, and 0 * NaN would be NaN.
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.lengths = torch.zeros(max_batch + 1, dtype=torch.int64, device=device)  # [slots + 1]
        self.host_lengths = [0] * max_batch
        self.captured: dict[int, object] = {}  # batch bucket -> captured decode step (see hotpath)
        self.prefills: dict[int, object] = {}  # prompt-length bucket -> bucketed prefill (see hotpath)

    def store_prefill(self, layer: int, slot: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [1, nkv, S, D] for a fresh slot."""
        seq = k.shape[2]
        self.k[layer][slot, :, :seq] = k[0]
        self.v[layer][slot, :, :seq] = v[0]

    def store_prefill_rows(self, layer: int, slot: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [1, nkv, P, D] into rows [0, P) of ``slot``, a [1] device tensor: no host value, so
        a captured graph replays the write for whichever slot the tensor holds."""
        seq = k.shape[2]
        self.k[layer][:, :, :seq].index_copy_(0, slot, k)
        self.v[layer][:, :, :seq].index_copy_(0, slot, v)

    def end_prefill(self, slot: int, seq: int) -> None:
        self.lengths[slot] = seq  # a device fill, no host sync
        self.host_lengths[slot] = seq

    def check_decode(self, slots: list[int]) -> int:
        """Validate ``slots``; returns the attended length L (longest row after this step)."""
        self.check_slots(slots)
        return max(self.host_lengths[s] for s in slots) + 1

    @staticmethod
    def decode_mask(positions: torch.Tensor, attended: int) -> torch.Tensor:
        """positions [B] -> mask [B, 1, 1, L] where L = ``attended``."""
        attend = torch.arange(attended, device=positions.device)
        return (attend[None, :] <= positions[:, None])[:, None, None, :]

    def decode_kv(
        self,
        layer: int,
        slots: torch.Tensor,
        positions: torch.Tensor,
        attended: int,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v [B, nkv, 1, D] at (slots, positions) in place; return [B, nkv, L, D]."""
        kc, vc = self.k[layer], self.v[layer]
        kc[slots, :, positions] = k[:, :, 0]  # advanced indices first: [B, nkv, D]
        vc[slots, :, positions] = v[:, :, 0]
        return kc[slots, :, :attended], vc[slots, :, :attended]

    def end_decode(self, slots: list[int], slots_dev: torch.Tensor) -> None:
        self.lengths.index_add_(0, slots_dev, torch.ones_like(slots_dev))
        for s in slots:
            self.host_lengths[s] += 1

    def advance_host(self, slots: list[int]) -> None:
        """Host lengths only, after a step that advanced ``lengths`` on the device itself."""
        for s in slots:
            self.host_lengths[s] += 1

    def free(self, slot: int) -> None:
        _check_slot(slot, self.max_batch)
        self.lengths[slot] = 0
        self.host_lengths[slot] = 0
