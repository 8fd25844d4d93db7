"""The e2e's traffic is client traffic: chat completions whose rendered prompts have the shape's
lengths, so the traffic profile the operator derives from the engine's series is the shape's.

An in-process engine over the byte tokenizer (the served tiny shapes' tokenizer and chat
template) and a stand-in hot path; ``Traffic`` runs a few clients against it for a moment.
"""

from __future__ import annotations

import time

import torch

from polymorph_engine.runtime.tokenizer import ByteTokenizer
from polymorph_engine.serving.metrics import ServerMetrics
from polymorph_engine.serving.server import make_server
from polymorph_engine.serving.service import CompletionService
from polymorph_engine.serving.trace import TraceSampler
from support.local_pods import Endpoint
from traffic import TEMPLATE_TOKENS, Shape, Traffic

VOCAB = 512


class NextByte:
    """Next token = last + 1 (mod 256): never EOS, so every answer is as long as asked."""

    def new_cache(self, max_batch: int, max_seq_len: int) -> None:
        return None

    def _logits(self, last: list[int]) -> torch.Tensor:
        logits = torch.zeros(len(last), VOCAB)  # [B, V]
        for row, token in enumerate(last):
            logits[row, (token + 1) % 256] = 1.0
        return logits

    def prefill(self, cache: None, slot: int, tokens: torch.Tensor) -> torch.Tensor:
        return self._logits([int(tokens[-1])])[0]

    def decode(self, cache: None, slots: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self._logits([int(t) for t in tokens])

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(dim=-1)

    def free(self, cache: None, slot: int) -> None:
        pass

    def close(self) -> None:
        pass


def test_traffic_is_chat_at_the_shapes_rendered_prompt_lengths() -> None:
    build = "sha256:" + "ab" * 32
    service = CompletionService(
        NextByte(),
        build_id=build,
        tokenizer=ByteTokenizer(VOCAB),
        vocab_size=VOCAB,
        eos_id=257,
        max_batch=4,
        max_seq_len=256,
        model_names=["tiny"],
        metrics=ServerMetrics(build, "chat"),
        trace=TraceSampler(1.0, seed=0),
    )
    server = make_server(service, "127.0.0.1", 0)
    server.start()
    shape = Shape(
        "test", prompt=(TEMPLATE_TOKENS + 8, TEMPLATE_TOKENS + 40), output=(2, 6), concurrency=2, think_s=0
    )
    traffic = Traffic(
        lambda: [Endpoint("pod-0", server.url, {"polymorph.dev/track": "stable"})], shape
    ).start()
    try:
        deadline = time.monotonic() + 20
        while sum(s.requests for s in traffic.stats().values()) < 12 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        traffic.close()
        server.close()
        service.close(grace_s=1)
    stats = traffic.stats()["stable"]
    assert stats.requests >= 12 and stats.errors == 0
    assert service.trace is not None
    shapes = service.trace.drain()
    assert len(shapes) == stats.requests
    assert all(shape.prompt[0] <= s.inputTokens <= shape.prompt[1] for s in shapes), (
        shapes
    )  # rendered lengths
    assert all(shape.output[0] <= s.outputTokens <= shape.output[1] for s in shapes), shapes
    assert sum(s.outputTokens for s in shapes) == stats.tokens
    assert len("<|user|>\n\n<|assistant|>\n") == TEMPLATE_TOKENS
