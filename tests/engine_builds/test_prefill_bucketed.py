"""The reference build's ``prefill = "bucketed"`` against ``prefill = "exact"`` with the same other
knobs: logits of every prefill and of the decode steps after it, and the keys and values left in
the cache, for prompts below, at and above a bucket's edge and longer than the largest bucket.

Runs on CPU, where the padded prefill runs eagerly: the same function the CUDA graph of a bucket
captures (its static inputs, the slot and the last position as device tensors, included).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine_support.builds import patched_build, sensitive_model
from polymorph.contract.builds import REFERENCE_BUILD
from polymorph_engine.runtime.checkpoint import load_model
from polymorph_engine.runtime.loader import load_hotpath
from polymorph_engine.runtime.model import LoadedModel

MAX_SEQ = 160  # buckets 16, 32, 64, 128: a prompt of 129..160 tokens runs exact
LENGTHS = [1, 15, 16, 17, 100, 140]
STATIC = {"kv_cache": "static"}
VARIANTS = [
    STATIC,
    {**STATIC, "fused_qkv": True, "fused_gate_up": True, "attention": "sdpa", "sampling": "device"},
    {**STATIC, "decode_capture": "cuda_graph"},  # none on CPU; on CUDA the layered captured step
    {**STATIC, "decode_step": "fused", "sampling": "device"},
    {**STATIC, "decode_step": "fused", "capture_buckets": "max", "attention": "sdpa"},
]
Events = list[tuple[list[int], torch.Tensor]]


def _ids(knobs: dict[str, Any]) -> str:
    return ",".join(f"{a}={b}" for a, b in knobs.items())


def _prompt(n: int, vocab: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


class Run:
    """One hot path and one cache; records (sequence so far, its next-token logits) per row."""

    def __init__(self, model: LoadedModel, knobs: dict[str, Any], build: Path = REFERENCE_BUILD) -> None:
        self.hotpath, _, _ = load_hotpath(model, build, knobs)
        self.vocab = model.config.vocab_size
        self.cache = self.hotpath.new_cache(3, MAX_SEQ)
        self.seqs: dict[int, list[int]] = {}
        self.events: Events = []

    def prefill(self, slot: int, n: int, seed: int) -> None:
        prompt = _prompt(n, self.vocab, seed)
        logits = self.hotpath.prefill(self.cache, slot, prompt)
        self.seqs[slot] = prompt.tolist()
        self.events.append((list(self.seqs[slot]), logits))
        self.seqs[slot].append(int(self.hotpath.sample(logits[None])[0]))

    def decode(self, slots: list[int], steps: int) -> None:
        for _ in range(steps):
            last = torch.tensor([self.seqs[s][-1] for s in slots])
            logits = self.hotpath.decode(self.cache, torch.tensor(slots), last)
            nxt = self.hotpath.sample(logits).tolist()
            for b, s in enumerate(slots):
                self.events.append((list(self.seqs[s]), logits[b].clone()))
                self.seqs[s].append(int(nxt[b]))

    def free(self, slot: int) -> None:
        self.hotpath.free(self.cache, slot)


def scenario(
    model: LoadedModel, knobs: dict[str, Any], build: Path = REFERENCE_BUILD
) -> tuple[Events, list[int]]:
    """Several slots prefilled in turn, between decode steps, slots freed and refilled by shorter
    prompts (stale rows of a larger bucket behind them); returns the events and the buckets used."""
    run = Run(model, knobs, build)
    run.prefill(0, 100, 1)
    run.prefill(1, 1, 2)
    run.prefill(2, 17, 3)
    run.decode([0, 1, 2], 3)
    run.free(0)
    run.prefill(0, 15, 4)  # rows 15..127 still hold the 100-token prompt's bucket
    run.decode([2, 0], 2)
    run.free(1)
    run.prefill(1, 140, 5)  # longer than the largest bucket: exact
    run.free(2)
    run.prefill(2, 16, 6)
    run.decode([0, 1, 2], 3)
    run.decode([1], 2)
    buckets = sorted(getattr(run.cache, "prefills", {}))
    run.hotpath.close()
    return run.events, buckets


def _assert_agrees(got: Events, want: Events) -> None:
    assert len(got) == len(want)
    for (seq, logits), (wseq, wlogits) in zip(got, want, strict=True):
        assert seq == wseq  # greedy tokens equal
        torch.testing.assert_close(logits, wlogits, atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return sensitive_model(seed=3)


@pytest.mark.parametrize("knobs", VARIANTS, ids=_ids)
def test_bucketed_prefill_agrees_with_exact(model: LoadedModel, knobs: dict[str, Any]) -> None:
    got, buckets = scenario(model, {**knobs, "prefill": "bucketed"})
    want, _ = scenario(model, knobs)
    assert buckets == [16, 32, 128]  # it ran bucketed (the 140-token prompt did not)
    _assert_agrees(got, want)


@pytest.mark.parametrize("shape", ["tiny", "qwen3-tiny"])
@pytest.mark.parametrize("step", ["layered", "fused"])
def test_bucketed_prefill_agrees_on_other_shapes(shape: str, step: str) -> None:
    model = load_model(shape, seed=9)  # llama with rope scaling; qwen3 with q/k norms
    knobs = {**STATIC, "decode_step": step}
    got, _ = scenario(model, {**knobs, "prefill": "bucketed"})
    _assert_agrees(got, scenario(model, knobs)[0])


@pytest.mark.parametrize("n", LENGTHS)
def test_each_length_fills_the_cache_as_exact(model: LoadedModel, n: int) -> None:
    runs = [Run(model, {**STATIC, "prefill": p}) for p in ("bucketed", "exact")]
    for run in runs:
        run.prefill(1, n, 7)  # slot 1: the slot index reaches the cache rows
        run.decode([1], 2)
    (got, exact) = runs
    _assert_agrees(got.events, exact.events)
    live = n + 2
    for layer in range(model.config.num_hidden_layers):
        for kv in ("k", "v"):
            rows, want = getattr(got.cache, kv)[layer], getattr(exact.cache, kv)[layer]
            torch.testing.assert_close(rows[1, :, :live], want[1, :, :live], atol=1e-5, rtol=1e-5)
            assert not rows[0].any() and not rows[2].any()  # no other real slot was touched
    assert got.cache.host_lengths == exact.cache.host_lengths == [0, live, 0]
    assert torch.equal(got.cache.lengths, exact.cache.lengths)
    for run in runs:
        run.hotpath.close()


@pytest.mark.parametrize("n", [0, MAX_SEQ + 1])
def test_a_prompt_that_does_not_fit_raises_as_exact(model: LoadedModel, n: int) -> None:
    errors = []
    for p in ("bucketed", "exact"):
        run = Run(model, {**STATIC, "prefill": p})
        with pytest.raises(ValueError) as info:
            run.prefill(0, n, 1)
        errors.append((type(info.value).__name__, str(info.value)))  # each load is a fresh module
        assert run.cache.host_lengths == [0, 0, 0]
        run.hotpath.close()
    assert errors[0] == errors[1]


def test_a_full_slot_is_refused_as_exact(model: LoadedModel) -> None:
    run = Run(model, {**STATIC, "prefill": "bucketed"})
    run.prefill(0, 5, 1)
    with pytest.raises(ValueError, match="slot 0 is not empty"):
        run.prefill(0, 5, 2)
    run.hotpath.close()


def test_bucketed_needs_the_static_cache(model: LoadedModel) -> None:
    hotpath, _, knobs = load_hotpath(model, REFERENCE_BUILD, {"prefill": "bucketed"})
    assert knobs["prefill"] == "bucketed" and hotpath.prefill_mode == "exact"  # concat: degrades
    hotpath.close()


def test_close_releases_the_prefills_of_live_caches(model: LoadedModel) -> None:
    run = Run(model, {**STATIC, "prefill": "bucketed"})
    run.prefill(0, 20, 1)
    run.prefill(1, 3, 2)
    assert sorted(run.cache.prefills) == [16, 32]
    run.hotpath.close()
    assert run.cache.prefills == {}


PADDED = "mask = None  # causal: the padding comes last"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("cap.last.fill_(seq - 1)", "cap.last.fill_(cap.tokens.shape[0] - 1)"),  # logits of the padding
        (
            PADDED,
            PADDED.replace("None", "torch.ones(1, 1, p, p, dtype=torch.bool, device=self.device)"),
        ),  # attends to it
    ],
    ids=["last-position", "not-causal"],
)
def test_the_comparison_catches_a_wrong_bucketed_prefill(
    tmp_path: Path, model: LoadedModel, old: str, new: str
) -> None:
    build = patched_build(tmp_path / "build", "wrong-prefill", [(old, new)])
    got, _ = scenario(model, {**STATIC, "prefill": "bucketed"}, build)
    want, _ = scenario(model, STATIC)
    with pytest.raises(AssertionError):
        _assert_agrees(got, want)
