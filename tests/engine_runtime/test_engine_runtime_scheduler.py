"""Continuous batching: requests that join mid-flight get the same greedy tokens as alone."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator

import pytest
import torch

from engine_support.builds import forward, sensitive_model
from polymorph.contract.builds import REFERENCE_BUILD
from polymorph_engine.runtime.hotpath import HotPath
from polymorph_engine.runtime.loader import load_hotpath
from polymorph_engine.runtime.model import LoadedModel
from polymorph_engine.runtime.scheduler import Request, Scheduler


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return sensitive_model()


@pytest.fixture(params=["concat", "static"])
def hotpath(request: pytest.FixtureRequest, model: LoadedModel) -> Iterator[HotPath]:
    hp, _, _ = load_hotpath(model, REFERENCE_BUILD, {"kv_cache": request.param})
    yield hp
    hp.close()


def _prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(512) for _ in range(n)]


def _drain(scheduler: Scheduler) -> list[tuple[Request, int]]:
    events = []
    while scheduler.has_work():
        events += scheduler.step()
    return events


def _alone(hotpath: HotPath, prompt: list[int], n: int) -> list[int]:
    scheduler = Scheduler(hotpath, max_batch=1, max_seq_len=64)
    request = Request(prompt=prompt, max_new_tokens=n)
    scheduler.add(request)
    _drain(scheduler)
    return request.output


def test_alone_matches_the_full_sequence_forward(model: LoadedModel, hotpath: HotPath) -> None:
    prompt = _prompt(9, seed=1)
    tokens = list(prompt)
    for _ in range(6):  # greedy with the cache-free forward: the obviously right twin
        logits = forward(model, torch.tensor(tokens))
        tokens.append(int(logits[-1].argmax()))
    assert _alone(hotpath, prompt, 6) == tokens[len(prompt) :]


def test_requests_joining_mid_flight_produce_the_tokens_they_produce_alone(hotpath: HotPath) -> None:
    specs = [
        (_prompt(n, seed=i), out) for i, (n, out) in enumerate([(5, 12), (11, 4), (3, 9), (17, 7), (8, 10)])
    ]
    expected = [_alone(hotpath, p, out) for p, out in specs]

    scheduler = Scheduler(hotpath, max_batch=3, max_seq_len=64)
    requests = [Request(prompt=p, max_new_tokens=out) for p, out in specs]
    joins = {0: [0], 2: [1], 3: [2, 3], 6: [4]}  # step -> requests added before it
    step = 0
    batch_sizes = []
    while step <= max(joins) or scheduler.has_work():
        for i in joins.get(step, []):
            scheduler.add(requests[i])
        batch_sizes.append(scheduler.num_running)
        scheduler.step()
        step += 1
    assert [r.output for r in requests] == expected
    assert all(r.finish_reason == "length" for r in requests)
    assert max(batch_sizes) == 3, "requests must actually share decode steps"


def test_a_request_joins_at_the_next_step_and_leaves_when_it_finishes(hotpath: HotPath) -> None:
    scheduler = Scheduler(hotpath, max_batch=2, max_seq_len=64)
    long, short = (
        Request(prompt=_prompt(4, 0), max_new_tokens=5),
        Request(prompt=_prompt(4, 1), max_new_tokens=2),
    )
    scheduler.add(long)
    assert scheduler.step() == [(long, long.output[0])]  # prefill: first token
    scheduler.add(short)
    events = scheduler.step()  # short prefills, long decodes
    assert [r for r, _ in events] == [short, long]
    events = scheduler.step()
    assert [r for r, _ in events] == [long, short] and short.done
    assert scheduler.num_running == 1
    waiting = Request(prompt=_prompt(3, 2), max_new_tokens=1)
    scheduler.add(waiting)
    assert [r for r, _ in scheduler.step()] == [waiting, long]  # the freed slot is reused at once
    assert waiting.done and waiting.finish_reason == "length"


def test_eos_stops_a_request_unless_it_opts_out(hotpath: HotPath) -> None:
    prompt = _prompt(6, seed=3)
    free_run = _alone(hotpath, prompt, 6)
    eos = free_run[2]
    scheduler = Scheduler(hotpath, max_batch=2, max_seq_len=64, eos_id=eos)
    stops, ignores = (
        Request(prompt=prompt, max_new_tokens=6),
        Request(prompt=prompt, max_new_tokens=6, stop_at_eos=False),
    )
    scheduler.add(stops)
    scheduler.add(ignores)
    _drain(scheduler)
    first_eos = free_run.index(eos)
    assert stops.output == free_run[: first_eos + 1] and stops.finish_reason == "stop"
    assert ignores.output == free_run and ignores.finish_reason == "length"


def test_a_full_cache_ends_the_request(hotpath: HotPath) -> None:
    scheduler = Scheduler(hotpath, max_batch=1, max_seq_len=8)
    request = Request(prompt=_prompt(5, 4), max_new_tokens=100)
    scheduler.add(request)
    _drain(scheduler)
    # Prefill writes 5 positions; each further token needs one more: 1 + (8 - 5) tokens fit.
    assert len(request.output) == 4 and request.finish_reason == "length"


def test_cancel_frees_the_slot_for_the_next_request(hotpath: HotPath) -> None:
    scheduler = Scheduler(hotpath, max_batch=1, max_seq_len=64)
    first, second, third = (Request(prompt=_prompt(4, i), max_new_tokens=50) for i in range(3))
    for r in (first, second, third):
        scheduler.add(r)
    scheduler.step()
    scheduler.cancel(third)  # waiting: cancelled at once
    assert third.finish_reason == "cancelled" and scheduler.num_waiting == 1
    scheduler.cancel(first)  # running: retired at the next step, which admits `second`
    assert [r for r, _ in scheduler.step()] == [second]
    assert first.finish_reason == "cancelled" and len(first.output) == 1


def test_bad_requests_are_refused_with_a_reason(hotpath: HotPath) -> None:
    scheduler = Scheduler(hotpath, max_batch=1, max_seq_len=8)
    with pytest.raises(ValueError, match="at least one token"):
        scheduler.add(Request(prompt=[], max_new_tokens=1))
    with pytest.raises(ValueError, match="max_seq_len is 8"):
        scheduler.add(Request(prompt=[1] * 9, max_new_tokens=1))
    with pytest.raises(ValueError, match="max_new_tokens"):
        scheduler.add(Request(prompt=[1], max_new_tokens=0))
    done = Request(prompt=[1, 2], max_new_tokens=1)
    scheduler.add(done)
    _drain(scheduler)
    with pytest.raises(ValueError, match="already scheduled"):
        scheduler.add(done)


def test_requests_may_be_added_from_another_thread_while_the_engine_steps(hotpath: HotPath) -> None:
    scheduler = Scheduler(hotpath, max_batch=4, max_seq_len=64)
    requests = [Request(prompt=_prompt(5, i), max_new_tokens=3) for i in range(12)]

    def producer() -> None:
        for r in requests:
            scheduler.add(r)

    assert not scheduler.wait_for_work(timeout=0.01)
    thread = threading.Thread(target=producer)
    thread.start()
    while thread.is_alive() or scheduler.has_work():
        if scheduler.wait_for_work(timeout=0.05):
            scheduler.step()
    thread.join()
    assert all(r.finish_reason == "length" and len(r.output) == 3 for r in requests)
