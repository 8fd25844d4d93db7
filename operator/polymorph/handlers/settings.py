"""The operator's settings: ``polymorph operator`` flags, each with a ``POLYMORPH_<FLAG>`` fallback.

Owns: the flag set (the Helm chart passes the same names), reading the environment when a
flag is absent, and checking every value into ``OperatorConfig``, with one sentence naming
the flag (or the environment variable the value came from) when a value is wrong. Each
setting is one ``Setting``: its flag, environment variable, default and help text come from
that one declaration, and ``OperatorConfig``'s defaults are its defaults. It knows nothing
about kopf or the handlers.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from polymorph.contract.api import parse_duration
from polymorph.contract.errors import UsageError
from polymorph.contract.inputs import check_http_url, check_image, shown
from polymorph.core.resources import ClusterSettings

__all__ = [
    "SETTINGS",
    "OperatorConfig",
    "Setting",
    "configure",
    "from_args",
    "parse_interval",
    "random_priority",
]

PRIORITY_MAX = 2**31 - 1
LOG_LEVELS = ("debug", "info", "warning", "error")
T = TypeVar("T", covariant=True)


def parse_interval(value: str, flag: str) -> float:
    """Seconds in ``value``: the one duration syntax of every command and manifest
    (``polymorph.contract.api.parse_duration``: ``500ms``, ``30s``, ``1m``, ``6h``, ``1d``; bare seconds
    such as ``30`` are refused with the unit they need)."""
    try:
        return parse_duration(value.strip())
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None


def _port(value: str, flag: str) -> int:
    if len(value) > 5 or not value.isdigit() or not 0 < int(value) < 65536:
        raise UsageError(f"{flag} must be a port number from 1 to 65535; got {shown(value)}")
    return int(value)


def random_priority() -> int:
    """A peering priority for one process: random, so two replicas (almost surely) differ."""
    return secrets.randbelow(PRIORITY_MAX) + 1


def _priority(value: str, flag: str) -> int:
    text = value.strip()
    if not text:
        return random_priority()
    if len(text) > 10 or not text.isdigit() or int(text) > PRIORITY_MAX:
        raise UsageError(f"{flag} must be a whole number from 0 to {PRIORITY_MAX}; got {shown(value)}")
    return int(text)


def _log_level(value: str, flag: str) -> str:
    level = value.lower()
    if level not in LOG_LEVELS:
        raise UsageError(f"{flag} must be one of {', '.join(LOG_LEVELS)}; got {shown(level)}")
    return level


def _text(value: str, flag: str) -> str:
    return value


def _switch(value: str, flag: str) -> bool:
    text = value.strip().lower()
    if text in ("", "0", "false", "no"):
        return False
    if text in ("1", "true", "yes"):
        return True
    raise UsageError(f"{flag} must be true or false; got {text!r}")


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One setting of ``polymorph operator``: a flag, its ``POLYMORPH_<FLAG>`` fallback and its default.

    ``help`` says what the setting is; the help text adds the default (or "required") and the
    environment variable. A ``{env}`` in ``help`` places the variable itself, with no suffix.
    """

    flag: str
    help: str
    parse: Callable[[str, str], T]
    """Checks the text (from the flag, the environment or ``default``) into a value; its second
    argument names where the text came from, for the one sentence of a bad value."""
    default: str | None = None
    """The default as it would be written on the command line; None: none (or required)."""
    shown: str | None = None
    """How the help text shows a default that is not a value (``off``, ``random per process``)."""
    required: bool = False
    switch: bool = False
    """A flag without a value (``--standalone``); its variable says true or false."""

    @property
    def env(self) -> str:
        return "POLYMORPH_" + self.flag.removeprefix("--").upper().replace("-", "_")

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    def help_text(self) -> str:
        if "{env}" in self.help:
            return self.help.format(env=f"${self.env}")
        default = "required" if self.required else f"default: {self.shown or self.default or 'none'}"
        return f"{self.help} ({default}; ${self.env})"

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        if self.switch:
            parser.add_argument(self.flag, action="store_true", default=None, help=self.help_text())
        else:
            parser.add_argument(self.flag, help=self.help_text())

    def default_value(self) -> T:
        """``default`` checked, as ``OperatorConfig`` holds it."""
        return self.parse(self.default or "", self.flag)

    def read(self, args: argparse.Namespace, env: Mapping[str, str]) -> T | None:
        """The flag's value, else the environment's (a bad one names the variable), else the default;
        None when there is none of the three. An empty variable is an absent one."""
        value = getattr(args, self.dest, None)
        if self.switch and value is not None:
            return self.parse("true" if value else "false", self.flag)
        if value is not None:
            return self.parse(value, self.flag)
        if env.get(self.env):
            return self.parse(env[self.env], self.env)
        return None if self.default is None else self.default_value()

    def value(self, args: argparse.Namespace, env: Mapping[str, str]) -> T:
        """``read`` for a setting with a default, which it falls back to."""
        found = self.read(args, env)
        return self.default_value() if found is None else found


