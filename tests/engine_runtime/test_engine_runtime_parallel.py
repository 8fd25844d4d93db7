"""Tensor parallelism on a CPU (runtime/parallel.py): two gloo ranks give the greedy tokens of
one process, a failure every rank shares leaves the group usable, and a rank that raises, exits
or hangs on its own is a ``RankFailed`` naming it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from engine_support.builds import wrapping_build
from polymorph.contract.builds import REFERENCE_BUILD
from polymorph.contract.errors import UsageError
from polymorph_engine.runtime.checkpoint import load_model
from polymorph_engine.runtime.config import SHAPES
from polymorph_engine.runtime.hotpath import HotPath
from polymorph_engine.runtime.hotreload import Engine
from polymorph_engine.runtime.loader import load_hotpath
from polymorph_engine.runtime.model import LoadedModel
from polymorph_engine.runtime.parallel import RankFailed, launch, shard_weights

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7]]


def greedy(hotpath: HotPath, steps: int = 8) -> list[list[int]]:
    """Both prompts prefilled, then decoded together ``steps`` times; greedy tokens per prompt."""
    cache = hotpath.new_cache(2, 64)
    tokens = []
    for slot, prompt in enumerate(PROMPTS):
        tokens.append([int(hotpath.sample(hotpath.prefill(cache, slot, torch.tensor(prompt))[None])[0])])
    slots = torch.tensor([0, 1])
    for _ in range(steps):
        sampled = hotpath.sample(hotpath.decode(cache, slots, torch.tensor([t[-1] for t in tokens])))
        for row, token in zip(tokens, sampled.tolist(), strict=True):
            row.append(int(token))
    for slot in range(len(PROMPTS)):
        hotpath.free(cache, slot)
    return tokens


@pytest.fixture
def group(request: pytest.FixtureRequest) -> Iterator[LoadedModel]:
    """Rank 0 of a two-rank group on the model ``request.param`` names (default: tiny)."""
    model = launch(getattr(request, "param", "tiny"), world=2, timeout_s=3, threads=1)
    yield model
    assert model.shard is not None
    model.shard.leader.close()


KNOBS = [
    {},
    {"kv_cache": "static", "fused_qkv": True, "fused_gate_up": True, "attention": "sdpa"},
    {"kv_cache": "static", "decode_step": "fused", "sampling": "device"},
]


@pytest.mark.parametrize("group", ["tiny", "qwen3-moe-tiny"], indirect=True)
def test_two_ranks_give_the_tokens_of_one(group: LoadedModel) -> None:
    whole = load_model(group.source)
    for knobs in KNOBS:
        one, _, _ = load_hotpath(whole, REFERENCE_BUILD, knobs)
        two, _, _ = load_hotpath(group, REFERENCE_BUILD, knobs)
        assert greedy(two) == greedy(one), knobs
        one.close()
        two.close()
    # the shard holds half the heads and widths; the model is the same
    assert group.config.num_attention_heads * 2 == whole.config.num_attention_heads


def test_the_engine_swaps_builds_on_every_rank(group: LoadedModel) -> None:
    engine = Engine(group)
    expected = greedy(load_hotpath(load_model("tiny"), REFERENCE_BUILD)[0])
    for knobs in [*KNOBS, {}]:
        engine.load_build(REFERENCE_BUILD, knobs)
        assert greedy(engine.hotpath) == expected
    engine.close()


def test_a_refusal_every_rank_shares_leaves_the_group_usable(group: LoadedModel) -> None:
    with pytest.raises(
        ValueError, match=r"decode_step = fused with kernels = compile does not run tensor parallel yet"
    ):
        load_hotpath(
            group, REFERENCE_BUILD, {"kv_cache": "static", "decode_step": "fused", "kernels": "compile"}
        )
    hotpath, _, _ = load_hotpath(group, REFERENCE_BUILD)
    assert len(greedy(hotpath, steps=2)[0]) == 3


def test_heads_that_do_not_divide_are_refused() -> None:
    config = SHAPES["tiny"]
    with pytest.raises(
        UsageError, match=r"--tensor-parallel 3 must divide the model's attention heads \(4\)"
    ):
        shard_weights(config, {}, 0, 3)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("raise RuntimeError('rank 1 exploded')", r"rank 1 raised in decode: RuntimeError: rank 1 exploded"),
        ("import os; os._exit(7)", r"rank 1 exited with code 7"),
        ("import time; time.sleep(3600)", r"rank 1 did not finish decode \(call \d+\) within 3 s: it hangs"),
    ],
    ids=["raises", "exits", "hangs"],
)
def test_a_rank_that_fails_alone_is_named(
    group: LoadedModel, tmp_path: Path, body: str, expected: str
) -> None:
    build = wrapping_build(
        tmp_path / "b",
        "one-rank",
        "decode",
        f"        if model.shard.rank == 1:\n            {body}\n        return original(*args)",
    )
    hotpath, _, _ = load_hotpath(group, build)
    started = time.monotonic()
    with pytest.raises(RankFailed, match=expected) as failed:
        greedy(hotpath)
    assert failed.value.ranks == [1]
    assert time.monotonic() - started < 15
    with pytest.raises(RankFailed, match="the tensor-parallel group is broken"):
        hotpath.new_cache(1, 8)


def test_a_follower_slow_to_start_is_not_a_hang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each follower's interpreter sleeps 4 s before it imports anything (a sitecustomize on its
    # path), as torch's import can on a busy CPU: longer than the 3 s that judge a collective.
    # The rendezvous waits for it.
    site = tmp_path / "slow-start"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import time\ntime.sleep(4)\n")
    monkeypatch.syspath_prepend(str(site))
    model = launch("tiny", world=2, timeout_s=3, threads=1)
    assert model.shard is not None
    model.shard.leader.close()
