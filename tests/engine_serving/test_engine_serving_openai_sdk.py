"""The engine as clients use it: the official ``openai`` SDK, sync and async, plain and streamed, on
both endpoints; chat rendered with the checkpoint's own template.

Most tests serve an in-process engine over a stand-in hot path whose next token is always
``last + 1`` (mod 256) with the byte tokenizer, so every answer is predictable from the rendered
prompt. The last one writes a tiny checkpoint with a real ChatML template and a byte-level BPE
``tokenizer.json`` and chats with ``polymorph engine serve --model <dir>`` as a process.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import openai
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from polymorph_engine.runtime.checkpoint import load_model, save_checkpoint
from polymorph_engine.runtime.tokenizer import DEFAULT_CHAT_TEMPLATE, ByteTokenizer, ChatFormat, HFTokenizer
from polymorph_engine.serving.chat import chat_messages, render_chat
from polymorph_engine.serving.metrics import ServerMetrics
from polymorph_engine.serving.server import EngineServer, make_server
from polymorph_engine.serving.service import CompletionService
from polymorph_engine.serving.trace import TraceSampler

VOCAB = 512
BUILD = "sha256:" + "cd" * 32
ONE_HOT_LOGPROB = 1.0 - math.log(math.e + VOCAB - 1)  # log softmax of a one-hot 1.0 logit row


class CountingHotPath:
    """Next token = last token + 1 (mod 256)."""

    def new_cache(self, max_batch: int, max_seq_len: int) -> dict[int, int]:
        return {}

    def _logits(self, last: list[int]) -> torch.Tensor:
        logits = torch.zeros(len(last), VOCAB)  # [B, V]
        for row, token in enumerate(last):
            logits[row, (token + 1) % 256] = 1.0
        return logits

    def prefill(self, cache: dict[int, int], slot: int, tokens: torch.Tensor) -> torch.Tensor:
        return self._logits([int(tokens[-1])])[0]

    def decode(self, cache: dict[int, int], slots: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self._logits([int(t) for t in tokens])

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(dim=-1)

    def free(self, cache: dict[int, int], slot: int) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[EngineServer, CompletionService]]:
    service = CompletionService(
        CountingHotPath(),
        build_id=BUILD,
        tokenizer=ByteTokenizer(VOCAB),
        vocab_size=VOCAB,
        eos_id=257,
        max_batch=4,
        max_seq_len=256,
        model_names=["tiny"],
        metrics=ServerMetrics(BUILD, "tiny-md"),
        trace=TraceSampler(1.0, seed=0),
    )
    server = make_server(service, "127.0.0.1", 0)
    server.start()
    yield server, service
    server.close()
    service.close(grace_s=1)


@pytest.fixture
def client(served: tuple[EngineServer, CompletionService]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served[0].url}/v1", api_key="unused", max_retries=0)


def _counting(text: str, n: int) -> str:
    """What the stand-in continues ``text`` with for ``n`` tokens."""
    last = text.encode()[-1]
    return bytes((last + 1 + i) % 256 for i in range(n)).decode("utf-8", errors="replace")


MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": [{"type": "text", "text": "Count "}, {"type": "text", "text": "from a"}]},
]
RENDERED = (
    "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\nHello.\n<|user|>\nCount from a\n<|assistant|>\n"
)


def test_the_default_template_renders_turns_and_the_generation_prompt() -> None:
    chat = ByteTokenizer(VOCAB).chat_format
    assert chat is not None and chat.template == DEFAULT_CHAT_TEMPLATE
    assert render_chat(chat, chat_messages(MESSAGES)) == RENDERED


def test_chat_plain_multi_turn_with_text_parts(
    served: tuple[EngineServer, CompletionService], client: openai.OpenAI
) -> None:
    _, service = served
    seen = service.trace.seen if service.trace else 0
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_completion_tokens=5)  # type: ignore[arg-type]
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == _counting(RENDERED, 5)
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.prompt_tokens == len(RENDERED.encode())  # the rendered length
    assert r.usage.completion_tokens == 5
    assert service.trace is not None and service.trace.seen == seen + 1  # traced as a completion is
    assert r.choices[0].logprobs is None


def test_chat_streamed_role_first_then_deltas_finish_and_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == _counting(RENDERED, 6)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == len(RENDERED.encode())
    assert chunks[-1].usage.completion_tokens == 6


def test_chat_stops_at_the_templates_end_of_turn(served: tuple[EngineServer, CompletionService]) -> None:
    _, service = served
    tokenizer = service.tokenizer
    assert isinstance(tokenizer, ByteTokenizer)
    before = tokenizer.chat_format
    tokenizer.chat_format = ChatFormat("{% for m in messages %}{{ m.content }}{% endfor %}", (257, ord("e")))
    try:
        client = openai.OpenAI(base_url=f"{served[0].url}/v1", api_key="unused", max_retries=0)
        r = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "a"}], max_tokens=20
        )
        assert r.choices[0].message.content == "bcd"  # "e" ends the turn and is not text
        assert r.choices[0].finish_reason == "stop"
        assert r.usage is not None and r.usage.completion_tokens == 4
    finally:
        tokenizer.chat_format = before


def test_n_seed_stop_temperature_and_top_p(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "x"}],
        max_tokens=8,
        n=3,
        seed=7,
        temperature=0.5,
        top_p=0.01,
        stop=["\x0e"],
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    rendered = "<|user|>\nx\n<|assistant|>\n"
    for choice in r.choices:  # a 1% nucleus of a one-hot row is its arg max
        assert choice.message.content == _counting(rendered, 3)  # \x0b\x0c\r, then the stop string
        assert choice.finish_reason == "stop"


def test_chat_logprobs_and_top_logprobs(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "a"}], max_tokens=3, logprobs=True, top_logprobs=2
    )
    lp = r.choices[0].logprobs
    assert lp is not None and lp.content is not None and len(lp.content) == 3
    first = lp.content[0]
    assert first.token == "\x0b" and first.bytes == [11]
    assert first.logprob == pytest.approx(ONE_HOT_LOGPROB, abs=1e-5)
    assert len(first.top_logprobs) == 2 and first.top_logprobs[0].token == "\x0b"


def test_completions_list_of_prompts_n_echo_and_logprobs(client: openai.OpenAI) -> None:
    r = client.completions.create(model="tiny", prompt=["a", "k"], max_tokens=3, n=2, echo=True)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert [c.text for c in r.choices] == ["abcd", "abcd", "klmn", "klmn"]
    assert r.usage is not None and r.usage.prompt_tokens == 2 and r.usage.completion_tokens == 12
    r = client.completions.create(model="tiny", prompt="a", max_tokens=3, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens == ["b", "c", "d"] and lp.text_offset == [0, 1, 2]
    assert lp.token_logprobs is not None and lp.token_logprobs[0] == pytest.approx(ONE_HOT_LOGPROB, abs=1e-5)
    assert lp.top_logprobs is not None and next(iter(lp.top_logprobs[0])) == "b"


def test_completions_streamed_with_echo_and_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model="tiny",
            prompt="a",
            max_tokens=4,
            echo=True,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "abcde"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


def test_models_list_and_retrieve(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"store": True}, "store"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         "messages[0].content[0].type"),
        ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}]}, "messages[0].tool_call_id"),
        ({"messages": []}, "messages"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"n": 0}, "n"),
        ({"max_completion_tokens": 100000}, "max_completion_tokens"),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)  # fmt: skip
def test_what_chat_does_not_implement_is_a_400_naming_the_field(
    client: openai.OpenAI, fields: dict[str, object], param: str
) -> None:
    body: dict[str, object] = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **fields}
    with pytest.raises(openai.BadRequestError) as caught:
        client.post("/chat/completions", body=body, cast_to=httpx.Response)
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == param, error
    assert "Traceback" not in error["message"] and error["message"].endswith(".")


def test_neutral_values_of_unimplemented_fields_are_accepted(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "developer", "content": "d"}, {"role": "user", "content": "a"}],
        max_tokens=1,
        tools=[],
        response_format={"type": "text"},
        store=False,
        presence_penalty=0,
        user="me",
    )
    assert r.choices[0].message.content == _counting("a\n<|assistant|>\n", 1)


def test_a_template_that_raises_is_a_400_quoting_it(served: tuple[EngineServer, CompletionService]) -> None:
    _, service = served
    tokenizer = service.tokenizer
    assert isinstance(tokenizer, ByteTokenizer)
    before = tokenizer.chat_format
    template = "{% if messages[0].role != 'user' %}{{ raise_exception('the first turn must be the user') }}{% endif %}"
    tokenizer.chat_format = ChatFormat(template, (257,))
    try:
        r = httpx.post(
            f"{served[0].url}/v1/chat/completions", json={"messages": [{"role": "assistant", "content": "x"}]}
        )
    finally:
        tokenizer.chat_format = before
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages"
    assert "the first turn must be the user" in r.json()["error"]["message"]


def test_the_async_client_plain_and_streamed_on_both_endpoints(
    served: tuple[EngineServer, CompletionService],
) -> None:
    async def main() -> None:
        async with openai.AsyncOpenAI(
            base_url=f"{served[0].url}/v1", api_key="unused", max_retries=0
        ) as aclient:

            async def chat_stream() -> str:
                stream = await aclient.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": "a"}], max_tokens=4, stream=True
                )
                return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

            async def text_stream() -> str:
                stream = await aclient.completions.create(model="tiny", prompt="a", max_tokens=4, stream=True)
                return "".join([c.choices[0].text async for c in stream if c.choices])

            chat = await aclient.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "a"}], max_tokens=4, n=2
            )
            text = await aclient.completions.create(model="tiny", prompt="a", max_tokens=4)
            streamed_chat, streamed_text = await asyncio.gather(chat_stream(), text_stream())
            expected_chat = _counting("<|user|>\na\n<|assistant|>\n", 4)
            assert [c.message.content for c in chat.choices] == [expected_chat, expected_chat]
            assert streamed_chat == expected_chat
            assert text.choices[0].text == streamed_text == "bcde"

    asyncio.run(main())


def test_chat_requests_are_counted_as_completions(
    served: tuple[EngineServer, CompletionService], client: openai.OpenAI
) -> None:
    _, service = served
    ok = service.metrics.count("ok")
    refused = service.metrics.count("invalid")
    client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a"}], max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "a"}], tools=[{"x": 1}]
        )  # type: ignore[list-item]
    assert service.metrics.count("ok") == ok + 1
    assert service.metrics.count("invalid") == refused + 1


# --- a real checkpoint with a real chat template, served by `polymorph engine serve` ------------

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _chatml_checkpoint(directory: Path) -> HFTokenizer:
    """The tiny shape's weights with a byte-level BPE tokenizer and a ChatML template."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    impl = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    impl.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    impl.decoder = decoders.ByteLevel()
    impl.add_special_tokens(["<|begin|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"])  # 256..259
    tokenizer = HFTokenizer(impl, eos_id=257)
    tokenizer.chat_format = ChatFormat(
        CHATML, (257,), (("eos_token", "<|im_end|>"), ("bos_token", "<|begin|>")), "test"
    )
    save_checkpoint(replace(load_model("tiny"), tokenizer=tokenizer), directory)
    return tokenizer


