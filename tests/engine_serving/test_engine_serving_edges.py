"""The engine's HTTP edges (issue 17), over real sockets to the real engine: the tiny model on CPU
with the reference build.

Each class has its table: requests that break HTTP itself (431 or 400, the OpenAI error JSON,
one log line without the client's bytes, counted in /metrics); connections that send nothing or
half a request (closed after the idle timeout); JSON with half a surrogate pair (a 400 saying
so); and the sampling fields, which are implemented (temperature, top_p, seed, stop) or refused
with a 400 naming the field, never accepted and ignored.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from polymorph.contract.builds import REFERENCE_BUILD
from polymorph.contract.store import build_id
from polymorph_engine.runtime.checkpoint import load_model
from polymorph_engine.runtime.loader import load_hotpath
from polymorph_engine.serving import server as server_module
from polymorph_engine.serving.metrics import ServerMetrics
from polymorph_engine.serving.server import EngineServer, make_server
from polymorph_engine.serving.service import CompletionService

MODEL = "tiny"


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    """(model, hotpath): loaded once for the module."""
    model = load_model(MODEL, seed=0)
    hotpath, _, _ = load_hotpath(model, REFERENCE_BUILD)
    yield model, hotpath
    hotpath.close()


def _serve(engine: Any) -> tuple[EngineServer, CompletionService]:
    model, hotpath = engine
    build = build_id(REFERENCE_BUILD)
    service = CompletionService(
        hotpath,
        build_id=build,
        tokenizer=model.tokenizer,
        vocab_size=model.config.vocab_size,
        eos_id=None,  # random weights: no early stop, so every completion has max_tokens tokens
        max_batch=4,
        max_seq_len=128,
        model_names=[MODEL],
        metrics=ServerMetrics(build, "edges"),
    )
    server = make_server(service, "127.0.0.1", 0)
    server.start()
    return server, service


@pytest.fixture(scope="module")
def served(engine: Any) -> Iterator[tuple[EngineServer, CompletionService]]:
    server, service = _serve(engine)
    yield server, service
    server.close()
    service.close(grace_s=1)


def _raw(server: EngineServer, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` on a fresh connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def _protocol_errors(server: EngineServer) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics").text
    return {
        s.labels["reason"]: s.value
        for f in text_string_to_metric_families(text)
        if f.name == "polymorph_http_protocol_errors"
        for s in f.samples
        if s.name.endswith("_total")
    }


# --- requests that break HTTP itself -----------------------------------------------------------

HUGE = "x" * 100_000


@pytest.mark.parametrize(
    ("request_bytes", "status", "code", "echo"),
    [
        pytest.param(
            f"POST /v1/completions HTTP/1.1\r\nHost: e\r\nContent-Length: {'9' * 5000}\r\n\r\n".encode(),
            400,
            "bad_http",
            "9999999999",
            id="5000-digit-content-length",
        ),
        pytest.param(
            f"GET /healthz HTTP/1.1\r\nHost: e\r\nX-Big: {HUGE}\r\n\r\n".encode(),
            431,
            "headers_too_large",
            "xxxxxxxxxx",
            id="100KB-header",
        ),
        pytest.param(
            (
                "GET /healthz HTTP/1.1\r\nHost: e\r\n" + "".join(f"X-{i}: v\r\n" for i in range(300)) + "\r\n"
            ).encode(),
            431,
            "headers_too_large",
            "X-299",
            id="300-headers",
        ),
        pytest.param(
            f"GET /{'a' * 20_000} HTTP/1.1\r\nHost: e\r\n\r\n".encode(),
            431,
            "headers_too_large",
            "aaaaaaaaaa",
            id="20KB-request-line",
        ),
        pytest.param(
            b"NOT HTTP AT ALL secret-token-42\r\n\r\n", 400, "bad_http", "secret-token-42", id="garbage"
        ),
        pytest.param(
            b"POST /v1/completions HTTP/1.1\r\nHost: e\r\nTransfer-Encoding: chunked\r\n\r\nzz-secret\r\n",
            400,
            "bad_http",
            "zz-secret",
            id="bad-chunk-size",
        ),
    ],
)
def test_a_request_that_breaks_http_gets_openai_json_one_log_line_and_a_count(
    served: tuple[EngineServer, CompletionService],
    caplog: pytest.LogCaptureFixture,
    request_bytes: bytes,
    status: int,
    code: str,
    echo: str,
) -> None:
    server, _ = served
    before = _protocol_errors(server).get(code, 0)
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        answer = _raw(server, request_bytes)
        time.sleep(0.2)  # the log line is written on the server's loop thread
    head, _, body = answer.partition(b"\r\n\r\n")
    # The version is HTTP/1.0 when the request line itself could not be read.
    assert re.match(rf"HTTP/1\.[01] {status} ".encode(), head.split(b"\r\n")[0]), answer[:300]
    assert b"application/json" in head
    error = json.loads(body)["error"]
    assert error["code"] == code and error["type"] == "invalid_request_error" and error["message"]
    assert echo not in error["message"]
    lines = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert len(lines) <= 1, [r.getMessage() for r in lines]
    assert all(r.exc_info is None for r in caplog.records), "a traceback was logged"
    assert all(echo not in r.getMessage() for r in caplog.records), "the client's bytes were logged"
    assert _protocol_errors(server).get(code, 0) == before + 1
    assert httpx.get(f"{server.url}/healthz").status_code == 200  # the server is unharmed


# --- connections that send nothing, or half a request --------------------------------------------


@pytest.fixture
def quick_timeout(engine: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[EngineServer]:
    monkeypatch.setattr(server_module, "IDLE_TIMEOUT_S", 1.0)
    server, service = _serve(engine)
    yield server
    server.close()
    service.close(grace_s=1)


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``sock`` within ``seconds`` (reads whatever it sends first)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    return True


@pytest.mark.parametrize(
    "sent",
    [
        pytest.param(b"", id="silent"),
        pytest.param(b"GET /healthz HTTP/1.1\r\nHost: e\r\n", id="headers-never-end"),
        pytest.param(b"GET /heal", id="half-a-request-line"),
        pytest.param(b"GET /healthz HTTP/1.1\r\nHost: e\r\n\r\n", id="idle-after-an-answer"),
    ],
)
def test_an_idle_or_half_sent_connection_is_closed(quick_timeout: EngineServer, sent: bytes) -> None:
    with socket.create_connection(("127.0.0.1", quick_timeout.port), timeout=10) as sock:
        sock.sendall(sent)
        assert _closed_within(sock, 5.0), "the server kept an idle connection open"
    assert httpx.get(f"{quick_timeout.url}/healthz").status_code == 200


def test_the_idle_timeout_is_bounded() -> None:
    assert 0 < server_module.IDLE_TIMEOUT_S <= 60


# --- half a surrogate pair ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        pytest.param(b'{"prompt": "\\ud800"}', 400, "invalid_unicode", id="lone-high-at-end"),
        pytest.param(b'{"prompt": "a\\ud800b"}', 400, "invalid_unicode", id="lone-high-mid"),
        pytest.param(b'{"prompt": "\\udc00"}', 400, "invalid_unicode", id="lone-low"),
        pytest.param(b'{"prompt": "\\ud800\\u0041"}', 400, "invalid_unicode", id="high-then-not-low"),
        pytest.param(b'{"prompt": "hi", "stop": "\\udfff"}', 400, "invalid_unicode", id="in-stop"),
        pytest.param(b'{"prompt": "\xff\xfe"}', 400, "invalid_unicode", id="not-utf8"),
        pytest.param(b'{"prompt": "\\ud83d\\ude00", "max_tokens": 2}', 200, None, id="a-whole-pair"),
    ],
)
def test_half_a_surrogate_pair_is_a_clear_400(
    served: tuple[EngineServer, CompletionService], body: bytes, status: int, code: str | None
) -> None:
    server, _ = served
    r = httpx.post(f"{server.url}/v1/completions", content=body, timeout=30)
    assert r.status_code == status, r.text
    if code is not None:
        error = r.json()["error"]
        assert error["code"] == code
        assert "surrogate" in error["message"] or "UTF-8" in error["message"]
        assert "hex escape" not in error["message"].split("(")[0]  # the sentence is ours, not the parser's


# --- sampling fields: implemented or refused --------------------------------------------------


def _complete(server: EngineServer, **body: Any) -> httpx.Response:
    if any(v == float("inf") for v in body.values()):  # JSON has no infinity: send the number that overflows
        text = json.dumps({"prompt": "hello", "max_tokens": 12, **body}).replace("Infinity", "1e999")
        return httpx.post(f"{server.url}/v1/completions", content=text.encode(), timeout=60)
    return httpx.post(
        f"{server.url}/v1/completions", json={"prompt": "hello", "max_tokens": 12, **body}, timeout=60
    )


def _text(server: EngineServer, **body: Any) -> str:
    r = _complete(server, **body)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["text"])


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": -1}, "temperature"),
        ({"temperature": 5}, "temperature"),
        ({"temperature": 1e308 * 10}, "temperature"),  # sent as 1e999
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": 1, "top_p": 5}, "top_p"),
        ({"temperature": 1, "top_p": 0}, "top_p"),
        ({"top_p": -0.5}, "top_p"),
        ({"temperature": 1, "seed": -1}, "seed"),
        ({"temperature": 1, "seed": 2**64}, "seed"),
        ({"temperature": 1, "seed": 1.5}, "seed"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": -1}, "frequency_penalty"),
        ({"best_of": 3}, "best_of"),
        ({"logit_bias": {"5": 100}}, "logit_bias"),
        ({"suffix": "end"}, "suffix"),
        ({"ignore_eos": "yes"}, "ignore_eos"),  # vLLM's, honoured (test_engine_serving_clients)
        ({"top_k": 40}, "top_k"),
        ({"repetition_penalty": 1.1}, "repetition_penalty"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),  # without stream
        ({"temprature": 0.7}, "temprature"),
    ],
)
def test_a_field_the_engine_cannot_honour_is_a_400_naming_it(
    served: tuple[EngineServer, CompletionService], fields: dict[str, Any], param: str
) -> None:
    server, _ = served
    r = _complete(server, **fields)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and param in error["message"], error


@pytest.mark.parametrize(
    "neutral",
    [
        {"presence_penalty": 0, "frequency_penalty": 0},
        {"best_of": 1, "n": 1},
        {"logit_bias": {}},
        {"user": "team-a"},
        {"temperature": 0, "top_p": 0.5, "seed": 7},  # greedy: the arg max is in every nucleus
        {"temperature": 0.0},
        {"top_k": -1, "min_p": 0, "repetition_penalty": 1, "min_tokens": 0},  # vLLM's off values
        {"n": None, "echo": None, "stream": None, "temperature": None},  # null is the default
    ],
)
def test_neutral_values_are_greedy(
    served: tuple[EngineServer, CompletionService], neutral: dict[str, Any]
) -> None:
    server, _ = served
    assert _text(server, **neutral) == _text(server)


def test_a_seed_reproduces_its_sample_and_seeds_differ(
    served: tuple[EngineServer, CompletionService],
) -> None:
    server, _ = served
    greedy = _text(server)
    first = _text(server, temperature=2, seed=11)
    assert _text(server, temperature=2, seed=11) == first  # the same seed, the same tokens
    samples = {_text(server, temperature=2, seed=s) for s in range(6)}
    assert len(samples) >= 3 and greedy not in samples  # the temperature is used, not ignored


def test_a_tiny_nucleus_is_the_arg_max(served: tuple[EngineServer, CompletionService]) -> None:
    server, _ = served
    assert _text(server, temperature=2, top_p=1e-9, seed=3) == _text(server)


def test_stop_applies_to_sampled_text(served: tuple[EngineServer, CompletionService]) -> None:
    server, _ = served
    full = _text(server, temperature=1.5, seed=5, max_tokens=24)
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    assert stop.strip(), full
    cut = _text(server, temperature=1.5, seed=5, max_tokens=24, stop=stop)
    assert stop not in cut and full.startswith(cut)


def test_streamed_samples_match_plain_ones(served: tuple[EngineServer, CompletionService]) -> None:
    server, _ = served
    plain = _text(server, temperature=1, seed=9)
    with httpx.stream(
        "POST",
        f"{server.url}/v1/completions",
        json={"prompt": "hello", "max_tokens": 12, "temperature": 1, "seed": 9, "stream": True},
        timeout=60,
    ) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events if json.loads(e)["choices"]) == plain
