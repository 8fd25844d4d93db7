"""The server over the real reference build agrees token for token with naive greedy generation.

Several requests run at once, so they share decode steps (continuous batching); each must
still get exactly the continuation that a full-sequence forward pass picks greedily.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import torch

from engine_support.builds import forward
from polymorph.contract.builds import REFERENCE_BUILD
from polymorph.contract.store import build_id
from polymorph_engine.runtime.checkpoint import load_model
from polymorph_engine.runtime.loader import load_hotpath
from polymorph_engine.runtime.model import LoadedModel
from polymorph_engine.serving.metrics import ServerMetrics
from polymorph_engine.serving.server import EngineServer, make_server
from polymorph_engine.serving.service import CompletionService

MODEL = "qwen2-tiny"  # its greedy continuations vary token to token


def naive_greedy(model: LoadedModel, prompt: list[int], steps: int) -> list[int]:
    """Greedy continuation by re-running the whole sequence each step (no cache, no batching)."""
    ids = list(prompt)
    out: list[int] = []
    for _ in range(steps):
        with torch.no_grad():
            logits = forward(model, torch.tensor(ids, dtype=torch.int64))  # [S, V]
        token = int(logits[-1].argmax())
        out.append(token)
        if token == model.tokenizer.eos_id:
            break
        ids.append(token)
    return out


@pytest.fixture(scope="module")
def reference_server() -> Iterator[tuple[EngineServer, CompletionService, LoadedModel]]:
    model = load_model(MODEL, seed=3)
    hotpath, _, _ = load_hotpath(model, REFERENCE_BUILD)
    build = build_id(REFERENCE_BUILD)
    service = CompletionService(
        hotpath,
        build_id=build,
        tokenizer=model.tokenizer,
        vocab_size=model.config.vocab_size,
        eos_id=model.tokenizer.eos_id,
        max_batch=4,
        max_seq_len=128,
        model_names=[MODEL],
        metrics=ServerMetrics(build, "ref"),
    )
    server = make_server(service, "127.0.0.1", 0)
    server.start()
    yield server, service, model
    server.close()
    service.close(grace_s=1)
    hotpath.close()


def test_concurrent_completions_match_naive_greedy(
    reference_server: tuple[EngineServer, CompletionService, LoadedModel],
) -> None:
    server, service, model = reference_server
    prompts = [[1, 2, 3], [100, 50, 7, 9, 11], [300], [42, 42, 42, 42]]
    steps = 12
    answers: dict[int, dict[str, object]] = {}

    def ask(i: int) -> None:
        r = httpx.post(
            f"{server.url}/v1/completions", json={"prompt": prompts[i], "max_tokens": steps}, timeout=60
        )
        answers[i] = r.json()

    # The engine thread waits until every request is in flight, so they share decode steps by
    # construction, not by how fast the threads happen to be scheduled on a busy machine.
    scheduler = service._scheduler
    step = scheduler.step
    everyone = threading.Event()

    def gated() -> list[tuple[object, int]]:
        everyone.wait(timeout=30)
        return step()  # type: ignore[return-value]

    scheduler.step = gated  # type: ignore[method-assign]
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while service.in_flight < len(prompts) and time.monotonic() < deadline:
            time.sleep(0.005)
        everyone.set()
        for t in threads:
            t.join()
    finally:
        everyone.set()
        scheduler.step = step  # type: ignore[method-assign]
    for i, prompt in enumerate(prompts):
        expected = naive_greedy(model, prompt, steps)
        text_ids = [t for t in expected if t != model.tokenizer.eos_id]
        doc = answers[i]
        choice = doc["choices"][0]  # type: ignore[index]
        assert choice["text"] == model.tokenizer.decode(text_ids), i
        assert doc["usage"]["completion_tokens"] == len(expected), i  # type: ignore[index]
        assert choice["finish_reason"] == ("stop" if expected[-1] == model.tokenizer.eos_id else "length")
    assert service.peak_batch >= 2  # they really shared decode steps
