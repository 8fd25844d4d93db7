"""A traffic generator for the e2e: OpenAI chat completions to a Service's ready pods, in a workload
shape that can be shifted while it runs.

``Traffic(endpoints, shape)`` runs ``shape.concurrency`` closed-loop clients. Each picks the next
ready pod round-robin from ``endpoints()`` (what a Service with the deployment's selector routes
to: both tracks, so the replica ratio is the traffic split, as in the product), sends
``POST /v1/chat/completions``, as clients do, with one user message and ``max_completion_tokens``
from ``shape.output``, then pauses ``shape.think_s``. A prompt's length drawn from ``shape.prompt``
is its rendered length, what the engine counts (the served tiny shapes' default chat template
adds ``TEMPLATE_TOKENS`` around the message), so the traffic profile the operator derives has the
shape's prompt lengths; a length at or below ``TEMPLATE_TOKENS`` is sent as a one-letter message. ``shift(shape)`` changes the shape for every
client from its next request on. ``stats()`` gives per-track request, error and token counts, for
the story the demo prints (the split by replicas is visible in them).

It knows nothing about Kubernetes or the operator: it only sends requests where it is told.
"""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from polymorph_engine.runtime.tokenizer import ByteTokenizer
from polymorph_engine.serving.chat import chat_messages, render_chat
from support.local_pods import Endpoint

__all__ = ["TEMPLATE_TOKENS", "Shape", "TrackStats", "Traffic"]

TRACK = "polymorph.dev/track"
_WORDS = "abcdefghijklmnopqrstuvwxyz "  # prompts of random letters: one byte-level token each
_CHAT = ByteTokenizer().chat_format
assert _CHAT is not None
TEMPLATE_TOKENS = len(render_chat(_CHAT, chat_messages([{"role": "user", "content": ""}])).encode())
"""Tokens the served shapes' chat template renders around one user message (byte tokenizer)."""


@dataclass(frozen=True)
class Shape:
    """A workload shape: token ranges (inclusive), clients in flight and their pause between requests."""

    name: str
    prompt: tuple[int, int]
    output: tuple[int, int]
    concurrency: int
    think_s: float = 0.2

    def eased(self, think_s: float = 3.0) -> Shape:
        """The same shape at a trickle: one client, a long pause between its requests."""
        return Shape(f"{self.name}, eased off", self.prompt, self.output, 1, think_s)

    def describe(self) -> str:
        return (
            f"{self.name}: prompts {self.prompt[0]}-{self.prompt[1]} tokens, "
            f"outputs {self.output[0]}-{self.output[1]} tokens, {self.concurrency} clients"
        )


@dataclass
class TrackStats:
    requests: int = 0
    errors: int = 0
    tokens: int = 0


class Traffic:
    """Closed-loop chat clients over a Service's ready endpoints; see the module docstring."""

    def __init__(self, endpoints: Callable[[], list[Endpoint]], shape: Shape, seed: int = 0) -> None:
        self.endpoints = endpoints
        self.shape = shape
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._next = 0
        self._stats: dict[str, TrackStats] = defaultdict(TrackStats)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._workers = 0

    def start(self) -> Traffic:
        self._grow()
        return self

    def _grow(self) -> None:
        while self._workers < self.shape.concurrency:
            t = threading.Thread(target=self._client, args=(self._workers,), daemon=True)
            self._workers += 1
            self._threads.append(t)
            t.start()

    def shift(self, shape: Shape) -> None:
        """From each client's next request on, send ``shape`` (clients beyond its concurrency idle)."""
        self.shape = shape
        self._grow()

    def _pick(self) -> tuple[Endpoint | None, str, int]:
        with self._lock:
            ready = sorted(self.endpoints(), key=lambda e: e.pod)
            shape = self.shape
            length = max(1, self._rng.randint(*shape.prompt) - TEMPLATE_TOKENS)  # the message's
            prompt = "".join(self._rng.choices(_WORDS, k=length))
            output = self._rng.randint(*shape.output)
            if not ready:
                return None, prompt, output
            self._next += 1
            return ready[self._next % len(ready)], prompt, output

    def _client(self, number: int) -> None:
        with httpx.Client(timeout=60) as http:
            while not self._stop.is_set():
                if number >= self.shape.concurrency:
                    self._stop.wait(0.2)
                    continue
                endpoint, prompt, output = self._pick()
                if endpoint is None:
                    self._stop.wait(0.2)
                    continue
                track = endpoint.labels.get(TRACK, "")
                try:
                    r = http.post(
                        f"{endpoint.url}/v1/chat/completions",
                        json={
                            "messages": [{"role": "user", "content": prompt}],
                            "max_completion_tokens": output,
                        },
                    )
                    ok = r.status_code == 200
                    tokens = int(r.json()["usage"]["completion_tokens"]) if ok else 0
                except (httpx.HTTPError, ValueError, KeyError):
                    ok, tokens = False, 0  # a pod going away mid-request, as during a rollout
                with self._lock:
                    s = self._stats[track]
                    s.requests += 1
                    s.errors += 0 if ok else 1
                    s.tokens += tokens
                self._stop.wait(self.shape.think_s)

    def stats(self) -> dict[str, TrackStats]:
        with self._lock:
            return {k: TrackStats(v.requests, v.errors, v.tokens) for k, v in self._stats.items()}

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=65)
