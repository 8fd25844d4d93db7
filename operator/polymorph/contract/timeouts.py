"""How long any call out of the process may wait, and how often it is tried: one table, every client.

Every client of something outside the process reads its limits here, never a literal of its own:
the artifact store's S3 client (``polymorph.contract.store.s3``), Prometheus
(``polymorph.clients.prometheus``), the Kubernetes API (``polymorph.clients.kube`` and kopf's
settings in ``polymorph.handlers.registry``) and Anthropic (``polymorph.compile.agents.claude``).

- ``connect_s`` bounds opening the connection, ``read_s`` each wait for bytes on it (not the whole
  transfer: a large upload that keeps moving is not cut), and ``attempts`` counts every try,
  the first included. So a server that accepts connections and never answers costs at most
  ``attempts * (connect_s + read_s)`` plus the clients' short back-off between tries.
- ``PROBE`` is the start-up check of each server (``polymorph operator``, ``polymorph compile``):
  one try, a few seconds, so a server that does not answer is one sentence at once, naming it.

The engine's own HTTP calls (``polymorph.contract.runner``) are bounded by the experiment timeout
of the campaign instead: how long a build may take is the user's setting, not a network limit.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ANTHROPIC", "KUBE", "KUBE_WATCH", "PROBE", "PROMETHEUS", "S3", "WATCH_SERVER_S", "Limits"]


@dataclass(frozen=True)
class Limits:
    """Connect and read timeouts in seconds, and the number of tries (the first included)."""

    connect_s: float
    read_s: float
    attempts: int

    def __post_init__(self) -> None:
        if self.connect_s <= 0 or self.read_s <= 0 or self.attempts < 1:
            raise ValueError(f"limits need positive timeouts and at least one try, not {self}")

    @property
    def retries(self) -> int:
        """Tries after the first (what urllib3, requests and the Anthropic SDK count)."""
        return self.attempts - 1

    @property
    def worst_s(self) -> float:
        """The longest a server that accepts and never answers can hold one call (back-off aside)."""
        return self.attempts * (self.connect_s + self.read_s)


PROBE = Limits(connect_s=5.0, read_s=5.0, attempts=1)
"""A start-up check: one try; a server that does not answer in 5 s is reported at once."""

S3 = Limits(connect_s=5.0, read_s=30.0, attempts=3)
"""The artifact store: builds, ledgers and reports. A hung endpoint fails a call in about 105 s."""

PROMETHEUS = Limits(connect_s=5.0, read_s=10.0, attempts=2)
"""One instant query; a cycle without an answer makes no decision and the next one asks again."""

KUBE = Limits(connect_s=5.0, read_s=30.0, attempts=2)
"""One REST call to the API server (the operator's handlers and the kubectl plugin)."""

KUBE_WATCH = Limits(connect_s=5.0, read_s=60.0, attempts=6)
"""kopf's own calls: ``read_s`` bounds each request but a watch (which the server ends after
``WATCH_SERVER_S``); a failed call is tried ``attempts`` times in all, then kopf reports it."""

WATCH_SERVER_S = 300
"""How long the API server keeps one watch open before the operator opens the next."""

ANTHROPIC = Limits(connect_s=10.0, read_s=300.0, attempts=5)
"""One Messages API call: a long answer streams no bytes until it is whole, hence the long read."""
