"""The operator's settings: ``polymorph operator`` flags, each with a ``POLYMORPH_<FLAG>`` fallback.

Owns: the flag set (the Helm chart passes the same names), reading the environment when a
flag is absent, and checking every value into ``OperatorConfig``, with one sentence naming
the flag when a value is wrong. It knows nothing about kopf or the handlers.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

from polymorph.api import parse_duration
from polymorph.core.resources import ClusterSettings
from polymorph.errors import UsageError
from polymorph.inputs import check_http_url, shown

__all__ = ["OperatorConfig", "configure", "from_args", "parse_interval", "random_priority"]

PRIORITY_MAX = 2**31 - 1
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class OperatorConfig:
    """Everything ``polymorph operator`` was started with."""

    namespaces: tuple[str, ...]
    """Namespaces watched; empty with ``all_namespaces``."""
    all_namespaces: bool
    prometheus_url: str
    """Where traffic profiles and analysis metrics are read."""
    store: str
    """The artifact store (``s3://bucket/prefix`` or a path every pod shares)."""
    drift_interval_s: float = 60.0
    """Seconds between fleet drift cycles."""
    rollout_interval_s: float = 30.0
    """Seconds between rollout (and CompileJob progress) ticks of each object."""
    metrics_port: int = 9090
    health_port: int = 8080
    standalone: bool = False
    """No kopf peering (one replica); otherwise replicas share the peering object below."""
    peering: str = "polymorph"
    peering_priority: int = 0
    """This replica's kopf peering priority. kopf pauses every replica that sees a live peer of
    higher *or equal* priority, so replicas must differ: the default is random per process."""
    log_level: str = "info"
    cluster: ClusterSettings = field(default_factory=lambda: ClusterSettings(store=""))
    """What shapes every child: store, its Secret, images, the default Anthropic Secret."""


def parse_interval(value: str, flag: str) -> float:
    """Seconds in ``value``: the one duration syntax of every command and manifest
    (``polymorph.api.parse_duration``: ``500ms``, ``30s``, ``1m``, ``6h``, ``1d``)."""
    try:
        return parse_duration(value.strip())
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None


def _env(name: str) -> str:
    return "POLYMORPH_" + name.upper().replace("-", "_")


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the operator's flags. Defaults come from the environment, shown as POLYMORPH_<FLAG>."""
    add = parser.add_argument
    add(
        "--namespace",
        action="append",
        default=None,
        metavar="NS",
        help="watch NS (repeatable; $POLYMORPH_NAMESPACE, comma-separated); this or --all-namespaces is required",
    )
    add(
        "--all-namespaces",
        action="store_true",
        default=None,
        help="watch every namespace (default off; $POLYMORPH_ALL_NAMESPACES)",
    )
    add(
        "--prometheus-url",
        help="Prometheus base URL, http(s)://; checked at start-up (required; $POLYMORPH_PROMETHEUS_URL)",
    )
    add(
        "--store",
        help="artifact store: s3://bucket/prefix or an absolute path every pod shares; checked writable at "
        "start-up (required; $POLYMORPH_STORE)",
    )
    add(
        "--store-secret",
        help="Secret with the store's AWS_* credentials, passed to pods (default none; $POLYMORPH_STORE_SECRET)",
    )
    add(
        "--anthropic-secret-name",
        help="default Secret with the Anthropic key (default none; $POLYMORPH_ANTHROPIC_SECRET_NAME)",
    )
    add("--anthropic-secret-key", help="its key (default api-key; $POLYMORPH_ANTHROPIC_SECRET_KEY)")
    add(
        "--sandbox-image",
        help=f"image of the sandbox containers (default {ClusterSettings.sandbox_image}; $POLYMORPH_SANDBOX_IMAGE)",
    )
    add(
        "--fetch-image",
        help=f"image of the s3:// weights init container (default {ClusterSettings.fetch_image}; "
        "$POLYMORPH_FETCH_IMAGE)",
    )
    add(
        "--drift-interval",
        help="time between fleet drift cycles, a duration such as 1m (default 1m; $POLYMORPH_DRIFT_INTERVAL)",
    )
    add(
        "--rollout-interval",
        help="time between rollout ticks, a duration such as 30s or 500ms (default 30s; "
        "$POLYMORPH_ROLLOUT_INTERVAL)",
    )
    add("--metrics-port", help="port of the operator's /metrics (default 9090; $POLYMORPH_METRICS_PORT)")
    add("--health-port", help="port of GET /healthz (default 8080; $POLYMORPH_HEALTH_PORT)")
    add(
        "--standalone",
        action="store_true",
        default=None,
        help="no kopf peering: a single replica (default off; $POLYMORPH_STANDALONE)",
    )
    add("--peering", help="kopf peering object shared by replicas (default polymorph; $POLYMORPH_PEERING)")
    add(
        "--peering-priority",
        help="this replica's peering priority, 0..2147483647; the highest live one acts "
        "(default random per process; $POLYMORPH_PEERING_PRIORITY)",
    )
    add("--log-level", help="debug, info, warning or error (default info; $POLYMORPH_LOG_LEVEL)")


def _port(value: str, flag: str) -> int:
    if len(value) > 5 or not value.isdigit() or not 0 < int(value) < 65536:
        raise UsageError(f"{flag} must be a port number from 1 to 65535; got {shown(value)}")
    return int(value)


def random_priority() -> int:
    """A peering priority for one process: random, so two replicas (almost surely) differ."""
    return secrets.randbelow(PRIORITY_MAX) + 1


def _priority(value: str | None) -> int:
    if value is None or not value.strip():
        return random_priority()
    text = value.strip()
    if len(text) > 10 or not text.isdigit() or int(text) > PRIORITY_MAX:
        raise UsageError(
            f"--peering-priority must be a whole number from 0 to {PRIORITY_MAX}; got {shown(value)}"
        )
    return int(text)


def _flag_bool(value: bool | None, env: Mapping[str, str], name: str) -> bool:
    if value is not None:
        return value
    text = env.get(_env(name), "").strip().lower()
    if text in ("", "0", "false", "no"):
        return False
    if text in ("1", "true", "yes"):
        return True
    raise UsageError(f"{_env(name)} must be true or false; got {text!r}")


def from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> OperatorConfig:
    """Check the flags (falling back to the environment) into an ``OperatorConfig``."""
    env = os.environ if env is None else env

    def get(name: str, default: str | None = None) -> str | None:
        value = getattr(args, name.replace("-", "_"), None)
        if value is None:
            value = env.get(_env(name)) or default
        return value

    namespaces = tuple(
        args.namespace or [n.strip() for n in env.get("POLYMORPH_NAMESPACE", "").split(",") if n.strip()]
    )
    all_namespaces = _flag_bool(args.all_namespaces, env, "all-namespaces")
    if namespaces and all_namespaces:
        raise UsageError("give --namespace NS (repeatable) or --all-namespaces, not both")
    if not namespaces and not all_namespaces:
        raise UsageError("say what to watch: --namespace NS (repeatable) or --all-namespaces")
    for ns in namespaces:
        if len(ns) > 63 or not re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", ns):
            raise UsageError(
                f"--namespace {shown(ns)} is not a namespace name (at most 63 lowercase letters, digits and '-')"
            )
    prometheus = get("prometheus-url")
    if not prometheus:
        raise UsageError(
            "--prometheus-url (or POLYMORPH_PROMETHEUS_URL) is required: the http(s):// URL of Prometheus"
        )
    try:
        check_http_url(prometheus)
    except ValueError as exc:
        raise UsageError(f"--prometheus-url {exc}") from None
    store = get("store")
    if not store:
        raise UsageError(
            "--store is required: the artifact store, s3://bucket/prefix or a path every pod shares"
        )
    if "://" not in store and not store.startswith("/"):
        raise UsageError(
            f"--store {shown(store)} is a relative path; pods do not share the operator's working "
            "directory: give s3://bucket/prefix or an absolute path every pod mounts"
        )
    level = (get("log-level", "info") or "info").lower()
    if level not in LOG_LEVELS:
        raise UsageError(f"--log-level must be one of {', '.join(LOG_LEVELS)}; got {shown(level)}")
    secret_name = get("anthropic-secret-name")
    cluster = ClusterSettings(
        store=store,
        store_secret=get("store-secret"),
        sandbox_image=get("sandbox-image", ClusterSettings.sandbox_image) or ClusterSettings.sandbox_image,
        fetch_image=get("fetch-image", ClusterSettings.fetch_image) or ClusterSettings.fetch_image,
        anthropic_secret=(secret_name, get("anthropic-secret-key", "api-key") or "api-key")
        if secret_name
        else None,
    )
    return OperatorConfig(
        namespaces=namespaces,
        all_namespaces=all_namespaces,
        prometheus_url=prometheus,
        store=store,
        drift_interval_s=parse_interval(get("drift-interval", "1m") or "", "--drift-interval"),
        rollout_interval_s=parse_interval(get("rollout-interval", "30s") or "", "--rollout-interval"),
        metrics_port=_port(get("metrics-port", "9090") or "9090", "--metrics-port"),
        health_port=_port(get("health-port", "8080") or "8080", "--health-port"),
        standalone=_flag_bool(args.standalone, env, "standalone"),
        peering=get("peering", "polymorph") or "polymorph",
        peering_priority=_priority(get("peering-priority")),
        log_level=level,
        cluster=cluster,
    )