def test_a_checkpoints_template_and_end_of_turn_tokens_are_read(tmp_path: Path) -> None:
    _chatml_checkpoint(tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["chat_template"] == CHATML
    loaded = load_model(str(tmp_path)).tokenizer
    assert isinstance(loaded, HFTokenizer) and loaded.chat_format is not None
    assert set(loaded.chat_format.end_of_turn_ids) == {257, 259}  # config's EOS, and <|im_end|>
    text = render_chat(loaded.chat_format, chat_messages([{"role": "user", "content": "hi"}]))
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert loaded.encode(text, add_special_tokens=False)[:1] == [258]  # the special token, not its characters
    (tmp_path / "tokenizer_config.json").unlink()
    (tmp_path / "chat_template.jinja").write_text(CHATML)
    assert load_model(str(tmp_path)).tokenizer.chat_format is not None


def test_the_openai_sdk_chats_with_polymorph_engine_serve(tmp_path: Path) -> None:
    tokenizer = _chatml_checkpoint(tmp_path / "ckpt")
    proc = subprocess.Popen(
        [sys.executable, "-m", "polymorph.cli", "engine", "serve", "--port", "0", "--model", str(tmp_path / "ckpt"),
         "--max-seq-len", "256"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        url = None
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            match = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
            url = match.group(1) if match else None
        assert url is not None, "the server did not start"
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]
        r = client.chat.completions.create(model=str(tmp_path / "ckpt"), messages=messages, max_tokens=8)  # type: ignore[arg-type]
        rendered = "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        assert r.usage is not None
        assert r.usage.prompt_tokens == len(tokenizer.encode(rendered, add_special_tokens=False))
        assert r.choices[0].finish_reason in ("stop", "length")
        chunks = list(
            client.chat.completions.create(
                model=str(tmp_path / "ckpt"),
                messages=messages,
                max_tokens=8,
                stream=True,  # type: ignore[arg-type]
            )
        )
        assert (
            "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            == r.choices[0].message.content
        )
    finally:
        proc.terminate()
        proc.wait(timeout=60)