NAMESPACE = Setting(
    "--namespace",
    "watch NS (repeatable; {env}, comma-separated); this or --all-namespaces is required",
    _text,
)
ALL_NAMESPACES = Setting("--all-namespaces", "watch every namespace", _switch, "false", "off", switch=True)
PROMETHEUS_URL = Setting(
    "--prometheus-url", "Prometheus base URL, http(s)://; checked at start-up", _text, required=True
)
STORE = Setting(
    "--store",
    "artifact store: s3://bucket/prefix or an absolute path every pod shares; checked writable at start-up",
    _text,
    required=True,
)
STORE_SECRET = Setting("--store-secret", "Secret with the store's AWS_* credentials, passed to pods", _text)
ANTHROPIC_SECRET_NAME = Setting("--anthropic-secret-name", "default Secret with the Anthropic key", _text)
ANTHROPIC_SECRET_KEY = Setting("--anthropic-secret-key", "its key", _text, "api-key")
SANDBOX_IMAGE = Setting(
    "--sandbox-image", "image of the sandbox containers", check_image, ClusterSettings.sandbox_image
)
FETCH_IMAGE = Setting(
    "--fetch-image", "image of the s3:// weights init container", check_image, ClusterSettings.fetch_image
)
DRIFT_INTERVAL = Setting(
    "--drift-interval", "time between fleet drift cycles, a duration such as 1m", parse_interval, "1m"
)
ROLLOUT_INTERVAL = Setting(
    "--rollout-interval", "time between rollout ticks, a duration such as 30s or 500ms", parse_interval, "30s"
)
METRICS_PORT = Setting("--metrics-port", "port of the operator's /metrics", _port, "9090")
HEALTH_PORT = Setting("--health-port", "port of GET /healthz", _port, "8080")
STANDALONE = Setting(
    "--standalone", "no kopf peering: a single replica", _switch, "false", "off", switch=True
)
PEERING = Setting("--peering", "kopf peering object shared by replicas", _text, "polymorph")
PEERING_PRIORITY = Setting(
    "--peering-priority",
    f"this replica's peering priority, 0..{PRIORITY_MAX}; the highest live one acts",
    _priority,
    "",
    "random per process",
)
LOG_LEVEL = Setting("--log-level", "debug, info, warning or error", _log_level, "info")

