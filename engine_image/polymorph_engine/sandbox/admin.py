"""The sandbox admin API: run experiments and load builds in a sandbox engine, over loopback HTTP.

Contract (server side, ``serve_admin``):
- ``GET /healthz``, ``GET /readyz``;
- ``POST /admin/experiments`` with ``{"archive": <base64 canonical build tar.gz>, "id"?: <build id>,
  "description"?: str}``: the archive is unpacked into a fresh directory under a writable
  scratch folder, its id is computed (and must equal ``id`` when one is sent), the build runs
  through the ``Runner`` (a ``Supervisor``, so a crashing build kills only its worker),
  and the answer is the ``ExperimentRecord`` as JSON. Experiments run one at a time.
- ``POST /admin/builds/load`` with the same body: unpack, verify, hand the directory to the
  optional ``on_load`` hook, and report the build as current;
- ``GET /admin/builds/current``: ``{"build": <id or null>}``;
- ``POST /admin/trace/flush`` (only with a ``flush_trace`` hook): ``{"key": <store key or null>}``.
Bodies are the pydantic ``BuildBody``; bad ones are 400 with an OpenAI-shaped error naming the
field; a runner that raises is a 500; the server itself keeps serving. It is served by the same
aiohttp server as completions (``polymorph_engine.serving.server``) and binds only to a
loopback address.

The client side is ``polymorph.contract.runner.RemoteRunner``, in the trusted package.

It knows nothing about agents, models or the artifact store beyond the canonical archive.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from polymorph.contract.errors import StoreError, UsageError
from polymorph.contract.runner import Runner
from polymorph.contract.store import archive_id, build_id, unpack_build
from polymorph_engine.serving.openai_api import RequestError, parse_body
from polymorph_engine.serving.server import EngineServer, make_server

__all__ = ["BuildBody", "SandboxAdmin", "serve_admin"]


class BuildBody(BaseModel):
    """The body of ``POST /admin/experiments`` and ``POST /admin/builds/load``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    archive: str = Field(min_length=1)
    id: str | None = None
    description: str = ""
    against: str | None = None
    """``POST /admin/experiments`` only: the base64 archive of a build to pair the benchmark with."""
    againstId: str | None = None
    screen: bool = False
    """``POST /admin/experiments`` only: measure by the short screening protocol."""


_BODY_WORDS = {
    "archive": "archive is required: the base64 of a canonical build tar.gz",
    "id": "id must be a build id string (sha256:<64 hex>)",
    "description": "description must be a string",
    "against": "against must be the base64 of a canonical build tar.gz",
    "againstId": "againstId must be a build id string (sha256:<64 hex>)",
    "screen": "screen must be true or false",
}


def _check_loopback(host: str) -> None:
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback and ipaddress.ip_address(host).version == 4
    except ValueError:
        loopback = False
    if not loopback:
        raise UsageError(
            f"the sandbox admin API binds only to a loopback address such as 127.0.0.1 or localhost; got {host!r}."
        )


