"""``kubectl polymorph``'s cluster, namespace and identity: the kubeconfig read and checked before any
request, or the in-cluster service account.

Owns the one place a kubeconfig is read. The file is read bounded (``read_text``: a missing
file, a directory, ``/dev/zero``, a huge or non-UTF-8 file are one sentence), parsed by the
bounded YAML reader every polymorph input goes through (``load_yaml``), and its shape checked
(``KubeConfig``, pydantic) before the kubernetes package sees it; the context (``--context`` or
the current one) must be one of its contexts, and the namespace (``-n`` or the context's) a
DNS-1123 label. Every problem is a ``Refused`` sentence naming the file or the flag, never a
traceback. Which file: ``--kubeconfig``, else the first path of ``$KUBECONFIG``, else
``~/.kube/config``; a file named by the flag or the variable must exist (the plugin never falls
back to another cluster than the one named); only a missing ``~/.kube/config`` falls back to the
in-cluster service account, when the plugin runs in a pod.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

import kubernetes
from kubernetes.config.kube_config import KubeConfigLoader
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from polymorph.clients.kube import KubeClient
from polymorph.contract.api.common import DEFAULT_NAMESPACE, DNS_LABEL_PATTERN, DNS_SUBDOMAIN_PATTERN
from polymorph.contract.errors import UsageError
from polymorph.contract.inputs import read_text, shown
from polymorph.contract.yaml_input import load_yaml
from polymorph.kubectl_plugin.view import Refused

__all__ = ["KubeConfig", "check_name", "check_namespace", "connect", "read_kubeconfig"]

MAX_KUBECONFIG_BYTES = 4 * 1024 * 1024
"""The largest kubeconfig read (one with a few hundred contexts and inline certificates is ~1 MiB)."""

NAME_RULE = (
    "a Kubernetes object name is a DNS-1123 subdomain: at most 253 lowercase letters, digits, '-' and "
    "'.', each '.'-separated part starting and ending with a letter or digit"
)
NAMESPACE_RULE = (
    "a namespace is a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting and "
    "ending with a letter or digit"
)


def check_name(where: str, value: str) -> str:
    """``value`` if it is a name the API server could hold (a DNS-1123 subdomain), else ``Refused``."""
    if len(value) > 253 or not re.fullmatch(DNS_SUBDOMAIN_PATTERN, value):
        raise Refused(f"{where} {shown(value)} is not an object name; {NAME_RULE}.")
    return value


def check_namespace(where: str, value: str) -> str:
    """``value`` if it is a namespace name (a DNS-1123 label), else ``Refused``."""
    if len(value) > 63 or not re.fullmatch(DNS_LABEL_PATTERN, value):
        raise Refused(f"{where} {shown(value)} is not a namespace; {NAMESPACE_RULE}.")
    return value


# --------------------------------------------------------------------------------------------
# The kubeconfig's shape: what the plugin reads of it, type-checked; the rest passes through.


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class _ContextBody(_Open):
    cluster: str
    user: str = ""
    namespace: str | None = None


class _Context(_Open):
    name: str
    context: _ContextBody


class _ClusterBody(_Open):
    server: str = ""
    certificate_authority: str | None = Field(default=None, alias="certificate-authority")
    certificate_authority_data: str | None = Field(default=None, alias="certificate-authority-data")
    insecure_skip_tls_verify: bool | None = Field(default=None, alias="insecure-skip-tls-verify")


class _Cluster(_Open):
    name: str
    cluster: _ClusterBody


class _UserBody(_Open):
    token: str | None = None
    token_file: str | None = Field(default=None, alias="tokenFile")
    client_certificate: str | None = Field(default=None, alias="client-certificate")
    client_certificate_data: str | None = Field(default=None, alias="client-certificate-data")
    client_key: str | None = Field(default=None, alias="client-key")
    client_key_data: str | None = Field(default=None, alias="client-key-data")
    username: str | None = None
    password: str | None = None
    exec: dict[str, Any] | None = None
    auth_provider: dict[str, Any] | None = Field(default=None, alias="auth-provider")


class _User(_Open):
    name: str
    user: _UserBody | None = None


class KubeConfig(_Open):
    """A kubeconfig (``kind: Config``), as far as the plugin uses it."""

    clusters: list[_Cluster] | None = None
    contexts: list[_Context] | None = None
    users: list[_User] | None = None
    current_context: str | None = Field(default=None, alias="current-context")


def _where(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def read_kubeconfig(path: str) -> tuple[dict[str, Any], KubeConfig]:
    """The kubeconfig at ``path``: the document, and its shape checked; ``Refused`` naming the file."""
    where = f"kubeconfig {path}"
    try:
        doc = load_yaml(read_text(path, "kubeconfig", limit=MAX_KUBECONFIG_BYTES), where)
    except UsageError as exc:
        raise Refused(f"{str(exc).rstrip('.')}.") from None
    if doc is None:
        raise Refused(f"{where} is empty; it needs clusters, users, contexts and a current-context.")
    if not isinstance(doc, dict):
        raise Refused(
            f"{where} is not a kubeconfig: it holds a {type(doc).__name__}, not a mapping of clusters, "
            "users and contexts."
        )
    try:
        config = KubeConfig.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise Refused(f"{where}: {_where(first['loc'])}: {first['msg'].rstrip('.')}.") from None
    return doc, config


def _choose(path: str, config: KubeConfig, context: str | None) -> _Context:
    """The context to use: ``--context`` or the current one, with the cluster and user it names."""
    where = f"kubeconfig {path}"
    contexts = {c.name: c for c in config.contexts or []}
    names = ", ".join(shown(n) for n in list(contexts)[:10]) + (", ..." if len(contexts) > 10 else "")
    if context is not None:
        if context not in contexts:
            has = f"its contexts are {names}" if contexts else "it has no contexts"
            raise Refused(f"--context {shown(context)} is not a context of {where}; {has}.")
        chosen = contexts[context]
    else:
        current = config.current_context
        if not current:
            has = f"one of {names}" if contexts else "it has no contexts"
            raise Refused(f"{where} has no current-context; pass --context ({has}).")
        if current not in contexts:
            raise Refused(f"{where}: current-context {shown(current)} is not one of its contexts ({names or 'none'}).")  # fmt: skip
        chosen = contexts[current]
    clusters = {c.name: c for c in config.clusters or []}
    cluster = clusters.get(chosen.context.cluster)
    if cluster is None:
        raise Refused(f"{where}: context {shown(chosen.name)} names cluster {shown(chosen.context.cluster)}, which it does not define.")  # fmt: skip
    if not cluster.cluster.server:
        raise Refused(f"{where}: cluster {shown(cluster.name)} has no server.")
    users = {u.name for u in config.users or []}
    if chosen.context.user and chosen.context.user not in users:
        raise Refused(f"{where}: context {shown(chosen.name)} names user {shown(chosen.context.user)}, which it does not define.")  # fmt: skip
    return chosen


def _path(args: argparse.Namespace) -> tuple[str, bool]:
    """The kubeconfig path, and whether a person named it (the flag or ``$KUBECONFIG``)."""
    if args.kubeconfig is not None:
        if not args.kubeconfig:
            raise Refused("--kubeconfig is empty; give the path of a kubeconfig file.")
        return args.kubeconfig, True
    env = os.environ.get("KUBECONFIG")
    if env:
        first = next((p for p in env.split(os.pathsep) if p), "")
        if first:
            return first, True
    return os.path.expanduser("~/.kube/config"), False


def connect(args: argparse.Namespace) -> tuple[KubeClient, str]:
    """The API client and namespace the flags name, every one checked before any request is made."""
    if args.namespace is not None:
        check_namespace("-n/--namespace", args.namespace)
    config = kubernetes.client.Configuration()
    path, named = _path(args)
    if not named and not os.path.lexists(path):
        if args.context is not None:
            raise Refused(f"--context {shown(args.context)}: there is no kubeconfig ({path} is missing); set KUBECONFIG or --kubeconfig.")  # fmt: skip
        try:
            kubernetes.config.load_incluster_config(client_configuration=config)
        except kubernetes.config.ConfigException:
            raise Refused(
                f"--kubeconfig: no kubeconfig at {path} and not in a cluster; set KUBECONFIG or --kubeconfig."
            ) from None
        return KubeClient(config, timeout=args.request_timeout), args.namespace or DEFAULT_NAMESPACE
    doc, kubeconfig = read_kubeconfig(path)
    chosen = _choose(path, kubeconfig, args.context)
    namespace = args.namespace
    if namespace is None and chosen.context.namespace:
        namespace = check_namespace(f"the namespace of context {shown(chosen.name)} in kubeconfig {path},", chosen.context.namespace)  # fmt: skip
    try:
        KubeConfigLoader(
            config_dict=doc,
            active_context=chosen.name,
            config_base_path=os.path.dirname(os.path.abspath(path)),
        ).load_and_set(config)
    except (
        kubernetes.config.ConfigException,
        ValueError,
        TypeError,
        KeyError,
        AttributeError,
        OSError,
    ) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise Refused(f"kubeconfig {path}: context {shown(chosen.name)} cannot be used: {first.rstrip('.')}.") from None  # fmt: skip
    return KubeClient(config, timeout=args.request_timeout), namespace or DEFAULT_NAMESPACE
