"""OpenAI ``/v1/completions`` and ``/v1/chat/completions`` request bodies as pydantic models, their
validation, and the error shape.

Contract:
- ``CompletionRequest`` is the wire model of a completions body. It is parsed straight from
  the bytes by pydantic (``model_validate_json``), whose JSON parser bounds nesting depth and
  number size, so a body of 100,000 ``[`` or a 5,000-digit ``max_tokens`` is a 400, never a
  crash. No field is ignored: a field this engine does not know, or one it does not implement
  at a value other than its neutral one (``presence_penalty`` 0, ``best_of`` 1, ...), is a 400
  naming it. A JSON string holding half of a UTF-16 surrogate pair (``"\\ud800"``) is a 400
  saying so.
- ``parse_completion_request(body, ...)`` turns a completions body into its choices (one
  ``CompletionParams`` per sequence to generate: prompt-major, ``n`` per prompt) or raises
  ``RequestError`` naming the offending field (``param``) in one sentence. Decoding is greedy
  unless ``temperature`` > 0 (at most 2): then tokens are sampled, within ``top_p`` (0 < p <= 1)
  and from ``seed`` when given (choice j of a request draws from ``seed + j``;
  ``polymorph_engine.runtime.sampling``). Unlike OpenAI's default of 1, an absent
  ``temperature`` is 0, greedy: what the engine serves is then what verification checked.
  ``n`` is 1 to ``MAX_N`` (``best_of`` must be 1 or n); ``logprobs`` is 0 to ``MAX_LOGPROBS``
  (the chosen token's log probability and that many top ones, from the model's distribution
  before temperature and top_p); ``echo`` puts the prompt before the completion (not with
  logprobs: prompt tokens' log probabilities are not computed); ``suffix``, ``logit_bias``
  and nonzero penalties are not supported; ``user`` is accepted (OpenAI's label for the
  caller; it changes no output). ``prompt`` is a string (tokenised), a list of token ids, or a
  list of up to ``MAX_PROMPTS`` of either; ``max_tokens`` defaults to 16; ``stop`` is a string
  or up to 4 strings.
- On both endpoints: an optional field sent as null is its default, as OpenAI takes it;
  ``stream_options`` (``include_usage``, and vLLM's ``continuous_usage_stats``: the usage so far
  in every chunk) only with ``stream`` true, as OpenAI and vLLM refuse it otherwise. vLLM's
  ``ignore_eos``, which load generators send to get answers of exactly ``max_tokens``, is
  honoured (EOS and the template's end-of-turn ids do not end the answer); its sampling fields
  ``top_k`` (-1 or 0), ``min_p`` (0), ``repetition_penalty`` (1) and ``min_tokens`` (0) are
  accepted at those no-op values and refused at any other.
- ``parse_chat_request(body, render, ...)`` does the same for a chat body: ``messages`` are
  checked and rendered by ``render`` (``serving.chat``), and the rendered text is the prompt
  (its length is the prompt length everywhere); generation also stops at the template's
  end-of-turn ids. ``max_completion_tokens`` (or the older ``max_tokens``; both, unequal, is a
  400) defaults to the rest of the sequence; ``logprobs`` is true or false and ``top_logprobs`` 0 to
  ``MAX_LOGPROBS``. Tools, structured output and the other fields this engine does not
  implement are a 400 naming the field unless they hold their neutral value (``tools: []``,
  ``response_format: {"type": "text"}``, ``store: false``, ...).
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator
from pydantic_core import ErrorDetails

from polymorph_engine.runtime.sampling import MAX_TEMPERATURE, Sampling

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "MAX_LOGPROBS",
    "MAX_N",
    "MAX_PROMPTS",
    "MAX_STOP_SEQUENCES",
    "ChatCompletionRequest",
    "CompletionParams",
    "CompletionRequest",
    "RequestError",
    "StreamOptions",
    "TextTokenizer",
    "parse_body",
    "parse_chat_request",
    "parse_completion_request",
    "stop_scan",
]

DEFAULT_MAX_TOKENS = 16
MAX_STOP_SEQUENCES = 4
MAX_N = 16
"""The most choices one request may ask for (each is a sequence the engine admits)."""
MAX_PROMPTS = 64
"""The most prompts one completions request may carry."""
MAX_LOGPROBS = 20


class TextTokenizer(Protocol):
    """What the server needs of a tokenizer."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...
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


