"""The Kubernetes seam: get, list, create, merge-patch and delete any object, by kind, over REST.

Owns: ``Kind`` (an apiVersion and plural), the kinds the operator touches, ``Kube`` (the
protocol handlers use), ``KubeClient`` (the real one, over the kubernetes package's
configuration and connection pool: ``$KUBECONFIG`` or the in-cluster service account),
``apply`` (create, or merge-patch only what differs, so a reconcile that changes nothing
writes nothing), and ``KubeError`` with the API server's message.

The calls block; handlers run them with ``asyncio.to_thread``. It knows nothing about what
the objects mean.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote, urlencode

import kubernetes
import urllib3

from polymorph.contract import timeouts
from polymorph.contract.api import API_VERSION

__all__ = [
    "COMPILEJOBS",
    "CONFIGMAPS",
    "DEPLOYMENTS",
    "EVENTS",
    "JOBS",
    "MODELDEPLOYMENTS",
    "PODS",
    "SERVICES",
    "Kind",
    "Kube",
    "KubeClient",
    "KubeError",
    "apply",
    "contains",
    "load_configuration",
]

JSON = dict[str, Any]


def _segment(what: str, value: str) -> str:
    """One segment of a request path: ``value`` percent-quoted, refused when it could name another
    path (empty, ``.`` or ``..``, which URL normalisation removes, or with a ``/``)."""
    if not value or value in (".", "..") or "/" in value:
        raise ValueError(f"{what} {value[:60]!r} cannot be a segment of an API request path")
    return quote(value, safe="")


@dataclass(frozen=True)
class Kind:
    api_version: str
    plural: str

    def path(self, namespace: str | None, name: str | None = None, subresource: str | None = None) -> str:
        """The REST path of the collection, or of one object: each segment (group, version, plural,
        namespace, name, subresource) checked and quoted on its own, so no value names another path."""
        group, _, version = self.api_version.rpartition("/")
        parts = ["api", _segment("version", version)] if not group else ["apis", _segment("group", group), _segment("version", version)]  # fmt: skip
        if namespace:
            parts += ["namespaces", _segment("namespace", namespace)]
        parts.append(_segment("resource", self.plural))
        if name:
            parts.append(_segment("name", name))
        if subresource:
            parts.append(_segment("subresource", subresource))
        return "/" + "/".join(parts)


DEPLOYMENTS = Kind("apps/v1", "deployments")
SERVICES = Kind("v1", "services")
CONFIGMAPS = Kind("v1", "configmaps")
JOBS = Kind("batch/v1", "jobs")
PODS = Kind("v1", "pods")
MODELDEPLOYMENTS = Kind(API_VERSION, "modeldeployments")
COMPILEJOBS = Kind(API_VERSION, "compilejobs")
EVENTS = Kind("v1", "events")


class KubeError(Exception):
    """The API server refused a request; ``status`` is its HTTP code."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Kube(Protocol):
    def get(self, kind: Kind, namespace: str, name: str) -> JSON | None: ...

    def list(self, kind: Kind, namespace: str | None, labels: dict[str, str] | None = None) -> list[JSON]: ...

    def create(self, kind: Kind, namespace: str, body: JSON) -> JSON: ...

    def patch(
        self, kind: Kind, namespace: str, name: str, patch: JSON, subresource: str | None = None
    ) -> JSON: ...

    def delete(self, kind: Kind, namespace: str, name: str) -> bool: ...


def load_configuration(kubeconfig: str | None = None) -> kubernetes.client.Configuration:
    """``kubeconfig``, else ``$KUBECONFIG`` (or ~/.kube/config) when present, else the in-cluster service account."""
    config = kubernetes.client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    if os.path.exists(path.split(os.pathsep)[0]):
        kubernetes.config.load_kube_config(config_file=path.split(os.pathsep)[0], client_configuration=config)
    else:
        kubernetes.config.load_incluster_config(client_configuration=config)
    return config


