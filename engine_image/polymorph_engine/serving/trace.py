"""Sampled traffic traces: the shape of requests (lengths and arrival times, never content).

Contract: ``TraceSampler.record(input_tokens, output_tokens, arrival)`` keeps a request's shape
with probability ``sample_rate``; ``drain()`` hands back and forgets what was kept, as
``polymorph.contract.workload.TraceLine`` documents whose ``arrivalS`` is in seconds relative to the first kept request of the
batch. ``encode_trace`` turns records into JSONL lines of ``{"inputTokens", "outputTokens",
"arrivalS"}``, the trace format ``polymorph.contract.workload.parse_trace`` replays, and ``flush_trace`` writes one batch to
the artifact store under ``workloads/<namespace>/<model deployment>/trace-<UTC timestamp>.jsonl``.

It never sees prompt text or token ids, and knows nothing about HTTP or models. The buffer
is bounded: past ``max_records`` the oldest records are dropped (and counted).
"""

from __future__ import annotations

import random
import threading
from collections import deque
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Protocol

from polymorph.contract.store import workload_prefix
from polymorph.contract.workload import TraceLine

__all__ = ["TraceSampler", "encode_trace", "flush_trace", "trace_key"]


class _PutBytes(Protocol):
    def put_bytes(self, key: str, data: bytes) -> None: ...


class TraceSampler:
    """A thread-safe, bounded, seeded Bernoulli sample of request shapes."""

    def __init__(self, sample_rate: float, *, max_records: int = 100_000, seed: int | None = None) -> None:
        if not 0.0 <= sample_rate <= 1.0:
            raise ValueError(f"trace sample rate must be between 0 and 1, got {sample_rate}")
        if max_records < 1:
            raise ValueError(f"max_records must be at least 1, got {max_records}")
        self.sample_rate = sample_rate
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._records: deque[TraceLine] = deque(maxlen=max_records)
        self.seen = 0
        self.kept = 0
        self.dropped = 0

    def record(self, input_tokens: int, output_tokens: int, arrival: float) -> bool:
        """Maybe keep one request's shape (``arrival`` on any monotonic clock, in seconds)."""
        with self._lock:
            self.seen += 1
            if self.sample_rate <= 0.0 or self._rng.random() >= self.sample_rate:
                return False
            if len(self._records) == self._records.maxlen:
                self.dropped += 1
            self._records.append(
                TraceLine(
                    inputTokens=int(input_tokens), outputTokens=int(output_tokens), arrivalS=float(arrival)
                )
            )
            self.kept += 1
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)

    def drain(self) -> list[TraceLine]:
        """Take every kept record, sorted by arrival and rebased so the first arrives at 0."""
        with self._lock:
            records = sorted(self._records, key=lambda r: r.arrivalS)
            self._records.clear()
        if not records:
            return []
        t0 = records[0].arrivalS
        return [
            TraceLine(
                inputTokens=r.inputTokens, outputTokens=r.outputTokens, arrivalS=round(r.arrivalS - t0, 6)
            )
            for r in records
        ]


def encode_trace(records: Sequence[TraceLine]) -> bytes:
    """JSONL, one ``{"inputTokens", "outputTokens", "arrivalS"}`` object per line."""
    return "".join(r.encode() + "\n" for r in records).encode()


def trace_key(namespace: str, model_deployment: str, when: datetime) -> str:
    """The store key of a trace flushed at ``when``: ``workloads/<ns>/<md>/trace-<UTC ts>.jsonl``."""
    stamp = when.astimezone(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    return f"{workload_prefix(namespace, model_deployment)}trace-{stamp}.jsonl"


def flush_trace(
    sampler: TraceSampler,
    store: _PutBytes,
    namespace: str,
    model_deployment: str,
    when: datetime | None = None,
) -> str | None:
    """Write what ``sampler`` kept to ``store`` as one new object; its key, or None if nothing was kept."""
    records = sampler.drain()
    if not records:
        return None
    key = trace_key(namespace, model_deployment, when or datetime.now(UTC))
    store.put_bytes(key, encode_trace(records))
    return key