class SandboxAdmin:
    """The ``AdminRoutes`` of a sandbox engine (see the module contract)."""

    def __init__(
        self,
        runner: Runner,
        workdir: Path | None = None,
        *,
        on_load: Callable[[Path, str], None] | None = None,
        flush_trace: Callable[[], str | None] | None = None,
    ) -> None:
        self.runner = runner
        self.workdir = (
            Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="polymorph-admin-"))
        )
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.on_load = on_load
        self.flush_trace = flush_trace
        self.current: str | None = None
        self.current_dir: Path | None = None
        self.experiments = 0
        self._run_lock = threading.Lock()  # a Supervisor is driven by one thread at a time
        self._counter = 0
        self._counter_lock = threading.Lock()

    def ready(self) -> bool:
        return True

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        routes: dict[tuple[str, str], Callable[[bytes], tuple[int, Any]]] = {
            ("POST", "/admin/experiments"): self._experiment,
            ("POST", "/admin/builds/load"): self._load,
            ("GET", "/admin/builds/current"): lambda _: (200, {"build": self.current}),
        }
        if self.flush_trace is not None:
            flush = self.flush_trace
            routes[("POST", "/admin/trace/flush")] = lambda _: (200, {"key": flush()})
        handler = routes.get((method, path))
        if handler is None:
            if any(p == path for _, p in routes):
                raise RequestError(f"{path} does not accept {method}.", status=405)
            raise RequestError(f"there is no admin endpoint {method} {path}.", status=404, code="not_found")
        return handler(body)

    # -- endpoints ----------------------------------------------------------------------------

    def _experiment(self, body: bytes) -> tuple[int, Any]:
        doc = parse_body(BuildBody, body, _BODY_WORDS)
        build_dir, _ = self._unpack(doc)
        against_dir = None
        if doc.against is not None:
            against_dir, _ = self._unpack(BuildBody(archive=doc.against, id=doc.againstId))
        try:
            with self._run_lock:
                record = self.runner.run(
                    build_dir, description=doc.description, against=against_dir, screen=doc.screen
                )
                self.experiments += 1
        except Exception as exc:
            raise RequestError(
                f"the experiment runner failed: {type(exc).__name__}: {exc}", status=500, code="runner_error"
            ) from None
        finally:
            shutil.rmtree(build_dir, ignore_errors=True)
            if against_dir is not None:
                shutil.rmtree(against_dir, ignore_errors=True)
        return 200, record.model_dump(mode="json")

    def _load(self, body: bytes) -> tuple[int, Any]:
        build_dir, build = self._unpack(parse_body(BuildBody, body, _BODY_WORDS))
        try:
            if self.on_load is not None:
                self.on_load(build_dir, build)
        except Exception as exc:
            shutil.rmtree(build_dir, ignore_errors=True)
            raise RequestError(
                f"loading build {build} failed: {type(exc).__name__}: {exc}", status=500, code="load_failed"
            ) from None
        previous, self.current, self.current_dir = self.current_dir, build, build_dir
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)
        return 200, {"build": build}

    def _unpack(self, doc: BuildBody) -> tuple[Path, str]:
        """Decode, unpack and id-check the archive in ``doc``: the build directory and its id."""
        try:
            data = base64.b64decode(doc.archive, validate=True)
        except (binascii.Error, ValueError):
            raise RequestError("archive is not valid base64.", param="archive") from None
        sent = doc.id
        try:
            computed = archive_id(data)
            if sent is not None and sent != computed:
                raise RequestError(f"the archive hashes to {computed}, not the sent id {sent}.", param="id")
            with self._counter_lock:
                self._counter += 1
                n = self._counter
            dest = self.workdir / f"build-{n:06d}-{computed.removeprefix('sha256:')[:12]}"
            unpack_build(data, dest)
            # The files on disk, not just the bytes received, must be the build that was asked for.
            on_disk = build_id(dest)
        except StoreError as exc:
            raise RequestError(f"archive is not a usable build: {exc}.", param="archive") from None
        if on_disk != computed:
            shutil.rmtree(dest, ignore_errors=True)
            raise RequestError(f"the unpacked build hashes to {on_disk}, not {computed}.", param="archive")
        return dest, computed


def serve_admin(
    runner: Runner,
    host: str = "127.0.0.1",
    port: int = 8081,
    *,
    workdir: Path | None = None,
    on_load: Callable[[Path, str], None] | None = None,
    flush_trace: Callable[[], str | None] | None = None,
) -> EngineServer:
    """Bind the admin API on a loopback ``host``; call ``start()`` on the result.

    Raises ``UsageError`` (one sentence) for a non-loopback host or a port that is taken.
    """
    _check_loopback(host)
    admin = SandboxAdmin(runner, workdir, on_load=on_load, flush_trace=flush_trace)
    try:
        return make_server(None, host, port, admin=admin)
    except OSError as exc:
        raise UsageError(
            f"cannot listen on {host}:{port} for the admin API: {exc.strerror or exc}."
        ) from None
