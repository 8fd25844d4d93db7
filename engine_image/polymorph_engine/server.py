"""The engine's HTTP server: OpenAI-compatible completions over one hot path, plus probes and metrics.

Contract:
- ``CompletionService`` owns one ``Scheduler`` over a ``HotPath`` and a single background
  thread that drives it (continuous batching: requests join and leave the running batch
  between decode steps). HTTP threads never touch the scheduler; they hand ``_Job``s to the
  driver through a queue and read tokens back from a per-job queue.
- ``make_server(service, host, port, admin=None)`` binds a ``ThreadingHTTPServer`` with routes
  ``POST /v1/completions`` (plain and SSE streaming ending ``data: [DONE]``), ``GET /v1/models``,
  ``GET /healthz``, ``GET /readyz`` and ``GET /metrics``. Paths under ``/admin/`` are answered
  by ``admin`` (sandbox mode) and are 404 when it is None (serve mode).
- Decoding is always greedy: ``temperature``, ``top_p`` and similar sampling fields are accepted
  and ignored. ``n`` must be 1; ``logprobs`` and ``echo`` are not supported. ``prompt`` is a
  string (tokenised) or a list of token ids (or a one-element list of either); ``max_tokens``
  defaults to 16; ``stop`` is a string or up to 4 strings.
- Bad requests get 400 with an OpenAI-shaped JSON error naming the field (``param``).
- Metrics (``polymorph_engine.metrics``) and the traffic trace (``polymorph_engine.trace``)
  see every finished request; the trace keeps lengths and timing, never content.

It knows nothing about how a build computes, where weights come from or how a build was
fetched: ``server_cli`` assembles those and hands in a ready hot path.
"""

from __future__ import annotations

import itertools
import json
import queue
import threading
import time
import uuid
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, Protocol

from polymorph_engine.metrics import CONTENT_TYPE_LATEST, RequestObservation, ServerMetrics
from polymorph_engine.trace import TraceSampler

__all__ = [
    "AdminRoutes",
    "CompletionParams",
    "CompletionService",
    "EngineHTTPServer",
    "RequestError",
    "TextTokenizer",
    "make_server",
    "parse_completion_request",
    "stop_scan",
]

DEFAULT_MAX_TOKENS = 16
MAX_STOP_SEQUENCES = 4
MAX_BODY_BYTES = 64 * 1024 * 1024  # admin calls carry build archives
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


# --- pure request handling -------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_completion_request(
    body: bytes,
    *,
    tokenizer: TextTokenizer,
    vocab_size: int,
    max_seq_len: int,
    model_names: Sequence[str],
) -> CompletionParams:
    """Validate an OpenAI ``/v1/completions`` body; raise ``RequestError`` naming the bad field."""
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON ({exc}).") from None
    if not isinstance(doc, dict):
        raise RequestError("the request body must be a JSON object.")
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


# --- the engine thread -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Token:
    token: int
    at: float


@dataclass(frozen=True)
class _Finished:
    reason: str  # the scheduler's finish reason
    at: float


@dataclass(frozen=True)
class _Failed:
    message: str


_Event = _Token | _Finished | _Failed


@dataclass(eq=False)
class _Job:
    request: Any  # scheduler.Request
    events: queue.Queue[_Event] = field(default_factory=queue.Queue)


@dataclass(frozen=True)
class _Swap:
    hotpath: Any
    build_id: str
    done: threading.Event


