"""OpenAI ``/v1/completions`` request parsing and validation, and the error shape for refusals.

Contract:
- ``parse_completion_request(body, ...)`` turns a request body into a ``CompletionParams`` or
  raises ``RequestError`` naming the offending field (``param``) in one sentence. Decoding is
  always greedy: ``temperature``, ``top_p`` and similar sampling fields are accepted and
  ignored. ``n`` must be 1; ``logprobs`` and ``echo`` are not supported. ``prompt`` is a string
  (tokenised) or a list of token ids (or a one-element list of either); ``max_tokens`` defaults
  to 16; ``stop`` is a string or up to 4 strings.
- ``RequestError.body()`` is the OpenAI-shaped JSON error; its ``status`` is the HTTP status.
- ``stop_scan(text, stops)`` says how much generated text is safe to emit.

Everything here is pure: it knows nothing about HTTP, threads, the scheduler or how a build
computes. It needs of a tokenizer only ``TextTokenizer``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "MAX_STOP_SEQUENCES",
    "CompletionParams",
    "RequestError",
    "TextTokenizer",
    "json_object",
    "parse_completion_request",
    "stop_scan",
]

DEFAULT_MAX_TOKENS = 16
MAX_STOP_SEQUENCES = 4
_IGNORED_SAMPLING = ("temperature", "top_p", "top_k", "presence_penalty", "frequency_penalty", "seed", "user")


class TextTokenizer(Protocol):
    """What the server needs of a tokenizer."""

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...


class RequestError(Exception):
    """A request the server refuses: HTTP status, one sentence, and the offending field."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class CompletionParams:
    """A validated completion request."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    model: str


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def json_object(body: bytes) -> dict[str, Any]:
    """A request body as a JSON object; ``RequestError`` (a 400) when it is not one."""
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON ({exc}).") from None
    if not isinstance(doc, dict):
        raise RequestError("the request body must be a JSON object.")
    return doc


def parse_completion_request(
    body: bytes,
    *,
    tokenizer: TextTokenizer,
    vocab_size: int,
    max_seq_len: int,
    model_names: Sequence[str],
) -> CompletionParams:
    """Validate an OpenAI ``/v1/completions`` body; raise ``RequestError`` naming the bad field."""
    doc = json_object(body)
    model = doc.get("model", model_names[0])
    if not isinstance(model, str) or model not in model_names:
        raise RequestError(
            f"the model {model!r} is not served here; use one of: {', '.join(model_names)}.",
            param="model",
            status=404,
            code="model_not_found",
        )
    prompt_ids = _prompt_ids(doc, tokenizer, vocab_size)
    if len(prompt_ids) >= max_seq_len:
        raise RequestError(
            f"the prompt has {len(prompt_ids)} tokens but this engine holds at most {max_seq_len} tokens per "
            f"sequence, so prompts must be shorter than {max_seq_len} tokens.",
            param="prompt",
            code="context_length_exceeded",
        )
    max_tokens = doc.get("max_tokens", DEFAULT_MAX_TOKENS)
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    room = max_seq_len - len(prompt_ids)
    if not _is_int(max_tokens) or not 1 <= max_tokens <= room:
        raise RequestError(
            f"max_tokens must be an integer from 1 to {room} for this prompt ({len(prompt_ids)} prompt tokens, "
            f"{max_seq_len} tokens per sequence), got {max_tokens!r}.",
            param="max_tokens",
        )
    stop = _stop_strings(doc.get("stop"))
    stream = doc.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(f"stream must be true or false, got {stream!r}.", param="stream")
    include_usage = False
    options = doc.get("stream_options")
    if options is not None:
        if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
            raise RequestError(
                'stream_options must be an object like {"include_usage": true}.', param="stream_options"
            )
        include_usage = bool(options.get("include_usage", False))
    n = doc.get("n", 1)
    if n != 1 or not _is_int(n):
        raise RequestError(f"n must be 1 (one completion per request), got {n!r}.", param="n")
    if doc.get("logprobs") not in (None, 0):
        raise RequestError("logprobs is not supported by this engine; leave it out.", param="logprobs")
    if doc.get("echo", False) is not False:
        raise RequestError(
            "echo is not supported by this engine; leave it out or set it to false.", param="echo"
        )
    return CompletionParams(tuple(prompt_ids), int(max_tokens), stop, stream, include_usage, model)


def _prompt_ids(doc: dict[str, Any], tokenizer: TextTokenizer, vocab_size: int) -> list[int]:
    if "prompt" not in doc or doc["prompt"] is None:
        raise RequestError("prompt is required: a string or a list of token ids.", param="prompt")
    prompt = doc["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        ids = list(tokenizer.encode(prompt))
    elif isinstance(prompt, list) and all(_is_int(t) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < vocab_size]
        if bad:
            raise RequestError(
                f"prompt token ids must be from 0 to {vocab_size - 1}, got {bad[0]}.", param="prompt"
            )
        ids = list(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        raise RequestError(
            "prompt must be a single prompt; batches of several prompts are not supported.", param="prompt"
        )
    else:
        raise RequestError("prompt must be a string or a list of integer token ids.", param="prompt")
    if not ids:
        raise RequestError("prompt must not be empty.", param="prompt")
    return ids


def _stop_strings(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if (
        not isinstance(stop, list)
        or len(stop) > MAX_STOP_SEQUENCES
        or not all(isinstance(s, str) and s for s in stop)
    ):
        raise RequestError(
            f"stop must be a non-empty string or a list of up to {MAX_STOP_SEQUENCES} non-empty strings.",
            param="stop",
        )
    return tuple(stop)


def stop_scan(text: str, stops: Sequence[str]) -> tuple[int, bool]:
    """How much of ``text`` is safe to emit, and whether a stop string was hit.

    On a hit, the safe length is where the earliest stop string starts (stop strings are
    never emitted). Otherwise it holds back any tail that could still grow into a stop
    string, and a trailing U+FFFD (a multi-byte character split across tokens).
    """
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    if hits:
        return min(hits), True
    safe = len(text)
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                safe = min(safe, len(text) - k)
                break
    while safe > 0 and text[safe - 1] == "\ufffd":
        safe -= 1
    return safe, False
