"""``polymorph operator``: the operator process (kopf), its /metrics and its health probe.

Owns: the command's flags (``handlers.settings``), building the shared context (the
Kubernetes client from ``$KUBECONFIG`` or the in-cluster service account, the Prometheus
client, the artifact store, metrics), and running kopf with the registry of
``handlers.registry``: namespaces from ``--namespace`` or ``--all-namespaces``, liveness on
``GET :<health-port>/healthz``, peering unless ``--standalone``.

Peering: with several replicas (the chart's ``replicas > 1``), kopf's peering object (a
``KopfPeering``, or ``ClusterKopfPeering`` for ``--all-namespaces``, named by ``--peering``)
elects one active replica, the one with the highest ``--peering-priority`` (random per
process by default: kopf pauses every replica that sees a peer of equal priority, so a
shared priority would pause them all); the others keep their watches paused and take over
when it stops. The fleet drift loop's CompileJob names are fixed per cooldown period, so even two
active replicas cannot open two jobs for one drift.

It knows nothing about what the handlers decide.
"""

from __future__ import annotations

import argparse
import asyncio

import kopf

from polymorph.clients.kube import KubeClient, KubeError
from polymorph.clients.prometheus import CountingQuery, PrometheusQuery, PrometheusUnavailable
from polymorph.contract.errors import UsageError
from polymorph.contract.inputs import Parser
from polymorph.contract.store import check_writable, open_store
from polymorph.handlers import peering
from polymorph.handlers import settings as flags
from polymorph.handlers.context import AnalysisCache, Context, Freshness, Health
from polymorph.handlers.observability import OperatorMetrics, configure_logging, object_log
from polymorph.handlers.registry import build_registry, kopf_settings

__all__ = ["build_context", "configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    flags.configure(parser)


def build_context(config: flags.OperatorConfig, *, probe: bool = True) -> Context:
    """The shared context. With ``probe`` (start-up), the Kubernetes API server, Prometheus and the
    store are each asked once, without retries: one that does not answer is a ``UsageError``
    naming it, before kopf starts (kopf itself would retry for about a minute)."""
    metrics = OperatorMetrics()
    try:
        kube = KubeClient()
    except Exception as exc:  # the kubernetes package raises several kinds for a missing config
        raise UsageError(f"no Kubernetes configuration: set KUBECONFIG or run in a cluster ({exc})") from None
    prometheus = PrometheusQuery(config.prometheus_url)
    store = open_store(config.store)
    if probe:
        try:
            kube.probe()
        except KubeError as exc:
            raise UsageError(f"{exc}; check KUBECONFIG or the in-cluster service account") from None
        try:
            prometheus.probe()
        except PrometheusUnavailable as exc:
            raise UsageError(f"{exc} (--prometheus-url)") from None
        check_writable(store, "--store", config.store, prefix="compilejobs")
    return Context(
        config=config,
        kube=kube,
        query=CountingQuery(prometheus, metrics.on_query),
        store=store,
        metrics=metrics,
        health=Health(),
        analysis=AnalysisCache(max_age_s=max(0.5, config.rollout_interval_s / 2)),
        fresh=Freshness(stale_after_s=max(10.0, 20 * config.rollout_interval_s)),
    )


def run(args: argparse.Namespace) -> int:
    config = flags.from_args(args)
    configure_logging(config.log_level)
    ctx = build_context(config)
    peering.note(ctx, peering.problem(ctx))  # a warning now, not a silent pause (and /healthz fails)
    try:
        ctx.metrics.serve(config.metrics_port)
    except OSError as exc:  # taken, or not ours to bind: the flag's name, not a bare errno
        raise UsageError(
            f"--metrics-port {config.metrics_port}: cannot serve /metrics there ({exc.strerror or exc}); "
            "choose a free port"
        ) from None
    log = object_log(None, None, "Operator")
    log.info(
        "starting",
        namespaces=list(config.namespaces) or "all",
        prometheus=config.prometheus_url,
        store=config.store,
        drift_interval_s=config.drift_interval_s,
        rollout_interval_s=config.rollout_interval_s,
        standalone=config.standalone,
        peering_priority=config.peering_priority,
    )
    asyncio.run(
        kopf.operator(
            registry=build_registry(ctx),
            settings=kopf_settings(ctx),
            standalone=config.standalone,
            peering_name=None if config.standalone else config.peering,
            clusterwide=config.all_namespaces,
            namespaces=list(config.namespaces),
            liveness_endpoint=f"http://0.0.0.0:{config.health_port}/healthz",
            memo=ctx,
        )
    )
    return 0


def main() -> int:
    parser = Parser(prog="polymorph operator", description=__doc__)
    configure(parser)
    try:
        return run(parser.parse_args())
    except UsageError as exc:
        parser.exit(2, f"error: {exc}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