class KubeClient:
    """Blocking REST calls through the kubernetes package's ApiClient (auth, TLS, pooling)."""

    def __init__(
        self,
        configuration: kubernetes.client.Configuration | None = None,
        timeout: float | None = None,
        limits: timeouts.Limits = timeouts.KUBE,
    ) -> None:
        """Every call is bounded by ``limits`` (``polymorph.contract.timeouts``); ``timeout``, when
        given (the plugin's ``--request-timeout``), replaces its read timeout."""
        configuration = configuration or load_configuration()
        # The pool's retries (urllib3 tries 4 times by default: minutes against a server that never answers).
        configuration.retries = urllib3.Retry(total=limits.retries, backoff_factor=0.2, raise_on_status=False)
        self._api = kubernetes.client.ApiClient(configuration)
        self._timeout = (limits.connect_s, limits.read_s if timeout is None else timeout)
        self._tries = limits.attempts

    @property
    def host(self) -> str:
        """The API server's URL, as the configuration names it."""
        return str(self._api.configuration.host)

    def probe(self, limits: timeouts.Limits = timeouts.PROBE) -> None:
        """Ask the API server for its ``/version`` once, without retries; ``KubeError`` naming the
        server when it does not answer (the operator checks this before it starts, so an
        unreachable server is one line at once, not a minute of retries)."""
        url = self.host.rstrip("/") + "/version"
        try:
            response = self._api.rest_client.pool_manager.request(
                "GET",
                url,
                timeout=urllib3.Timeout(connect=limits.connect_s, read=limits.read_s),
                retries=False,
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise KubeError(
                0, f"the Kubernetes API server {self.host} is unreachable: {_short(reason)}"
            ) from None
        if response.status >= 500:
            raise KubeError(
                response.status, f"the Kubernetes API server {self.host} answered {response.status}"
            )

    def _call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        _, url, headers, _, _ = self._api.param_serialize(
            method=method, resource_path=path, header_params=headers, auth_settings=["BearerToken"]
        )
        try:
            # The REST layer serialises ``body`` as JSON for every *json content type.
            response = self._api.call_api(
                method, url, header_params=headers, body=body, _request_timeout=self._timeout
            )
            response.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeError(
                0,
                f"the Kubernetes API server {self.host} is unreachable: {_why(exc, self._timeout, self._tries)}",
            ) from None
        raw = response.data or b"{}"
        if response.status >= 400:
            try:
                message = json.loads(raw).get("message", "")
            except ValueError:
                message = raw.decode(errors="replace")[:300]
            raise KubeError(response.status, f"{method} {path}: {response.status} {message}")
        return json.loads(raw)

    def get(self, kind: Kind, namespace: str, name: str) -> JSON | None:
        try:
            result: JSON = self._call("GET", kind.path(namespace, name))
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    def list(self, kind: Kind, namespace: str | None, labels: dict[str, str] | None = None) -> list[JSON]:
        path = kind.path(namespace)
        if labels:
            path += "?" + urlencode(
                {"labelSelector": ",".join(f"{k}={v}" for k, v in sorted(labels.items()))}
            )
        items: list[JSON] = self._call("GET", path).get("items") or []
        return items

    def create(self, kind: Kind, namespace: str, body: JSON) -> JSON:
        result: JSON = self._call("POST", kind.path(namespace), body)
        return result

    def patch(
        self, kind: Kind, namespace: str, name: str, patch: JSON, subresource: str | None = None
    ) -> JSON:
        path = kind.path(namespace, name, subresource)
        result: JSON = self._call("PATCH", path, patch, "application/merge-patch+json")
        return result

    def delete(self, kind: Kind, namespace: str, name: str) -> bool:
        try:
            self._call("DELETE", kind.path(namespace, name), {"propagationPolicy": "Background"})
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True


def _why(exc: BaseException, timeout: tuple[float, float], tries: int) -> str:
    """Why a call got no answer, in a few words: a timeout says which and how long, after how many tries."""
    reason: object = getattr(exc, "reason", None) or exc
    tried = "1 try" if tries == 1 else f"{tries} tries"
    if isinstance(reason, urllib3.exceptions.ReadTimeoutError):
        return f"no answer within {timeout[1]:g} s ({tried})"
    if isinstance(reason, urllib3.exceptions.ConnectTimeoutError):
        return f"no connection within {timeout[0]:g} s ({tried})"
    return f"{type(exc).__name__}: {_short(reason)}"


def _short(reason: object) -> str:
    """An exception's reason in one short line (urllib3 nests the socket error in its text)."""
    text = " ".join(str(reason).split())
    if "] " in text and text.startswith(
        "<"
    ):  # "<urllib3.connection...>: Failed to establish ...: [Errno 111] ..."
        text = text.split(">: ", 1)[-1]
    return text[:200]


def contains(actual: Any, wanted: Any) -> bool:
    """Whether ``actual`` already has everything ``wanted`` says (extra server-set fields are fine)."""
    if isinstance(wanted, dict):
        return isinstance(actual, dict) and all(contains(actual.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(wanted)
            and all(contains(a, w) for a, w in zip(actual, wanted, strict=True))
        )
    if isinstance(wanted, int | float) and isinstance(actual, int | float) and not isinstance(wanted, bool):
        return float(actual) == float(wanted)
    return bool(actual == wanted)


def apply(kube: Kube, kind: Kind, body: JSON) -> tuple[str, JSON]:
    """Make the object as ``body`` says: ``("created"|"patched"|"unchanged", object)``."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    current = kube.get(kind, namespace, name)
    if current is None:
        try:
            return "created", kube.create(kind, namespace, body)
        except KubeError as exc:
            if exc.status != 409:
                raise
            current = kube.get(kind, namespace, name) or {}
    wanted = {k: v for k, v in body.items() if k not in ("apiVersion", "kind", "status")}
    if contains(current, wanted):
        return "unchanged", current
    return "patched", kube.patch(kind, namespace, name, wanted)
