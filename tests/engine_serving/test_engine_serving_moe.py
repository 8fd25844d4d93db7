"""The server over Mixture-of-Experts models (Qwen3-MoE, Mixtral): concurrent completions share
decode steps and each still gets exactly the naive greedy continuation, under the reference
build's defaults and under a fast MoE build (static cache, fused step, grouped experts)."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest
from test_engine_serving_reference import naive_greedy  # a sibling test module (rootdir imports)

from polymorph.contract.builds import REFERENCE_BUILD
from polymorph.contract.store import build_id
from polymorph_engine.runtime.checkpoint import load_model
from polymorph_engine.runtime.loader import load_hotpath
from polymorph_engine.serving.metrics import ServerMetrics
from polymorph_engine.serving.server import make_server
from polymorph_engine.serving.service import CompletionService

FAST_MOE = {
    "kv_cache": "static",
    "decode_step": "fused",
    "moe_experts": "grouped",
    "moe_routing": "fused",
    "sampling": "device",
}


@pytest.mark.parametrize("shape", ["qwen3-moe-tiny", "mixtral-tiny"])
@pytest.mark.parametrize("knobs", [{}, FAST_MOE], ids=["reference", "fast-moe"])
def test_concurrent_completions_match_naive_greedy(shape: str, knobs: dict[str, Any]) -> None:
    model = load_model(shape, seed=3)
    hotpath, _, _ = load_hotpath(model, REFERENCE_BUILD, knobs)
    build = build_id(REFERENCE_BUILD)
    service = CompletionService(
        hotpath,
        build_id=build,
        tokenizer=model.tokenizer,
        vocab_size=model.config.vocab_size,
        eos_id=model.tokenizer.eos_id,
        max_batch=4,
        max_seq_len=64,
        model_names=[shape],
        metrics=ServerMetrics(build, "ref"),
    )
    server = make_server(service, "127.0.0.1", 0)
    server.start()
    prompts = [[1, 2, 3], [100, 50, 7, 9, 11], [300], [42, 42, 42, 42]]
    steps = 10
    answers: dict[int, dict[str, Any]] = {}

    def ask(i: int) -> None:
        r = httpx.post(
            f"{server.url}/v1/completions", json={"prompt": prompts[i], "max_tokens": steps}, timeout=60
        )
        answers[i] = r.json()

    try:
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        server.close()
        service.close(grace_s=1)
        hotpath.close()
    for i, prompt in enumerate(prompts):
        expected = naive_greedy(model, prompt, steps)
        text_ids = [t for t in expected if t != model.tokenizer.eos_id]
        choice = answers[i]["choices"][0]
        assert choice["text"] == model.tokenizer.decode(text_ids), i
        assert answers[i]["usage"]["completion_tokens"] == len(expected), i
