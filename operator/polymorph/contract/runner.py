"""The seam between the compile loop and an engine: the ``Runner`` protocol, and its HTTP client.

``Runner`` is the one definition of "something that runs one build through verification and
benchmark and returns its ``ExperimentRecord``". It is implemented by the engine's
``Supervisor`` (a supervised local worker), its ``InProcessRunner`` (tests, trusted builds) and
``RemoteRunner`` here, which drives a sandbox engine's admin API over loopback HTTP (server side:
``polymorph_engine.sandbox.admin``).

``run(build_dir, against=baseline_dir)`` asks for a paired, interleaved benchmark against that
baseline build in the same engine (the record's ``comparison``); without ``against`` the build is
measured alone. ``RemoteRunner.run(build_dir)`` archives the directory with
``polymorph.contract.store.archive_build`` and POSTs it, with the baseline's archive as ``against`` when
pairing. Like the Supervisor it never raises for a bad experiment: an unreachable or failing
engine becomes a ``crashed`` record and a timeout a ``timeout`` record.

It knows nothing about agents, models or torch: it moves archives and records.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from polymorph.contract.api import ExperimentRecord
from polymorph.contract.api.build import Timings
from polymorph.contract.store import archive_build, build_id

__all__ = ["BASELINE_TIMEOUTS", "RemoteRunner", "Runner", "baseline_timeout"]

BASELINE_TIMEOUTS = 4
"""A campaign's baseline experiment (the base build measured alone, once) may take this many
experiment timeouts. Nothing can be compared without it, and on an accelerator the reference
build can be tens of times slower than a fused one: on qwen3-30b-a3b (H200, the default chat
workload) its experts' loop reads about 11.5 tok/s, and filling its caches and measuring it took
over a minute, against a 30 s timeout. A candidate paired with it may take the timeout plus the
seconds the baseline took measured alone (the engine's supervisor): only the
candidate's own share is held to the timeout."""


def baseline_timeout(experiment_timeout: float) -> float:
    """Seconds a campaign's baseline experiment may take under ``experiment_timeout``."""
    return BASELINE_TIMEOUTS * experiment_timeout


JsonValue = dict[str, object] | list[object] | str | int | float | bool | None
"""A parsed JSON document."""


class Runner(Protocol):
    """Runs one build through verification and benchmark; never raises for a bad build.

    With ``against``, the benchmark is paired with that build (loaded beside it, ABBA passes).
    With ``screen``, it follows the short screening protocol (fewer pairs, a wider target
    interval): for ranking many candidates cheaply, never for the final verdict.
    """

    def run(
        self, build_dir: Path, *, description: str = "", against: Path | None = None, screen: bool = False
    ) -> ExperimentRecord: ...


class RemoteRunner:
    """A ``Runner`` that runs each build in a sandbox engine through its admin API."""

    def __init__(self, base_url: str, timeout: float = 900.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = float(timeout)

    def _request(
        self, method: str, path: str, doc: Mapping[str, str | bool] | None, timeout: float
    ) -> tuple[int, JsonValue]:
        data = None if doc is None else json.dumps(doc).encode()
        req = urllib.request.Request(
            self.base_url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return int(resp.status), json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            try:
                return int(exc.code), json.loads(exc.read() or b"null")
            except json.JSONDecodeError:
                return int(exc.code), None

    def wait_ready(self, timeout: float = 600.0, interval: float = 0.5) -> None:
        """Block until ``/readyz`` answers 200; raise ``TimeoutError`` (one sentence) after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self._request("GET", "/readyz", None, timeout=5)[0] == 200:
                    return
            except (OSError, ValueError):
                pass
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"the sandbox engine at {self.base_url} was not ready within {timeout:g} s"
                )
            time.sleep(interval)

    def load_build(self, build_dir: Path) -> str:
        """Make ``build_dir`` the sandbox's current build; its id. Raises ``RuntimeError`` if refused."""
        body = {"archive": base64.b64encode(archive_build(Path(build_dir))).decode()}
        status, doc = self._request("POST", "/admin/builds/load", body, self.timeout)
        if status != 200 or not isinstance(doc, dict):
            raise RuntimeError(f"the sandbox engine refused build {build_dir}: {_message(doc, status)}")
        return str(doc["build"])

    def run(
        self, build_dir: Path, *, description: str = "", against: Path | None = None, screen: bool = False
    ) -> ExperimentRecord:
        build_dir = Path(build_dir)
        started = time.monotonic()
        ident = build_id(build_dir)
        body: dict[str, str | bool] = {
            "archive": base64.b64encode(archive_build(build_dir)).decode(),
            "id": ident,
            "description": description,
            "screen": screen,
        }
        if against is not None:
            body["against"] = base64.b64encode(archive_build(Path(against))).decode()
            body["againstId"] = build_id(Path(against))
        try:
            status, doc = self._request("POST", "/admin/experiments", body, self.timeout)
        except (TimeoutError, urllib.error.URLError) as exc:
            if isinstance(exc, TimeoutError) or isinstance(exc.reason, TimeoutError):
                why = f"no answer from {self.base_url} within {self.timeout:g} s"
                return self._record(ident, "timeout", why, description, started)
            why = f"the sandbox engine at {self.base_url} is unreachable: {exc.reason}"
            return self._record(ident, "crashed", why, description, started)
        except (OSError, json.JSONDecodeError) as exc:
            return self._record(
                ident, "crashed", f"the sandbox engine at {self.base_url} failed: {exc}", description, started
            )
        if status != 200:
            return self._record(
                ident,
                "crashed",
                f"the sandbox engine answered {status}: {_message(doc, status)}",
                description,
                started,
            )
        return ExperimentRecord.model_validate(doc)

    @staticmethod
    def _record(build: str, status: str, error: str, description: str, started: float) -> ExperimentRecord:
        return ExperimentRecord.model_validate(
            {
                "build": build,
                "status": status,
                "description": description,
                "error": error,
                "timings": Timings(totalS=time.monotonic() - started).model_dump(),
            }
        )


def _message(doc: JsonValue, status: int) -> str:
    error = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(error, dict):
        return str(error.get("message", status))
    return f"HTTP {status}"