class CompletionService:
    """One scheduler over one hot path, driven by one background thread (continuous batching).

    ``submit(prompt_ids, max_tokens)`` returns a job whose event queue yields ``_Token``s, then
    one ``_Finished`` (or a ``_Failed`` if the hot path raised). ``cancel(job)`` stops a job
    early (stop string hit, client gone). ``swap(hotpath, build_id)`` waits for the running
    batch to drain, then serves later requests with the new hot path. ``close()`` stops
    admitting, lets running requests finish for up to ``grace_s``, then stops the thread.
    """

    def __init__(
        self,
        hotpath: Any,
        *,
        build_id: str,
        tokenizer: TextTokenizer,
        vocab_size: int,
        eos_id: int | None,
        max_batch: int,
        max_seq_len: int,
        model_names: Sequence[str],
        metrics: ServerMetrics,
        trace: TraceSampler | None = None,
        device: str = "cpu",
    ) -> None:
        from polymorph_engine.scheduler import Scheduler  # torch is imported only by services that run

        self._scheduler_cls = Scheduler
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_id = eos_id
        self.max_batch = max_batch
        self.max_seq_len = max_seq_len
        self.model_names = tuple(model_names)
        self.metrics = metrics
        self.trace = trace
        self.device = device
        self.build_id = build_id
        self.created = int(time.time())
        self.peak_batch = 0
        """The most requests ever decoded in one step: evidence of continuous batching."""
        self.steps = 0
        self._hotpath = hotpath
        self._scheduler = Scheduler(hotpath, max_batch, max_seq_len, eos_id, device=device)
        self._inbox: queue.Queue[_Job | _Swap | None] = queue.Queue()
        self._jobs: dict[Any, _Job] = {}
        self._accepting = True
        self._stopping = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="polymorph-engine", daemon=True)
        self._thread.start()

    @property
    def ready(self) -> bool:
        return self._accepting and self._thread.is_alive()

    @property
    def alive(self) -> bool:
        """Whether the engine thread runs (it may be draining while not ``ready``)."""
        return self._thread.is_alive()

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._jobs)

    def submit(self, prompt_ids: Sequence[int], max_tokens: int) -> _Job:
        from polymorph_engine.scheduler import Request

        if not self.ready:
            raise RequestError("the engine is shutting down; retry on another replica.", status=503)
        job = _Job(Request(prompt=list(prompt_ids), max_new_tokens=max_tokens))
        self._inbox.put(job)
        return job

    def cancel(self, job: _Job) -> None:
        self._scheduler.cancel(job.request)

    def swap(self, hotpath: Any, build_id: str, timeout_s: float = 600.0) -> Any:
        """Serve later requests with ``hotpath``; returns the previous hot path (the caller closes it)."""
        previous = self._hotpath
        swap = _Swap(hotpath, build_id, threading.Event())
        self._inbox.put(swap)
        if not swap.done.wait(timeout_s):
            raise TimeoutError(f"the running batch did not drain within {timeout_s:.0f} s")
        return previous

    def close(self, grace_s: float = 30.0) -> None:
        """Stop admitting requests, let running ones finish (up to ``grace_s``), stop the thread."""
        self._accepting = False
        deadline = time.monotonic() + grace_s
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        self._stopping = True
        self._inbox.put(None)
        self._thread.join(timeout=10)
        for job in self._take_all_jobs():
            job.events.put(_Failed("the engine shut down before this request finished."))
        self._scheduler.close()

    # -- engine thread only -----------------------------------------------------------------

    def _take_all_jobs(self) -> list[_Job]:
        with self._lock:
            jobs = list(self._jobs.values())
            self._jobs.clear()
        return jobs

    def _admit(self, item: _Job | _Swap | None, pending: list[_Swap]) -> None:
        if isinstance(item, _Swap):
            pending.append(item)
        elif isinstance(item, _Job):
            try:
                self._scheduler.add(item.request)
            except ValueError as exc:  # validated upstream; never let one request stop the thread
                item.events.put(_Failed(f"the scheduler refused the request: {exc}"))
                return
            with self._lock:
                self._jobs[item.request] = item

    def _run(self) -> None:
        pending: list[_Swap] = []  # swaps wait here until the running batch drains
        held: list[_Job] = []  # jobs that arrived behind a pending swap
        while not self._stopping:
            idle = not self._scheduler.has_work()
            try:
                item = self._inbox.get(timeout=0.05) if idle else self._inbox.get_nowait()
            except queue.Empty:
                item = None
            while item is not None:
                if pending and isinstance(item, _Job):
                    held.append(item)
                else:
                    self._admit(item, pending)
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    item = None
            if pending and not self._scheduler.has_work():
                for swap in pending:
                    self._do_swap(swap)
                pending.clear()
                for job in held:
                    self._admit(job, pending)
                held.clear()
            if self._scheduler.has_work():
                self._step()
            self._sweep(time.monotonic())
        for job in held:
            job.events.put(_Failed("the engine shut down before this request started."))

    def _do_swap(self, swap: _Swap) -> None:
        self._scheduler.close()
        self._scheduler = self._scheduler_cls(
            swap.hotpath, self.max_batch, self.max_seq_len, self.eos_id, device=self.device
        )
        self._hotpath = swap.hotpath
        self.build_id = swap.build_id
        self.metrics.set_build(swap.build_id)
        swap.done.set()

    def _step(self) -> None:
        try:
            batch = self._scheduler.num_running
            events = self._scheduler.step()
        except Exception as exc:  # a build bug must fail its requests, not kill the server
            message = f"the build failed while generating: {type(exc).__name__}: {exc}"
            for job in self._take_all_jobs():
                job.events.put(_Failed(message))
            self._scheduler.close()
            self._scheduler = self._scheduler_cls(
                self._hotpath, self.max_batch, self.max_seq_len, self.eos_id, device=self.device
            )
            return
        self.steps += 1
        self.peak_batch = max(self.peak_batch, batch)
        self.metrics.observe_batch(batch)
        now = time.monotonic()
        with self._lock:
            for request, token in events:
                target = self._jobs.get(request)
                if target is not None:
                    target.events.put(_Token(token, now))

    def _sweep(self, now: float) -> None:
        """Hand finished (or cancelled) requests their last event and forget them."""
        with self._lock:
            for request in [r for r in self._jobs if r.done]:
                job = self._jobs.pop(request)
                job.events.put(_Finished(str(request.finish_reason), now))


