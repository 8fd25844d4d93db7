"""The engine server end to end over real HTTP (httpx) on a free loopback port.

The hot path here is a tiny, deterministic stand-in that follows the HotPath protocol: the
next token is always ``last + 1`` (mod 256), so a prompt "a" continues "bcdef...". That makes
completions, stop strings and token counts exactly predictable; the real reference build is
exercised in test_engine_serving_cli.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from polymorph_engine.runtime.tokenizer import ByteTokenizer
from polymorph_engine.serving.metrics import ServerMetrics
from polymorph_engine.serving.server import EngineServer, make_server
from polymorph_engine.serving.service import CompletionService
from polymorph_engine.serving.trace import TraceSampler

VOCAB = 512
BUILD = "sha256:" + "ab" * 32


class CountingHotPath:
    """Next token = last token + 1 (mod 256). ``delay_s`` slows each call to make batching observable."""

    def __init__(self, delay_s: float = 0.0, fail_on: int | None = None) -> None:
        self.delay_s = delay_s
        self.fail_on = fail_on
        self.decode_batches: list[int] = []

    def new_cache(self, max_batch: int, max_seq_len: int) -> dict[int, int]:
        return {}

    def _logits(self, last: list[int]) -> torch.Tensor:
        logits = torch.zeros(len(last), VOCAB)  # [B, V]
        for row, token in enumerate(last):
            if token == self.fail_on:
                raise RuntimeError("injected build failure")
            logits[row, (token + 1) % 256] = 1.0
        return logits

    def prefill(self, cache: dict[int, int], slot: int, tokens: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay_s)
        cache[slot] = int(tokens[-1])
        return self._logits([cache[slot]])[0]

    def decode(self, cache: dict[int, int], slots: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay_s)
        self.decode_batches.append(len(slots))
        return self._logits([int(t) for t in tokens])

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(dim=-1)

    def free(self, cache: dict[int, int], slot: int) -> None:
        cache.pop(slot, None)

    def close(self) -> None:
        pass


def _service(
    hotpath: CountingHotPath, trace: TraceSampler | None = None, max_batch: int = 4
) -> CompletionService:
    return CompletionService(
        hotpath,
        build_id=BUILD,
        tokenizer=ByteTokenizer(VOCAB),
        vocab_size=VOCAB,
        eos_id=257,
        max_batch=max_batch,
        max_seq_len=64,
        model_names=["tiny", "/models/tiny"],
        metrics=ServerMetrics(BUILD, "tiny-md"),
        trace=trace,
    )


@pytest.fixture
def served() -> Iterator[tuple[EngineServer, CompletionService, CountingHotPath]]:
    hotpath = CountingHotPath()
    service = _service(hotpath, trace=TraceSampler(1.0, seed=0))
    server = make_server(service, "127.0.0.1", 0)
    server.start()
    yield server, service, hotpath
    server.close()
    service.close(grace_s=1)


def _families(text: str) -> dict[tuple[str, str], Any]:
    return {(f.name, f.type): f for f in text_string_to_metric_families(text)}


def _by_reason(fams: dict[tuple[str, str], Any]) -> dict[tuple[str, str], float]:
    """``polymorph_requests_total`` by ``(status, reason)``."""
    return {
        (s.labels["status"], s.labels["reason"]): s.value
        for s in fams[("polymorph_requests", "counter")].samples
        if s.name.endswith("_total")
    }


def _by_status(fams: dict[tuple[str, str], Any]) -> dict[str, float]:
    """``polymorph_requests_total`` summed by status."""
    out: dict[str, float] = {}
    for (status, _), value in _by_reason(fams).items():
        out[status] = out.get(status, 0.0) + value
    return out


def test_plain_completion_is_greedy_and_counted(
    served: tuple[EngineServer, CompletionService, Any],
) -> None:
    server, _, _ = served
    r = httpx.post(f"{server.url}/v1/completions", json={"model": "tiny", "prompt": "a", "max_tokens": 5})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["object"] == "text_completion"
    assert doc["choices"][0]["text"] == "bcdef"
    assert doc["choices"][0]["finish_reason"] == "length"
    assert doc["usage"] == {"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6}


def test_token_id_prompt_and_stop_string(served: tuple[EngineServer, CompletionService, Any]) -> None:
    server, _, _ = served
    r = httpx.post(
        f"{server.url}/v1/completions", json={"prompt": [104, 105], "max_tokens": 20, "stop": ["lm", "zz"]}
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["text"] == "jk"  # "jklm..." cut before the stop string
    assert choice["finish_reason"] == "stop"


def _sse(lines: Iterator[str]) -> list[str]:
    payloads = []
    for line in lines:
        if line.startswith("data: "):
            payloads.append(line[len("data: ") :])
    return payloads


def test_streaming_completion_ends_with_done(served: tuple[EngineServer, CompletionService, Any]) -> None:
    server, _, _ = served
    body = {
        "prompt": "a",
        "max_tokens": 6,
        "stream": True,
        "stop": "g",
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        payloads = _sse(r.iter_lines())
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == "bcdef"
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert reasons[-1] == "stop" and all(r is None for r in reasons[:-1])
    assert len(reasons) >= 3  # tokens really arrived one by one, not as one blob
    assert chunks[-1]["usage"]["completion_tokens"] == 6


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b"{}", "prompt"),
        (b'{"prompt": ""}', "prompt"),
        (b'{"prompt": 5}', "prompt"),
        (b'{"prompt": [1, 9999]}', "prompt"),
        (b'{"prompt": ["a", ""]}', "prompt"),  # one of several prompts empty
        (b'{"prompt": "a", "max_tokens": 0}', "max_tokens"),
        (b'{"prompt": "a", "max_tokens": 64}', "max_tokens"),
        (b'{"prompt": "a", "max_tokens": "5"}', "max_tokens"),
        (b'{"prompt": "' + b"x" * 64 + b'"}', "prompt"),
        (b'{"prompt": "a", "stop": [1]}', "stop"),
        (b'{"prompt": "a", "stream": "yes"}', "stream"),
        (b'{"prompt": "a", "n": 0}', "n"),
        (b'{"prompt": "a", "echo": true, "logprobs": 1}', "echo"),
    ],
)
def test_bad_requests_get_openai_400(
    served: tuple[EngineServer, Any, Any], body: bytes, param: str | None
) -> None:
    server, _, _ = served
    r = httpx.post(f"{server.url}/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"].endswith(".") and "\n" not in error["message"]


def test_unknown_model_is_404(served: tuple[EngineServer, Any, Any]) -> None:
    server, _, _ = served
    r = httpx.post(f"{server.url}/v1/completions", json={"model": "gpt-4", "prompt": "a"})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"


def test_probes_models_and_no_admin_in_serve_mode(served: tuple[EngineServer, Any, Any]) -> None:
    server, _, _ = served
    assert httpx.get(f"{server.url}/healthz").status_code == 200
    ready = httpx.get(f"{server.url}/readyz")
    assert ready.status_code == 200 and ready.json()["build"] == BUILD
    models = httpx.get(f"{server.url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny", "/models/tiny"]
    for method, path in [
        ("POST", "/admin/experiments"),
        ("POST", "/admin/builds/load"),
        ("GET", "/admin/build"),
    ]:
        r = httpx.request(method, f"{server.url}{path}", json={})
        assert r.status_code == 404, path
        assert "error" in r.json()
    assert httpx.get(f"{server.url}/nope").status_code == 404
    assert httpx.get(f"{server.url}/v1/completions").status_code == 405


def test_metrics_histograms_carry_labels_and_counts(served: tuple[EngineServer, Any, Any]) -> None:
    server, _, _ = served
    for n in (3, 7):
        assert (
            httpx.post(f"{server.url}/v1/completions", json={"prompt": "ab", "max_tokens": n}).status_code
            == 200
        )
    assert httpx.post(f"{server.url}/v1/completions", content=b"{").status_code == 400
    r = httpx.get(f"{server.url}/metrics")
    assert r.status_code == 200
    fams = _families(r.text)
    labels = {"build": BUILD, "model_deployment": "tiny-md", "track": "stable"}

    def sample(name: str, kind: str, suffix: str, **extra: str) -> float:
        want = {**labels, **extra}
        found = [
            s
            for s in fams[(name, kind)].samples
            if s.name == name + suffix and want.items() <= s.labels.items()
        ]
        assert found, (name, suffix, want)
        return float(found[-1].value)

    assert sample("polymorph_prompt_tokens", "histogram", "_count") == 2
    assert sample("polymorph_prompt_tokens", "histogram", "_sum") == 4
    assert sample("polymorph_generation_tokens", "histogram", "_sum") == 10
    assert sample("polymorph_generation_tokens", "histogram", "_bucket", le="4.0") == 1
    assert sample("polymorph_time_to_first_token_seconds", "histogram", "_count") == 2
    assert sample("polymorph_inter_token_latency_seconds", "histogram", "_count") == (3 - 1) + (7 - 1)
    assert sample("polymorph_requests", "counter", "_total", status="ok", reason="length") == 2
    by_status = _by_status(fams)
    assert by_status["error"] == 0
    assert by_status["invalid"] == 1  # the bad body: the client's fault, kept out of "error"
    assert _by_reason(fams)[("invalid", "invalid_json")] == 1
    assert sample("polymorph_prompt_tokens", "counter", "_total") == 4
    assert sample("polymorph_generation_tokens", "counter", "_total") == 10
    assert sample("polymorph_requests_in_flight", "gauge", "") == 0


def test_concurrent_requests_are_batched_together() -> None:
    hotpath = CountingHotPath(delay_s=0.01)
    service = _service(hotpath, max_batch=4)
    server = make_server(service, "127.0.0.1", 0)
    server.start()
    try:
        results: list[str] = []

        def one(prompt: str) -> None:
            r = httpx.post(
                f"{server.url}/v1/completions", json={"prompt": prompt, "max_tokens": 20}, timeout=30
            )
            results.append(r.json()["choices"][0]["text"])

        threads = [threading.Thread(target=one, args=(p,)) for p in "AKUa"]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == sorted(
            "".join(chr(ord(p) + i) for i in range(1, 21)) for p in "AKUa"
        )  # each request got its own continuation, not a neighbour's
        assert service.peak_batch >= 2
        assert max(hotpath.decode_batches) >= 2
        fams = _families(httpx.get(f"{server.url}/metrics").text)
        batch = fams[("polymorph_decode_batch_size", "histogram")]
        le1 = next(s for s in batch.samples if s.name.endswith("_bucket") and s.labels["le"] == "1.0").value
        total = next(s for s in batch.samples if s.name.endswith("_count")).value
        assert total > le1  # some decode steps ran more than one request
    finally:
        server.close()
        service.close(grace_s=1)


def test_build_failure_is_a_500_and_counted_as_error() -> None:
    service = _service(CountingHotPath(fail_on=ord("e")))
    server = make_server(service, "127.0.0.1", 0)
    server.start()
    try:
        r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "a", "max_tokens": 10})
        assert r.status_code == 500
        assert "injected build failure" in r.json()["error"]["message"]
        ok = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert ok.status_code == 200  # the server recovered with a fresh scheduler
        fams = _families(httpx.get(f"{server.url}/metrics").text)
        assert _by_status(fams) == {"ok": 1.0, "error": 1.0, "cancelled": 0.0}
        assert _by_reason(fams)[("error", "batch_failed")] == 1.0
    finally:
        server.close()
        service.close(grace_s=1)


def test_trace_samples_shapes_not_content(served: tuple[EngineServer, CompletionService, Any]) -> None:
    server, service, _ = served
    httpx.post(f"{server.url}/v1/completions", json={"prompt": "secret", "max_tokens": 3})
    httpx.post(f"{server.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert service.trace is not None
    records = service.trace.drain()
    assert [(r.inputTokens, r.outputTokens) for r in records] == [(6, 3), (2, 2)]
    assert records[0].arrivalS == 0 and records[1].arrivalS > 0


def test_swap_serves_later_requests_with_the_new_build(
    served: tuple[EngineServer, CompletionService, Any],
) -> None:
    server, service, _ = served
    new_build = "sha256:" + "cd" * 32
    service.swap(CountingHotPath(), new_build)
    assert httpx.get(f"{server.url}/readyz").json()["build"] == new_build
    assert (
        httpx.post(f"{server.url}/v1/completions", json={"prompt": "a", "max_tokens": 2}).json()["choices"][
            0
        ]["text"]
        == "bc"
    )
    fams = _families(httpx.get(f"{server.url}/metrics").text)
    counts = {
        s.labels["build"]: s.value
        for s in fams[("polymorph_prompt_tokens", "histogram")].samples
        if s.name.endswith("_count")
    }
    assert counts == {BUILD: 0.0, new_build: 1.0}


def test_a_client_that_goes_away_cancels_its_request() -> None:
    hotpath = CountingHotPath(delay_s=0.02)
    service = _service(hotpath)
    server = make_server(service, "127.0.0.1", 0)
    server.start()
    try:
        body = {"prompt": "a", "max_tokens": 60, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    break  # one token, then hang up
        deadline = time.monotonic() + 10
        while service.in_flight and time.monotonic() < deadline:
            time.sleep(0.02)
        assert service.in_flight == 0
        decodes = len(hotpath.decode_batches)
        assert decodes < 40  # generation stopped long before max_tokens
        time.sleep(0.2)
        assert len(hotpath.decode_batches) == decodes
        fams = _families(httpx.get(f"{server.url}/metrics").text)
        assert _by_status(fams) == {"ok": 0.0, "error": 0.0, "cancelled": 1.0}
        gauge = fams[("polymorph_requests_in_flight", "gauge")].samples[0].value
        assert gauge == 0
    finally:
        server.close()
        service.close(grace_s=1)


def test_keep_alive_connection_survives_refused_requests(
    served: tuple[EngineServer, CompletionService, Any],
) -> None:
    server, _, _ = served
    with httpx.Client(base_url=server.url) as client:
        assert client.post("/admin/experiments", json={"archive": "x" * 1000}).status_code == 404
        assert client.post("/v1/completions", content=b"{bad").status_code == 400
        assert client.post("/v1/models", json={"a": 1}).status_code == 405
        r = client.post("/v1/completions", json={"prompt": "a", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "bc"
        assert r.http_version == "HTTP/1.1"