SETTINGS: tuple[Setting[object], ...] = (
    NAMESPACE, ALL_NAMESPACES, PROMETHEUS_URL, STORE, STORE_SECRET, ANTHROPIC_SECRET_NAME,
    ANTHROPIC_SECRET_KEY, SANDBOX_IMAGE, FETCH_IMAGE, DRIFT_INTERVAL, ROLLOUT_INTERVAL, METRICS_PORT,
    HEALTH_PORT, STANDALONE, PEERING, PEERING_PRIORITY, LOG_LEVEL,
)  # fmt: skip
"""Every setting, in the order of ``polymorph operator --help``."""


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
    drift_interval_s: float = DRIFT_INTERVAL.default_value()
    """Seconds between fleet drift cycles."""
    rollout_interval_s: float = ROLLOUT_INTERVAL.default_value()
    """Seconds between rollout (and CompileJob progress) ticks of each object."""
    metrics_port: int = METRICS_PORT.default_value()
    health_port: int = HEALTH_PORT.default_value()
    standalone: bool = STANDALONE.default_value()
    """No kopf peering (one replica); otherwise replicas share the peering object below."""
    peering: str = PEERING.default_value()
    peering_priority: int = 0
    """This replica's kopf peering priority. kopf pauses every replica that sees a live peer of
    higher *or equal* priority, so replicas must differ: the default is random per process."""
    log_level: str = LOG_LEVEL.default_value()
    cluster: ClusterSettings = field(default_factory=lambda: ClusterSettings(store=""))
    """What shapes every child: store, its Secret, images, the default Anthropic Secret."""


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the operator's flags. Defaults come from the environment, shown as POLYMORPH_<FLAG>."""
    parser.add_argument(
        NAMESPACE.flag, action="append", default=None, metavar="NS", help=NAMESPACE.help_text()
    )
    for setting in SETTINGS[1:]:
        setting.add_to(parser)


def _required(setting: Setting[str], args: argparse.Namespace, env: Mapping[str, str], message: str) -> str:
    value = setting.read(args, env)
    if not value:
        raise UsageError(message)
    return value


def from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> OperatorConfig:
    """Check the flags (falling back to the environment, then the defaults) into an ``OperatorConfig``."""
    env = os.environ if env is None else env
    namespaces = tuple(
        args.namespace or [n.strip() for n in env.get(NAMESPACE.env, "").split(",") if n.strip()]
    )
    all_namespaces = ALL_NAMESPACES.value(args, env)
    if namespaces and all_namespaces:
        raise UsageError("give --namespace NS (repeatable) or --all-namespaces, not both")
    if not namespaces and not all_namespaces:
        raise UsageError("say what to watch: --namespace NS (repeatable) or --all-namespaces")
    for ns in namespaces:
        if len(ns) > 63 or not re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", ns):
            raise UsageError(
                f"--namespace {shown(ns)} is not a namespace name (at most 63 lowercase letters, digits and '-')"
            )
    prometheus = _required(
        PROMETHEUS_URL,
        args,
        env,
        f"{PROMETHEUS_URL.flag} (or {PROMETHEUS_URL.env}) is required: the http(s):// URL of Prometheus",
    )
    try:
        check_http_url(prometheus)
    except ValueError as exc:
        raise UsageError(f"--prometheus-url {exc}") from None
    store = _required(
        STORE,
        args,
        env,
        "--store is required: the artifact store, s3://bucket/prefix or a path every pod shares",
    )
    if "://" not in store and not store.startswith("/"):
        raise UsageError(
            f"--store {shown(store)} is a relative path; pods do not share the operator's working "
            "directory: give s3://bucket/prefix or an absolute path every pod mounts"
        )
    level = LOG_LEVEL.value(args, env)
    secret_name = ANTHROPIC_SECRET_NAME.read(args, env)
    cluster = ClusterSettings(
        store=store,
        store_secret=STORE_SECRET.read(args, env),
        sandbox_image=SANDBOX_IMAGE.value(args, env),
        fetch_image=FETCH_IMAGE.value(args, env),
        anthropic_secret=(secret_name, ANTHROPIC_SECRET_KEY.value(args, env)) if secret_name else None,
    )
    return OperatorConfig(
        namespaces=namespaces,
        all_namespaces=all_namespaces,
        prometheus_url=prometheus,
        store=store,
        drift_interval_s=DRIFT_INTERVAL.value(args, env),
        rollout_interval_s=ROLLOUT_INTERVAL.value(args, env),
        metrics_port=METRICS_PORT.value(args, env),
        health_port=HEALTH_PORT.value(args, env),
        standalone=STANDALONE.value(args, env),
        peering=PEERING.value(args, env),
        peering_priority=PEERING_PRIORITY.value(args, env),
        log_level=level,
        cluster=cluster,
    )
