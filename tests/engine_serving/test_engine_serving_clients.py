"""The engine as a new user's clients try it: the fields and paths other clients commonly send.

Every field is honoured, accepted at its no-op value, or a 400 naming it in one sentence; a path
that is not served is a 404 listing the ones that are. vLLM's extensions that load generators
send (GuideLLM: ``ignore_eos``, ``stream_options.continuous_usage_stats``) are honoured. And one
pipeline for both endpoints: a chat request is admitted, counted in every metric series and
traced exactly as the completion of its rendered prompt is.

The engine serves an in-process stand-in hot path over the byte tokenizer whose next token is
``last + 1`` (mod 256), except that after a carriage return (13) it is EOS (257), so whether an
answer ends at EOS is known from its prompt.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from polymorph_engine.runtime.tokenizer import ByteTokenizer
from polymorph_engine.serving.chat import chat_messages, render_chat
from polymorph_engine.serving.metrics import ServerMetrics
from polymorph_engine.serving.server import ENDPOINTS, EngineServer, make_server
from polymorph_engine.serving.service import CompletionService
from polymorph_engine.serving.trace import TraceSampler

VOCAB = 512
EOS = 257
BUILD = "sha256:" + "ef" * 32
USER = [{"role": "user", "content": "a"}]
RENDERED = "<|user|>\na\n<|assistant|>\n"  # ends with \n (10): 11, 12, 13, then EOS


class EosAfterReturn:
    """Next token = last + 1 (mod 256); after 13 (a carriage return) it is EOS. ``gate``, when
    set, holds every prefill until it opens."""

    def __init__(self) -> None:
        self.gate: threading.Event | None = None

    def new_cache(self, max_batch: int, max_seq_len: int) -> None:
        return None

    def _logits(self, last: list[int]) -> torch.Tensor:
        logits = torch.zeros(len(last), VOCAB)  # [B, V]
        for row, token in enumerate(last):
            logits[row, EOS if token == 13 else (token + 1) % 256] = 1.0
        return logits

    def prefill(self, cache: None, slot: int, tokens: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            self.gate.wait(timeout=30)
        return self._logits([int(tokens[-1])])[0]

    def decode(self, cache: None, slots: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self._logits([int(t) for t in tokens])

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(dim=-1)

    def free(self, cache: None, slot: int) -> None:
        pass

    def close(self) -> None:
        pass


def _serve(
    hotpath: EosAfterReturn, *, max_batch: int = 4, max_queue: int = 16
) -> tuple[EngineServer, CompletionService]:
    service = CompletionService(
        hotpath,
        build_id=BUILD,
        tokenizer=ByteTokenizer(VOCAB),
        vocab_size=VOCAB,
        eos_id=EOS,
        max_batch=max_batch,
        max_seq_len=256,
        model_names=["tiny"],
        metrics=ServerMetrics(BUILD, "tiny-md"),
        trace=TraceSampler(1.0, seed=0),
        max_queue=max_queue,
    )
    server = make_server(service, "127.0.0.1", 0)
    server.start()
    return server, service


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[EngineServer, CompletionService]]:
    server, service = _serve(EosAfterReturn())
    yield server, service
    server.close()
    service.close(grace_s=1)


@pytest.fixture
def url(served: tuple[EngineServer, CompletionService]) -> str:
    return served[0].url


def _chat(url: str, **fields: Any) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions", json={"model": "tiny", "messages": USER, **fields}, timeout=30
    )


def _events(r: httpx.Response) -> list[dict[str, Any]]:
    lines = [line.removeprefix("data: ") for line in r.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


# --- fields: honoured, accepted at their no-op value, or refused by name -----------------------

COMMONLY_SENT = {
    "user": {"user": "user-1234"},
    "stream_options": {"stream": True, "stream_options": {"include_usage": True}},
    "parallel_tool_calls": {"parallel_tool_calls": True},
    "parallel_tool_calls false": {"parallel_tool_calls": False},
    "max_completion_tokens": {"max_completion_tokens": 3},
    "max_tokens and max_completion_tokens alike": {"max_tokens": 3, "max_completion_tokens": 3},
    "penalties 0": {"frequency_penalty": 0, "presence_penalty": 0.0},
    "logit_bias {}": {"logit_bias": {}},
    "tool_choice none": {"tool_choice": "none"},
    "tool_choice auto, no tools": {"tool_choice": "auto", "tools": []},
    "response_format text": {"response_format": {"type": "text"}},
    "store false, metadata": {"store": False, "metadata": {"team": "a"}},
    "service_tier auto": {"service_tier": "auto"},
    "vLLM's no-op sampling values": {"top_k": -1, "min_p": 0, "repetition_penalty": 1, "min_tokens": 0},
    "top_k 0": {"top_k": 0},
    "nulls": {
        "n": None, "stream": None, "stream_options": None, "temperature": None, "top_p": None, "stop": None,
        "seed": None, "max_tokens": None, "logprobs": None, "top_logprobs": None, "user": None,
        "tools": None, "tool_choice": None, "logit_bias": None, "ignore_eos": None,
    },
}  # fmt: skip


@pytest.mark.parametrize("fields", COMMONLY_SENT.values(), ids=COMMONLY_SENT.keys())
def test_what_clients_commonly_send_to_chat_is_taken(url: str, fields: dict[str, Any]) -> None:
    r = _chat(url, **{"max_tokens": 3, **fields})
    assert r.status_code == 200, r.text
    if fields.get("stream"):
        events = _events(r)
        assert "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
        assert events[-1]["usage"]["completion_tokens"] == 3
    else:
        assert (
            r.json()["choices"][0]["message"]["content"]
            == "\x0b\x0c\r"[: r.json()["usage"]["completion_tokens"]]
        )


def test_nulls_are_defaults_on_completions_too(url: str) -> None:
    body = {"prompt": "a", "max_tokens": 2, "n": None, "echo": None, "stream": None, "logprobs": None}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == "bc"


REFUSED = [
    ({"logit_bias": {"5": 1.5}}, "logit_bias", "logit_bias is not supported"),
    ({"frequency_penalty": 0.5}, "frequency_penalty", "set it to 0"),
    ({"top_k": 5}, "top_k", "set it to -1 or 0"),
    ({"min_p": 0.1}, "min_p", "set it to 0"),
    ({"repetition_penalty": 1.2}, "repetition_penalty", "set it to 1"),
    ({"min_tokens": 4}, "min_tokens", "set it to 0"),
    ({"tool_choice": "required"}, "tool_choice", "no tool calling"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "only allowed with stream true"),
    ({"stream": True, "stream_options": {"include_usage": 1}}, "stream_options", "stream_options must be"),
    ({"ignore_eos": "yes"}, "ignore_eos", "ignore_eos must be true or false"),
    ({"best_of": 2}, "best_of", "the fields are"),
    ({"max_tokens": 3, "max_completion_tokens": 5}, "max_tokens", "differ here (3 and 5); send one of them"),
]


@pytest.mark.parametrize(
    ("fields", "param", "words"), REFUSED, ids=[r[1] + str(i) for i, r in enumerate(REFUSED)]
)
def test_what_chat_cannot_honour_is_one_sentence_naming_the_field(
    url: str, fields: dict[str, Any], param: str, words: str
) -> None:
    r = _chat(url, **fields)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert error["message"].endswith(".") and error["message"].count(". ") == 0 and "Traceback" not in r.text


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_ignore_eos_generates_max_tokens_past_eos(url: str, endpoint: str) -> None:
    def ask(**fields: Any) -> dict[str, Any]:
        if endpoint == "chat":
            return _chat(url, max_completion_tokens=6, **fields).json()
        body = {"prompt": RENDERED, "max_tokens": 6, **fields}
        return httpx.post(f"{url}/v1/completions", json=body, timeout=30).json()

    def text(doc: dict[str, Any]) -> str:
        choice = doc["choices"][0]
        return str(choice["message"]["content"] if endpoint == "chat" else choice["text"])

    plain, forced = ask(), ask(ignore_eos=True)
    assert (text(plain), plain["choices"][0]["finish_reason"], plain["usage"]["completion_tokens"]) == (
        "\x0b\x0c\r",
        "stop",
        4,  # 11, 12, 13, EOS
    )
    assert forced["choices"][0]["finish_reason"] == "length" and forced["usage"]["completion_tokens"] == 6
    assert text(forced) == "\x0b\x0c\r\x02\x03"  # EOS (not text), then on from EOS + 1 = 258 = 2 mod 256


def test_continuous_usage_stats_puts_the_usage_so_far_in_every_chunk(url: str) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    r = _chat(url, stream=True, stream_options=options, max_tokens=3)
    events = _events(r)
    usages = [e["usage"] for e in events]
    prompt = len(RENDERED.encode())
    assert all(
        u["prompt_tokens"] == prompt and u["total_tokens"] == prompt + u["completion_tokens"] for u in usages
    )
    generated = [u["completion_tokens"] for u in usages]
    assert generated == sorted(generated) and generated[0] == 0 and generated[-1] == 3
    assert events[-1]["choices"] == []  # include_usage's last chunk, as without continuous usage
    plain = _events(_chat(url, stream=True, stream_options={"include_usage": True}, max_tokens=3))
    assert [e for e in plain if "usage" in e] == [plain[-1]]


# --- paths ---------------------------------------------------------------------------------------


def test_health_and_models_answer_as_clients_probe_them(url: str) -> None:
    assert httpx.get(f"{url}/health").status_code == 200  # vLLM's name, which GuideLLM probes
    assert httpx.get(f"{url}/healthz").status_code == 200
    models = httpx.get(f"{url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    assert httpx.get(f"{url}/v1/models/tiny").json()["id"] == "tiny"


@pytest.mark.parametrize(
    ("method", "path"), [("POST", "/v1/responses"), ("POST", "/v1/embeddings"), ("GET", "/v1")]
)
def test_a_path_not_served_is_a_404_listing_those_that_are(url: str, method: str, path: str) -> None:
    r = httpx.request(method, f"{url}{path}", json={})
    assert r.status_code == 404
    message = r.json()["error"]["message"]
    assert message.startswith(f"there is no endpoint {method} {path} here")
    assert all(endpoint in message for endpoint in ENDPOINTS)


def test_the_sdk_can_send_back_the_message_it_was_answered_with(url: str) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "a"}]
    first = client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
    messages += [first.choices[0].message, {"role": "user", "content": "b"}]  # as the SDK's docs do
    second = client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
    assert second.usage is not None
    assert second.usage.prompt_tokens == len(
        "<|user|>\na\n<|assistant|>\n\x0b\x0c\n<|user|>\nb\n<|assistant|>\n"
    )
    dumped = {"role": "assistant", "content": "x", "refusal": None, "tool_calls": [], "annotations": []}
    assert _chat(url, messages=[*USER, dumped, *USER], max_tokens=1).status_code == 200
    tool_call = {"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]}
    refused = _chat(url, messages=[*USER, tool_call, *USER], max_tokens=1)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "messages[1].tool_calls"


# --- one pipeline: chat counted exactly as the completion of its rendered prompt ----------------


def _series(service: CompletionService) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the engine's metrics but the latencies' values (their counts stay)."""
    out = {}
    for family in text_string_to_metric_families(service.metrics.render().decode()):
        for sample in family.samples:
            timing = "seconds" in sample.name and not sample.name.endswith("_count")
            if not timing:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _delta(after: dict[Any, float], before: dict[Any, float]) -> dict[Any, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def test_a_chat_request_is_counted_and_traced_as_the_completion_of_its_rendered_prompt() -> None:
    server, service = _serve(EosAfterReturn())
    try:
        assert service.trace is not None
        service.trace.drain()
        rendered = render_chat(service.tokenizer.chat_format, chat_messages(USER))  # type: ignore[attr-defined]
        assert rendered == RENDERED
        deltas, traces = [], []
        for send in (
            lambda: httpx.post(f"{server.url}/v1/completions", json={"prompt": rendered, "max_tokens": 3}),
            lambda: _chat(server.url, max_tokens=3),
            lambda: httpx.post(
                f"{server.url}/v1/completions", json={"prompt": rendered, "max_tokens": 3, "stream": True}
            ),
            lambda: _chat(server.url, max_tokens=3, stream=True),
        ):
            before = _series(service)
            assert send().status_code == 200
            deltas.append(_delta(_series(service), before))
            traces.append([(t.inputTokens, t.outputTokens) for t in service.trace.drain()])
        assert deltas[0] == deltas[1] == deltas[2] == deltas[3], deltas
        assert deltas[0][("polymorph_prompt_tokens_total", (("build", BUILD), ("model_deployment", "tiny-md"), ("track", "stable")))] == len(rendered)  # fmt: skip
        assert traces == [[(len(rendered), 3)]] * 4  # shapes only: lengths, never the text
        # Refused alike: a bad field is counted invalid under the same reason on both endpoints.
        before = _series(service)
        assert _chat(server.url, top_k=3).status_code == 400
        chat_refusal = _delta(_series(service), before)
        before = _series(service)
        assert httpx.post(f"{server.url}/v1/completions", json={"prompt": "a", "top_k": 3}).status_code == 400
        assert _delta(_series(service), before) == chat_refusal != {}
    finally:
        server.close()
        service.close(grace_s=1)


def test_admission_refuses_chat_as_it_refuses_completions() -> None:
    hotpath = EosAfterReturn()
    hotpath.gate = threading.Event()
    server, service = _serve(hotpath, max_batch=1, max_queue=0)
    try:
        held = threading.Thread(
            target=lambda: httpx.post(f"{server.url}/v1/completions", json={"prompt": "a"}, timeout=30)
        )
        held.start()
        for _ in range(200):  # the held request is admitted (its prefill waits at the gate)
            if service.in_flight:
                break
            threading.Event().wait(0.01)
        assert service.in_flight == 1
        refused = [
            _chat(server.url, max_tokens=2),
            httpx.post(f"{server.url}/v1/completions", json={"prompt": "a", "max_tokens": 2}),
        ]
        for r in refused:
            assert r.status_code == 503 and r.headers["Retry-After"] == "1"
            assert r.json()["error"]["code"] == "overloaded"
        assert service.metrics.count("error", "overloaded") == 2
        hotpath.gate.set()
        held.join(timeout=30)
        assert service.metrics.count("ok") == 1
    finally:
        hotpath.gate.set()
        server.close()
        service.close(grace_s=1)


def test_no_series_tells_the_endpoints_apart(served: tuple[EngineServer, CompletionService]) -> None:
    """The canary's analysis and the traffic profile query these series by deployment, track and
    pod (``polymorph.core.promql``): with no endpoint label, chat is in every query a completion is."""
    server, service = served
    assert _chat(server.url, max_tokens=1).status_code == 200
    assert (
        httpx.post(f"{server.url}/v1/completions", json={"prompt": "a", "max_tokens": 1}).status_code == 200
    )
    families = list(text_string_to_metric_families(service.metrics.render().decode()))
    labels = {label for family in families for sample in family.samples for label in sample.labels}
    assert labels >= {"build", "model_deployment", "track", "status"}, labels
    assert not labels & {"endpoint", "path", "route", "handler", "api"}, labels
