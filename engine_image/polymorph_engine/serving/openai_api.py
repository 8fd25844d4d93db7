"""OpenAI ``/v1/completions`` request bodies as pydantic models, their validation, and the error shape.

Contract:
- ``CompletionRequest`` is the wire model of a completions body. It is parsed straight from
  the bytes by pydantic (``model_validate_json``), whose JSON parser bounds nesting depth and
  number size, so a body of 100,000 ``[`` or a 5,000-digit ``max_tokens`` is a 400, never a
  crash. No field is ignored: a field this engine does not know, or one it does not implement
  at a value other than its neutral one (``presence_penalty`` 0, ``best_of`` 1, ...), is a 400
  naming it. A JSON string holding half of a UTF-16 surrogate pair (``"\\ud800"``) is a 400
  saying so.
- ``parse_completion_request(body, ...)`` turns a body into a ``CompletionParams`` or raises
  ``RequestError`` naming the offending field (``param``) in one sentence. Decoding is greedy
  unless ``temperature`` > 0 (at most 2): then tokens are sampled, within ``top_p`` (0 < p <= 1)
  and from ``seed`` when given (``polymorph_engine.runtime.sampling``). Unlike OpenAI's default
  of 1, an absent ``temperature`` is 0, greedy: what the engine serves is then what
  verification checked. ``n`` and ``best_of`` must be 1; ``logprobs``, ``echo``, ``suffix``,
  ``logit_bias`` and nonzero penalties are not supported; ``user`` is accepted (OpenAI's label
  for the caller; it changes no output). ``prompt`` is a string
  (tokenised) or a list of token ids (or a one-element list of either); ``max_tokens``
  defaults to 16; ``stop`` is a string or up to 4 strings.
- ``parse_body(model, body)`` does the same for any other body model (the sandbox admin's).
- ``RequestError.body()`` is the OpenAI-shaped JSON error; ``status`` is the HTTP status,
  ``code`` the machine-readable reason (also the ``reason`` label of the request counter) and
  ``retry_after`` the seconds a 503 asks a client to wait; ``counted`` says whether the request
  counter already holds the request (it failed after admission).
- ``stop_scan(text, stops)`` says how much generated text is safe to emit.

Everything here is pure: it knows nothing about HTTP, threads, the scheduler or how a build
computes. It needs of a tokenizer only ``TextTokenizer``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import ErrorDetails

from polymorph_engine.runtime.sampling import MAX_TEMPERATURE, Sampling

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "MAX_STOP_SEQUENCES",
    "CompletionParams",
    "CompletionRequest",
    "RequestError",
    "StreamOptions",
    "TextTokenizer",
    "parse_body",
    "parse_completion_request",
    "stop_scan",
]

DEFAULT_MAX_TOKENS = 16
MAX_STOP_SEQUENCES = 4


class TextTokenizer(Protocol):
    """What the server needs of a tokenizer."""

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...


class RequestError(Exception):
    """A request the server refuses: HTTP status, one sentence, the offending field and a reason code."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        status: int = 400,
        code: str | None = None,
        retry_after: int | None = None,
        counted: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code
        self.retry_after = retry_after
        self.counted = counted
        """Whether the request counter already holds this request (it failed after admission)."""

    @property
    def reason(self) -> str:
        """The ``reason`` label this refusal is counted under."""
        return self.code or ("invalid_request" if self.status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    """``stream_options``: only ``include_usage`` is defined."""

    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class CompletionRequest(BaseModel):
    """The body of ``POST /v1/completions`` as OpenAI defines it (the fields this engine reads)."""

    model_config = ConfigDict(extra="forbid", strict=True)  # no field is accepted and ignored
    model: str | None = None
    prompt: str | list[int] | list[str] | list[list[int]] | None = None
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    n: int = 1
    best_of: int | None = None
    logprobs: int | None = None
    echo: bool = False
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    suffix: str | None = None
    user: str | None = None


@dataclass(frozen=True)
class CompletionParams:
    """A validated completion request."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    model: str
    sampling: Sampling | None = None
    """None: greedy decoding (``temperature`` absent or 0)."""


MAX_SEED = 2**63 - 1
"""The largest ``seed`` (a torch generator takes 64 bits)."""

# What a wrong type in each field means, in words (pydantic's own phrasing names Python types).
_FIELD_WORDS = {
    "model": "model must be a string naming a served model",
    "prompt": "prompt must be a string or a list of integer token ids",
    "max_tokens": "max_tokens must be a positive integer",
    "stop": f"stop must be a non-empty string or a list of up to {MAX_STOP_SEQUENCES} non-empty strings",
    "stream": "stream must be true or false",
    "stream_options": 'stream_options must be an object like {"include_usage": true}',
    "n": "n must be 1 (one completion per request)",
    "logprobs": "logprobs is not supported by this engine; leave it out",
    "echo": "echo is not supported by this engine; leave it out or set it to false",
    "temperature": f"temperature must be a number from 0 to {MAX_TEMPERATURE:g} (0, the default here, is greedy)",
    "top_p": "top_p must be a number > 0 and <= 1",
    "seed": f"seed must be an integer from 0 to {MAX_SEED}",
    "best_of": "best_of must be 1 (one completion per request)",
    "presence_penalty": "presence_penalty is not supported by this engine; leave it out or set it to 0",
    "frequency_penalty": "frequency_penalty is not supported by this engine; leave it out or set it to 0",
    "logit_bias": "logit_bias is not supported by this engine; leave it out",
    "suffix": "suffix is not supported by this engine; leave it out",
    "user": "user must be a string",
}

_Body = TypeVar("_Body", bound=BaseModel)


def _refusal(error: ErrorDetails, words: dict[str, str]) -> RequestError:
    """One pydantic error as a ``RequestError`` naming the top-level field."""
    loc = error["loc"]
    if error["type"] == "json_invalid":
        detail = str((error.get("ctx") or {}).get("error", error["msg"]))
        if "surrogate" in detail or "hex escape" in detail:
            return RequestError(
                f"the request body holds a \\u escape that is half of a UTF-16 surrogate pair ({detail}); "
                "JSON strings must hold whole Unicode characters (a pair such as \\ud83d\\ude00, or the "
                "character itself in UTF-8).",
                code="invalid_unicode",
            )
        if "unicode" in detail:
            return RequestError(
                f"the request body is not valid UTF-8 ({detail}); send JSON encoded as UTF-8.",
                code="invalid_unicode",
            )
        return RequestError(f"the request body is not valid JSON ({detail}).", code="invalid_json")
    if not loc:
        return RequestError("the request body must be a JSON object.", code="invalid_json")
    field = str(loc[0])
    if error["type"] == "extra_forbidden" and len(loc) == 1 and field not in words:
        known = ", ".join(words) if words else "none"
        return RequestError(
            f"{field[:60]!r} is not a field of this request; the fields are: {known}.",
            param=field[:60],
            code="unknown_field",
        )
    text = words.get(field, f"{field} is not valid ({error['msg'].lower()})")
    return RequestError(f"{text}.", param=field)


def parse_body(model: type[_Body], body: bytes, words: dict[str, str] | None = None) -> _Body:
    """``body`` validated into ``model``; ``RequestError`` (a 400 naming the first bad field) if not.

    ``words`` maps a field name to the sentence (without its full stop) that says what it must be.
    """
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise _refusal(exc.errors()[0], words or {}) from None


def parse_completion_request(
    body: bytes,
    *,
    tokenizer: TextTokenizer,
    vocab_size: int,
    max_seq_len: int,
    model_names: Sequence[str],
) -> CompletionParams:
    """Validate an OpenAI ``/v1/completions`` body; raise ``RequestError`` naming the bad field."""
    req = parse_body(CompletionRequest, body, _FIELD_WORDS)
    model = req.model if req.model is not None else model_names[0]
    if model not in model_names:
        raise RequestError(
            f"the model {model[:100]!r} is not served here; use one of: {', '.join(model_names)}.",
            param="model",
            status=404,
            code="model_not_found",
        )
    prompt_ids = _prompt_ids(req.prompt, tokenizer, vocab_size)
    if len(prompt_ids) >= max_seq_len:
        raise RequestError(
            f"the prompt has {len(prompt_ids)} tokens but this engine holds at most {max_seq_len} tokens per "
            f"sequence, so prompts must be shorter than {max_seq_len} tokens.",
            param="prompt",
            code="context_length_exceeded",
        )
    max_tokens = DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
    room = max_seq_len - len(prompt_ids)
    if not 1 <= max_tokens <= room:
        raise RequestError(
            f"max_tokens must be an integer from 1 to {room} for this prompt ({len(prompt_ids)} prompt tokens, "
            f"{max_seq_len} tokens per sequence), got {max_tokens}.",
            param="max_tokens",
        )
    stop = _stop_strings(req.stop)
    if req.n != 1:
        raise RequestError(f"{_FIELD_WORDS['n']}, got {req.n}.", param="n")
    if req.logprobs not in (None, 0):
        raise RequestError(f"{_FIELD_WORDS['logprobs']}.", param="logprobs")
    if req.echo:
        raise RequestError(f"{_FIELD_WORDS['echo']}.", param="echo")
    _refuse_unsupported(req)
    include_usage = req.stream_options is not None and req.stream_options.include_usage
    return CompletionParams(
        tuple(prompt_ids), max_tokens, stop, req.stream, include_usage, model, _sampling(req)
    )


def _sampling(req: CompletionRequest) -> Sampling | None:
    """The request's ``Sampling``, or None for greedy decoding; ``RequestError`` naming a bad field."""
    temperature = 0.0 if req.temperature is None else req.temperature
    if not (math.isfinite(temperature) and 0 <= temperature <= MAX_TEMPERATURE):
        raise RequestError(f"{_FIELD_WORDS['temperature']}, got {temperature:g}.", param="temperature")
    top_p = 1.0 if req.top_p is None else req.top_p
    if not (math.isfinite(top_p) and 0 < top_p <= 1):
        raise RequestError(f"{_FIELD_WORDS['top_p']}, got {top_p:g}.", param="top_p")
    if req.seed is not None and not 0 <= req.seed <= MAX_SEED:
        raise RequestError(f"{_FIELD_WORDS['seed']}, got {str(req.seed)[:30]}.", param="seed")
    if temperature == 0:
        return None  # greedy: the arg max is in every nucleus and needs no seed
    return Sampling(temperature=temperature, top_p=top_p, seed=req.seed)


def _refuse_unsupported(req: CompletionRequest) -> None:
    """A field this engine does not implement is refused unless it holds its neutral value."""
    neutral = {
        "best_of": req.best_of in (None, 1),
        "presence_penalty": req.presence_penalty in (None, 0),
        "frequency_penalty": req.frequency_penalty in (None, 0),
        "logit_bias": not req.logit_bias,
        "suffix": not req.suffix,
    }
    for field, ok in neutral.items():
        if not ok:
            raise RequestError(f"{_FIELD_WORDS[field]}.", param=field)


def _prompt_ids(prompt: Any, tokenizer: TextTokenizer, vocab_size: int) -> list[int]:
    if prompt is None:
        raise RequestError("prompt is required: a string or a list of token ids.", param="prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        raise RequestError(
            "prompt must be a single prompt; batches of several prompts are not supported.", param="prompt"
        )
    if isinstance(prompt, str):
        ids = list(tokenizer.encode(prompt))
    else:
        bad = [t for t in prompt if not 0 <= t < vocab_size]
        if bad:
            raise RequestError(
                f"prompt token ids must be from 0 to {vocab_size - 1}, got {bad[0]}.", param="prompt"
            )
        ids = list(prompt)
    if not ids:
        raise RequestError("prompt must not be empty.", param="prompt")
    return ids


def _stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if len(stops) > MAX_STOP_SEQUENCES or not all(stops):
        raise RequestError(f"{_FIELD_WORDS['stop']}.", param="stop")
    return tuple(stops)


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