class _NullIsDefault(BaseModel):
    """A body whose optional fields may be sent as null, meaning their default, as OpenAI takes them."""

    @field_validator("*", mode="before")
    @classmethod
    def _null_is_default(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None and info.field_name is not None:
            return cls.model_fields[info.field_name].default
        return value


class StreamOptions(BaseModel):
    """``stream_options``: OpenAI's ``include_usage`` and vLLM's ``continuous_usage_stats``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False
    continuous_usage_stats: bool = False


class CompletionRequest(_NullIsDefault):
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
    ignore_eos: bool = False
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None


class ChatCompletionRequest(_NullIsDefault):
    """The body of ``POST /v1/chat/completions`` as OpenAI defines it (the fields this engine reads).

    ``messages`` is checked by ``serving.chat`` (its sentences name the message and part); the
    fields typed ``Any`` are ones this engine does not implement, refused unless neutral.
    """

    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    messages: Any = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    n: int = 1
    logprobs: bool = False
    top_logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: Any = None
    function_call: Any = None
    response_format: Any = None
    modalities: Any = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    web_search_options: Any = None
    verbosity: Any = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    ignore_eos: bool = False
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None


@dataclass(frozen=True)
class CompletionParams:
    """One validated sequence to generate (a request asks for one or more)."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    model: str
    sampling: Sampling | None = None
    """None: greedy decoding (``temperature`` absent or 0)."""
    stop_ids: tuple[int, ...] = ()
    """Ids that end the turn besides the engine's EOS (a chat template's end-of-turn tokens)."""
    logprobs: int | None = None
    """None: no log probabilities; k: the chosen token's and the k most likely ones'."""
    echo: str | None = None
    """Text that goes before the completion (``echo``: the prompt)."""
    index: int = 0
    """The choice's index in the response."""
    prompt_index: int = 0
    """Which of the request's prompts it continues (usage counts each prompt once)."""
    ignore_eos: bool = False
    """Generate ``max_tokens`` tokens: EOS and the end-of-turn ids do not end it (vLLM's ``ignore_eos``)."""
    continuous_usage: bool = False
    """Each streamed chunk carries the usage so far (vLLM's ``stream_options.continuous_usage_stats``)."""


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
    "n": f"n must be an integer from 1 to {MAX_N}",
    "logprobs": f"logprobs must be an integer from 0 to {MAX_LOGPROBS}",
    "echo": "echo must be true or false",
    "temperature": f"temperature must be a number from 0 to {MAX_TEMPERATURE:g} (0, the default here, is greedy)",
    "top_p": "top_p must be a number > 0 and <= 1",
    "seed": f"seed must be an integer from 0 to {MAX_SEED}",
    "best_of": "best_of must be 1 or equal to n (this engine returns every sequence it generates)",
    "presence_penalty": "presence_penalty is not supported by this engine; leave it out or set it to 0",
    "frequency_penalty": "frequency_penalty is not supported by this engine; leave it out or set it to 0",
    "logit_bias": "logit_bias is not supported by this engine; leave it out",
    "suffix": "suffix is not supported by this engine; leave it out",
    "user": "user must be a string",
    "ignore_eos": "ignore_eos must be true or false",
    "top_k": "top_k is not supported by this engine; leave it out or set it to -1 or 0 (no top-k cut)",
    "min_p": "min_p is not supported by this engine; leave it out or set it to 0",
    "repetition_penalty": "repetition_penalty is not supported by this engine; leave it out or set it to 1",
    "min_tokens": "min_tokens is not supported by this engine; leave it out or set it to 0",
}
_VLLM_FIELDS = ("ignore_eos", "top_k", "min_p", "repetition_penalty", "min_tokens")

