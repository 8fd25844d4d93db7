"""What the engine thread tells one request: a token, the finish, or a failure.

The engine thread (``service.CompletionService``) calls a request's ``Sink`` with each
``Event``; ``completion.Completion`` reads them on the asyncio loop that admitted the request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from polymorph_engine.runtime.scheduler import TokenLogprob

__all__ = ["Event", "Failed", "Finished", "Sink", "Token"]


@dataclass(frozen=True)
class Token:
    token: int
    at: float
    logprob: TokenLogprob | None = None
    """Its log probability and the most likely tokens', when the request asked for them."""


@dataclass(frozen=True)
class Finished:
    reason: str  # the scheduler's finish reason
    at: float


@dataclass(frozen=True)
class Failed:
    message: str
    reason: str  # the reason label the request is counted under


Event = Token | Finished | Failed
Sink = Callable[[Event], None]