# --- one completion, seen from an HTTP thread ------------------------------------------------


@dataclass
class _Outcome:
    completion_tokens: int = 0
    finish_reason: str | None = None


def _generate(
    service: CompletionService, params: CompletionParams, outcome: _Outcome
) -> Generator[str, None, None]:
    """Yield text deltas of one completion; fill ``outcome``; record metrics and trace when done.

    Closing the generator early (the client went away) cancels the request in the scheduler.
    """
    arrival = time.monotonic()
    job = service.submit(params.prompt_ids, params.max_tokens)
    service.metrics.request_started()
    ids: list[int] = []  # generated ids that are text (EOS excluded)
    times: list[float] = []
    sent = 0
    status: Literal["ok", "error", "cancelled"] = "error"
    try:
        while outcome.finish_reason is None:
            event = _next_event(service, job)
            if isinstance(event, _Failed):
                raise RequestError(event.message, status=500, code="engine_error")
            if isinstance(event, _Token):
                times.append(event.at)
                if event.token != service.eos_id:
                    ids.append(event.token)
                if not (params.stream or params.stop):
                    continue  # nothing to show or check before the end: decode once, then
                text = service.tokenizer.decode(ids)
                safe, hit = stop_scan(text, params.stop)
                if hit:
                    service.cancel(job)
                    outcome.finish_reason = "stop"
            else:
                text = service.tokenizer.decode(ids)
                safe, hit = stop_scan(text, params.stop)
                if not hit:
                    safe = len(text)
                outcome.finish_reason = "length" if event.reason == "length" else "stop"
            if safe > sent:
                try:
                    yield text[sent:safe]
                except GeneratorExit:
                    status = "cancelled"
                    raise
                sent = safe
        status = "ok"
    finally:
        if outcome.finish_reason is None:
            service.cancel(job)
        outcome.completion_tokens = len(times)
        ttft = times[0] - arrival if times else None
        itls = [b - a for a, b in itertools.pairwise(times)]
        service.metrics.request_finished(
            RequestObservation(len(params.prompt_ids), len(times), ttft, itls, status)
        )
        if status == "ok" and times and service.trace is not None:
            service.trace.record(len(params.prompt_ids), len(times), arrival)


def _next_event(service: CompletionService, job: _Job) -> _Event:
    while True:
        try:
            return job.events.get(timeout=1.0)
        except queue.Empty:
            if not service.alive:
                return _Failed("the engine thread stopped before this request finished.")


# --- HTTP ------------------------------------------------------------------------------------


class AdminRoutes(Protocol):
    """Sandbox-mode endpoints under ``/admin/``; absent (404) in serve mode."""

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        """Answer one admin call: HTTP status and a JSON-able body. Raise ``RequestError`` to refuse."""
        ...

    def ready(self) -> bool: ...


class EngineHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server holding the completion service and, in sandbox mode, admin routes."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self, address: tuple[str, int], service: CompletionService | None, admin: AdminRoutes | None
    ) -> None:
        super().__init__(address, _Handler)
        self.service = service
        self.admin = admin
        self._thread: threading.Thread | None = None
        self._active = 0
        self._active_lock = threading.Condition()

    def handler_started(self) -> None:
        with self._active_lock:
            self._active += 1

    def handler_finished(self) -> None:
        with self._active_lock:
            self._active -= 1
            self._active_lock.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is being answered (e.g. a stream writing its last events)."""
        with self._active_lock:
            return self._active_lock.wait_for(lambda: self._active == 0, timeout=timeout_s)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        host = self.server_address[0]
        return f"http://{host.decode() if isinstance(host, bytes) else host}:{self.port}"

    def start(self) -> threading.Thread:
        """Serve in a background thread (tests, and callers that own the main thread)."""
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.05}, name="polymorph-http", daemon=True
        )
        self._thread.start()
        return self._thread

    def close(self) -> None:
        """Stop serving and release the socket (the service is closed by its owner)."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=10)
        self.server_close()


def make_server(
    service: CompletionService | None,
    host: str = "127.0.0.1",
    port: int = 8000,
    admin: AdminRoutes | None = None,
) -> EngineHTTPServer:
    """Bind the engine's HTTP server; call ``serve_forever()`` or ``start()`` on the result."""
    return EngineHTTPServer((host, port), service, admin)