_UNSUPPORTED = "is not supported by this engine; leave it out"
_CHAT_WORDS = {
    "model": _FIELD_WORDS["model"],
    "messages": 'messages must be a non-empty list of messages like {"role": "user", "content": "Hi"}',
    "max_tokens": _FIELD_WORDS["max_tokens"],
    "max_completion_tokens": "max_completion_tokens must be a positive integer",
    "stop": _FIELD_WORDS["stop"],
    "stream": _FIELD_WORDS["stream"],
    "stream_options": _FIELD_WORDS["stream_options"],
    "temperature": _FIELD_WORDS["temperature"],
    "top_p": _FIELD_WORDS["top_p"],
    "seed": _FIELD_WORDS["seed"],
    "n": _FIELD_WORDS["n"],
    "logprobs": "logprobs must be true or false",
    "top_logprobs": f"top_logprobs must be an integer from 0 to {MAX_LOGPROBS}, with logprobs true",
    "presence_penalty": _FIELD_WORDS["presence_penalty"],
    "frequency_penalty": _FIELD_WORDS["frequency_penalty"],
    "logit_bias": _FIELD_WORDS["logit_bias"],
    "user": _FIELD_WORDS["user"],
    "store": "store is not supported by this engine (it keeps no completions); leave it out or set it to false",
    "metadata": "metadata must be an object of strings (it is kept only with store, which is not supported)",
    "service_tier": 'service_tier is not supported by this engine; leave it out or set it to "auto"',
    "tools": f"tools {_UNSUPPORTED} (no tool calling)",
    "tool_choice": f'tool_choice {_UNSUPPORTED} or set it to "none" (no tool calling)',
    "parallel_tool_calls": f"parallel_tool_calls {_UNSUPPORTED} (no tool calling)",
    "functions": f"functions {_UNSUPPORTED} (no function calling)",
    "function_call": f'function_call {_UNSUPPORTED} or set it to "none" (no function calling)',
    "response_format": f'response_format {_UNSUPPORTED} or set it to {{"type": "text"}} (no structured output)',
    "modalities": f'modalities {_UNSUPPORTED} or set it to ["text"] (text only)',
    "audio": f"audio {_UNSUPPORTED} (text only)",
    "prediction": f"prediction {_UNSUPPORTED}",
    "reasoning_effort": f"reasoning_effort {_UNSUPPORTED}",
    "web_search_options": f"web_search_options {_UNSUPPORTED}",
    "verbosity": f"verbosity {_UNSUPPORTED}",
    "prompt_cache_key": "prompt_cache_key must be a string",
    "safety_identifier": "safety_identifier must be a string",
    **{field: _FIELD_WORDS[field] for field in _VLLM_FIELDS},
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


def _served_model(requested: str | None, model_names: Sequence[str]) -> str:
    model = requested if requested is not None else model_names[0]
    if model not in model_names:
        raise RequestError(
            f"the model {model[:100]!r} is not served here; use one of: {', '.join(model_names)}.",
            param="model",
            status=404,
            code="model_not_found",
        )
    return model


def _check_length(prompt_ids: Sequence[int], max_seq_len: int, param: str) -> None:
    if len(prompt_ids) >= max_seq_len:
        raise RequestError(
            f"the prompt has {len(prompt_ids)} tokens but this engine holds at most {max_seq_len} tokens per "
            f"sequence, so prompts must be shorter than {max_seq_len} tokens.",
            param=param,
            code="context_length_exceeded",
        )


def _max_tokens(value: int | None, default: int, prompt_len: int, max_seq_len: int, field: str) -> int:
    max_tokens = default if value is None else value
    room = max_seq_len - prompt_len
    if not 1 <= max_tokens <= room:
        raise RequestError(
            f"{field} must be an integer from 1 to {room} for this prompt ({prompt_len} prompt tokens, "
            f"{max_seq_len} tokens per sequence), got {max_tokens}.",
            param=field,
        )
    return max_tokens


def _choice_sampling(sampling: Sampling | None, j: int) -> Sampling | None:
    """Choice ``j``'s sampling: its own seed, so that n seeded choices differ yet repeat."""
    if sampling is None or sampling.seed is None or j == 0:
        return sampling
    return Sampling(
        temperature=sampling.temperature, top_p=sampling.top_p, seed=(sampling.seed + j) % MAX_SEED
    )


def parse_completion_request(
    body: bytes,
    *,
    tokenizer: TextTokenizer,
    vocab_size: int,
    max_seq_len: int,
    model_names: Sequence[str],
) -> tuple[CompletionParams, ...]:
    """Validate an OpenAI ``/v1/completions`` body; raise ``RequestError`` naming the bad field."""
    req = parse_body(CompletionRequest, body, _FIELD_WORDS)
    model = _served_model(req.model, model_names)
    prompts = _prompts(req.prompt, tokenizer, vocab_size)
    for ids, _ in prompts:
        _check_length(ids, max_seq_len, "prompt")
    max_tokens = [
        _max_tokens(req.max_tokens, DEFAULT_MAX_TOKENS, len(ids), max_seq_len, "max_tokens")
        for ids, _ in prompts
    ]
    stop = _stop_strings(req.stop)
    if not 1 <= req.n <= MAX_N:
        raise RequestError(f"{_FIELD_WORDS['n']}, got {str(req.n)[:30]}.", param="n")
    if req.logprobs is not None and not 0 <= req.logprobs <= MAX_LOGPROBS:
        raise RequestError(f"{_FIELD_WORDS['logprobs']}, got {str(req.logprobs)[:30]}.", param="logprobs")
    if req.echo and req.logprobs is not None:
        raise RequestError(
            "echo with logprobs is not supported by this engine (it does not compute the prompt tokens' log "
            "probabilities); leave one of them out.",
            param="echo",
        )
    _refuse_unsupported(req)
    if req.best_of not in (None, 1, req.n):
        raise RequestError(f"{_FIELD_WORDS['best_of']}.", param="best_of")
    include_usage, continuous_usage = _stream_options(req)
    sampling = _sampling(req)
    return tuple(
        CompletionParams(
            tuple(ids),
            max_tokens[p],
            stop,
            req.stream,
            include_usage,
            model,
            _choice_sampling(sampling, j),
            logprobs=req.logprobs,
            echo=text if req.echo else None,
            index=p * req.n + j,
            prompt_index=p,
            ignore_eos=req.ignore_eos,
            continuous_usage=continuous_usage,
        )
        for p, (ids, text) in enumerate(prompts)
        for j in range(req.n)
    )


def parse_chat_request(
    body: bytes,
    *,
    render: Callable[[Any], str],
    tokenizer: TextTokenizer,
    stop_ids: Sequence[int],
    max_seq_len: int,
    model_names: Sequence[str],
) -> tuple[CompletionParams, ...]:
    """Validate an OpenAI ``/v1/chat/completions`` body; ``render`` turns its ``messages`` into the prompt text."""
    req = parse_body(ChatCompletionRequest, body, _CHAT_WORDS)
    model = _served_model(req.model, model_names)
    _refuse_unsupported_chat(req)
    text = render(req.messages)
    prompt_ids = list(tokenizer.encode(text, add_special_tokens=False))
    if not prompt_ids:
        raise RequestError("the messages render to an empty prompt; send some text.", param="messages")
    _check_length(prompt_ids, max_seq_len, "messages")
    room = max_seq_len - len(prompt_ids)
    if (
        None not in (req.max_tokens, req.max_completion_tokens)
        and req.max_tokens != req.max_completion_tokens
    ):
        raise RequestError(
            "max_tokens and max_completion_tokens are the same limit (max_tokens is its older name) and "
            f"differ here ({req.max_tokens} and {req.max_completion_tokens}); send one of them.",
            param="max_tokens",
        )
    field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    max_tokens = _max_tokens(requested, room, len(prompt_ids), max_seq_len, field)
    stop = _stop_strings(req.stop)
    if not 1 <= req.n <= MAX_N:
        raise RequestError(f"{_FIELD_WORDS['n']}, got {str(req.n)[:30]}.", param="n")
    if req.top_logprobs is not None and not (req.logprobs and 0 <= req.top_logprobs <= MAX_LOGPROBS):
        raise RequestError(f"{_CHAT_WORDS['top_logprobs']}.", param="top_logprobs")
    include_usage, continuous_usage = _stream_options(req)
    sampling = _sampling(req)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    return tuple(
        CompletionParams(
            tuple(prompt_ids),
            max_tokens,
            stop,
            req.stream,
            include_usage,
            model,
            _choice_sampling(sampling, j),
            stop_ids=() if req.ignore_eos else tuple(stop_ids),
            logprobs=logprobs,
            index=j,
            ignore_eos=req.ignore_eos,
            continuous_usage=continuous_usage,
        )
        for j in range(req.n)
    )


def _refuse_unsupported_chat(req: ChatCompletionRequest) -> None:
    """A chat field this engine does not implement is refused unless it holds its neutral value."""
    neutral = {
        "presence_penalty": req.presence_penalty in (None, 0),
        "frequency_penalty": req.frequency_penalty in (None, 0),
        "logit_bias": not req.logit_bias,
        "store": not req.store,
        "service_tier": req.service_tier in (None, "auto", "default"),
        "tools": req.tools in (None, []),
        "tool_choice": req.tool_choice in (None, "none") or (req.tool_choice == "auto" and not req.tools),
        "parallel_tool_calls": req.parallel_tool_calls is None or not req.tools,
        "functions": req.functions in (None, []),
        "function_call": req.function_call in (None, "none"),
        "response_format": req.response_format in (None, {"type": "text"}),
        "modalities": req.modalities in (None, ["text"]),
        "audio": req.audio is None,
        "prediction": req.prediction is None,
        "reasoning_effort": req.reasoning_effort is None,
        "web_search_options": req.web_search_options is None,
        "verbosity": req.verbosity is None,
        **_vllm_neutral(req),
    }
    for field, ok in neutral.items():
        if not ok:
            raise RequestError(f"{_CHAT_WORDS[field]}.", param=field)


def _vllm_neutral(req: CompletionRequest | ChatCompletionRequest) -> dict[str, bool]:
    """Whether each of vLLM's sampling fields this engine does not implement holds its neutral value."""
    return {
        "top_k": req.top_k in (None, -1, 0),
        "min_p": req.min_p in (None, 0),
        "repetition_penalty": req.repetition_penalty in (None, 1),
        "min_tokens": req.min_tokens in (None, 0),
    }


def _stream_options(req: CompletionRequest | ChatCompletionRequest) -> tuple[bool, bool]:
    """``(include_usage, continuous_usage_stats)``; either asks for usage, so only with ``stream``."""
    options = req.stream_options
    if options is None:
        return False, False
    if not req.stream:
        raise RequestError(
            "stream_options is only allowed with stream true; leave it out or set stream to true.",
            param="stream_options",
        )
    return options.include_usage, options.continuous_usage_stats


def _sampling(req: CompletionRequest | ChatCompletionRequest) -> Sampling | None:
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
        "presence_penalty": req.presence_penalty in (None, 0),
        "frequency_penalty": req.frequency_penalty in (None, 0),
        "logit_bias": not req.logit_bias,
        "suffix": not req.suffix,
        **_vllm_neutral(req),
    }
    for field, ok in neutral.items():
        if not ok:
            raise RequestError(f"{_FIELD_WORDS[field]}.", param=field)


