"""Whether kopf peering can work: with peering on, the API server must serve kopf's peering CRD.

kopf pauses every watch while the peering resource it needs (``kopfpeerings.kopf.dev``, or
``clusterkopfpeerings.kopf.dev`` with ``--all-namespaces``) is not served, and says so only at
debug level: an operator that does nothing and looks healthy. ``problem`` asks the API server
(a list of the peering objects: 404 when the resource is not served), ``note`` logs a change at
warning level (and the recovery at info), and the ``peering`` probe in ``handlers.registry``
fails ``/healthz`` while the problem lasts. A standby replica paused by a live peer of higher
priority is healthy: that pause is peering working, not failing.
"""

from __future__ import annotations

from polymorph.clients.kube import Kind, KubeError
from polymorph.handlers.context import Context
from polymorph.handlers.observability import object_log

__all__ = ["CLUSTER_PEERINGS", "PEERINGS", "note", "problem"]

PEERINGS = Kind("kopf.dev/v1", "kopfpeerings")
CLUSTER_PEERINGS = Kind("kopf.dev/v1", "clusterkopfpeerings")


def problem(ctx: Context) -> str | None:
    """Why peering pauses every watch (the peering CRD is not served), or None (standalone, served,
    or the API server could not tell: a failed request is not evidence of a missing CRD)."""
    config = ctx.config
    if config.standalone:
        return None
    kind = CLUSTER_PEERINGS if config.all_namespaces else PEERINGS
    for namespace in [None] if config.all_namespaces else list(config.namespaces):
        try:
            ctx.kube.list(kind, namespace)
        except KubeError as exc:
            if exc.status != 404:
                return None
            return (
                f"peering is on (--peering {config.peering}) but the API server does not serve "
                f"{kind.plural}.kopf.dev, so every watch is paused and nothing is reconciled; "
                "install the chart's peering CRD or run with --standalone"
            )
    return None


def note(ctx: Context, found: str | None) -> None:
    """Record ``found`` in ``ctx.health``; log it at warning level when it appears, at info when it goes."""
    before = ctx.health.peering_error
    ctx.health.peering_error = found
    log = object_log(None, None, "Operator")
    if found is not None and found != before:
        log.warning("peering-paused", reason=found)
    elif found is None and before is not None:
        log.info("peering-resumed", reason="the peering CRD is served again")