class _Handler(BaseHTTPRequestHandler):
    server: EngineHTTPServer
    body: bytes = b""
    protocol_version = "HTTP/1.1"
    server_version = "polymorph-engine"
    timeout = 300  # idle keep-alive connections are dropped after this many seconds

    def log_message(self, format: str, *args: Any) -> None:
        pass  # access logs would drown the engine's own; metrics cover traffic

    # -- plumbing ---------------------------------------------------------------------------

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, doc: Any) -> None:
        self._send(status, json.dumps(doc).encode())

    def _error(self, err: RequestError) -> None:
        self._json(err.status, err.body())

    def _read_body(self) -> bytes:
        """The whole request body, read before any answer so a kept-alive connection stays in sync."""
        length = self.headers.get("Content-Length")
        if length is None and self.command != "POST":
            return b""
        if length is None or not length.isdigit():
            self.close_connection = True  # we cannot tell where this body ends
            raise RequestError(
                "the request needs a Content-Length header (chunked bodies are not supported).", status=411
            )
        if int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            raise RequestError(f"the request body is larger than {MAX_BODY_BYTES} bytes.", status=413)
        return self.rfile.read(int(length))

    def _not_found(self) -> None:
        self._error(
            RequestError(
                f"there is no endpoint {self.command} {self.path} here.", status=404, code="not_found"
            )
        )

    # -- routes -----------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def _route(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        routes: dict[tuple[str, str], Callable[[], None]] = {
            ("GET", "/healthz"): lambda: self._json(200, {"status": "ok"}),
            ("GET", "/readyz"): self._readyz,
            ("GET", "/metrics"): self._metrics,
            ("GET", "/v1/models"): self._models,
            ("POST", "/v1/completions"): self._completions,
        }
        self.server.handler_started()
        try:
            self.body = self._read_body()
            if path.startswith("/admin/") and self.server.admin is not None:
                status, doc = self.server.admin.handle(method, path, self.body)
                self._json(status, doc)
            elif (method, path) in routes:
                routes[(method, path)]()
            elif any(p == path for _, p in routes):
                self._error(RequestError(f"{path} does not accept {method}.", status=405))
            else:
                self._not_found()
        except RequestError as err:
            self._error(err)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            self.server.handler_finished()

    def _service(self) -> CompletionService:
        if self.server.service is None:
            raise RequestError(
                "this engine serves no model (sandbox admin only).", status=404, code="not_found"
            )
        return self.server.service

    def _readyz(self) -> None:
        service, admin = self.server.service, self.server.admin
        ready = (service is None or service.ready) and (admin is None or admin.ready())
        body: dict[str, Any] = {"status": "ready" if ready else "not ready"}
        if service is not None:
            body["build"] = service.build_id
        self._json(200 if ready else 503, body)

    def _metrics(self) -> None:
        self._send(200, self._service().metrics.render(), CONTENT_TYPE_LATEST)

    def _models(self) -> None:
        service = self._service()
        data = [
            {
                "id": name,
                "object": "model",
                "created": service.created,
                "owned_by": "polymorph",
                "build": service.build_id,
            }
            for name in service.model_names
        ]
        self._json(200, {"object": "list", "data": data})

    def _completions(self) -> None:
        service = self._service()
        params = parse_completion_request(
            self.body,
            tokenizer=service.tokenizer,
            vocab_size=service.vocab_size,
            max_seq_len=service.max_seq_len,
            model_names=service.model_names,
        )
        head = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": params.model,
        }
        outcome = _Outcome()
        if params.stream:
            self._stream(service, params, head, outcome)
            return
        text = "".join(_generate(service, params, outcome))
        usage = _usage(params, outcome)
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": outcome.finish_reason}
        self._json(200, {**head, "choices": [choice], "usage": usage})

    def _stream(
        self, service: CompletionService, params: CompletionParams, head: dict[str, Any], outcome: _Outcome
    ) -> None:
        if not service.ready:  # refuse while a status line can still say so
            raise RequestError("the engine is shutting down; retry on another replica.", status=503)
        deltas = _generate(service, params, outcome)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for delta in deltas:
                self._event(
                    {
                        **head,
                        "choices": [{"index": 0, "text": delta, "logprobs": None, "finish_reason": None}],
                    }
                )
            last = {"index": 0, "text": "", "logprobs": None, "finish_reason": outcome.finish_reason}
            self._event({**head, "choices": [last]})
            if params.include_usage:
                self._event({**head, "choices": [], "usage": _usage(params, outcome)})
        except RequestError as err:  # the status line is gone; report in-band, as OpenAI does
            self._event(err.body())
        finally:
            deltas.close()  # cancels the request if the client went away mid-stream
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _event(self, doc: Any) -> None:
        self._chunk(b"data: " + json.dumps(doc).encode() + b"\n\n")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def _usage(params: CompletionParams, outcome: _Outcome) -> dict[str, int]:
    prompt = len(params.prompt_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": outcome.completion_tokens,
        "total_tokens": prompt + outcome.completion_tokens,
    }