def _prompts(prompt: Any, tokenizer: TextTokenizer, vocab_size: int) -> list[tuple[list[int], str]]:
    """Each prompt of ``prompt`` as token ids, with its text (for ``echo``)."""
    if prompt is None:
        raise RequestError("prompt is required: a string or a list of token ids.", param="prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) > MAX_PROMPTS:
            raise RequestError(
                f"prompt may hold at most {MAX_PROMPTS} prompts, got {len(prompt)}.", param="prompt"
            )
        return [_prompt_ids(p, tokenizer, vocab_size, f"prompt[{i}]") for i, p in enumerate(prompt)]
    return [_prompt_ids(prompt, tokenizer, vocab_size, "prompt")]


def _prompt_ids(prompt: Any, tokenizer: TextTokenizer, vocab_size: int, where: str) -> tuple[list[int], str]:
    if isinstance(prompt, str):
        ids = list(tokenizer.encode(prompt))
        text = prompt
    else:
        bad = [t for t in prompt if not 0 <= t < vocab_size]
        if bad:
            raise RequestError(
                f"{where} token ids must be from 0 to {vocab_size - 1}, got {bad[0]}.", param="prompt"
            )
        ids = list(prompt)
        text = tokenizer.decode(ids)
    if not ids:
        raise RequestError(f"{where} must not be empty.", param="prompt")
    return ids, text


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
