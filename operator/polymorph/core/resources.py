"""Desired child manifests: a ModelDeployment's Deployments and Service, a CompileJob's ConfigMap and Job.

Owns: names (``<md>``, ``<md>-canary``, ``<cj>-spec``), the labels the operator owns
(``polymorph.dev/model-deployment``, ``polymorph.dev/build``, ``polymorph.dev/track``,
``polymorph.dev/compilejob``), owner references, how the weights reach a pod (``pvc://``
mounted read-only, ``s3://`` fetched by an init container into an emptyDir, a plain path
passed through for CPU and development clusters), the serving command line (with
``--tensor-parallel N`` where ``spec.hardware.count`` asks N accelerators of one pod), and the hardened
sandbox pod (engine as a native sidecar with no secrets; agent with ``secretKeyRef`` env).

Every function returns a JSON-ready dict; nothing here talks to a cluster or reads a clock.
It knows nothing about when children are created or scaled: the rollout decides replicas.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from polymorph.contract.api import CompileJob, ModelDeployment, parse_duration
from polymorph.contract.api.modeldeployment import HardwareSpec, ModelSource
from polymorph.core.hardware import placement

__all__ = [
    "ANNOTATION_ABORT",
    "ANNOTATION_APPROVE",
    "LABEL_BUILD",
    "LABEL_COMPILEJOB",
    "LABEL_MANAGED_BY",
    "LABEL_MODEL_DEPLOYMENT",
    "LABEL_TRACK",
    "MANAGED_BY",
    "SANDBOX_SPEC_FILE",
    "SERVING_ROLLING_UPDATE",
    "ClusterSettings",
    "ModelMount",
    "build_label",
    "canary_name",
    "configmap_name",
    "model_mount",
    "owner_reference",
    "sandbox_configmap",
    "sandbox_job",
    "serving_deployment",
    "serving_service",
    "tensor_parallel",
]

LABEL_MODEL_DEPLOYMENT = "polymorph.dev/model-deployment"
LABEL_BUILD = "polymorph.dev/build"
LABEL_TRACK = "polymorph.dev/track"
LABEL_COMPILEJOB = "polymorph.dev/compilejob"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "polymorph"
ANNOTATION_BUILD_ID = "polymorph.dev/build-id"
ANNOTATION_APPROVE = "polymorph.dev/approve"
"""``<build id>``: start a ``policy: Manual`` rollout of that build, or resume a Paused one."""
ANNOTATION_ABORT = "polymorph.dev/abort"
"""``"true"``: roll the current rollout back to the stable build (the outcome is Aborted)."""

SANDBOX_SPEC_DIR = "/etc/polymorph"
SANDBOX_SPEC_FILE = f"{SANDBOX_SPEC_DIR}/compilejob.json"
SANDBOX_ADMIN_PORT = 8471
MODEL_DIR = "/models"
# A fixed unprivileged uid/gid (the distroless "nonroot" user), so runAsNonRoot holds for any image.
NONROOT_UID = 65532
_HEX = re.compile(r"^sha256:([0-9a-f]{64})$")
SERVING_ROLLING_UPDATE: dict[str, int | str] = {"maxUnavailable": 0, "maxSurge": "25%"}
"""How each serving Deployment replaces its pods when its pod template changes (a promotion puts
the new build on the stable Deployment; a spec change alters the engine's image, env or
resources): never a ready replica away before its replacement is ready, so capacity stays
whole, and at most a quarter of its replicas more (rounded up, so at least one) at a time, so
the surge asks the cluster for a bounded number of extra accelerators."""


@dataclass(frozen=True)
class ClusterSettings:
    """What the operator was started with that shapes every child (flags of ``polymorph operator``)."""

    store: str
    """The artifact store URI the pods use (``s3://bucket/prefix`` or a path on a shared volume)."""
    store_secret: str | None = None
    """A Secret with ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (and optionally
    ``AWS_ENDPOINT_URL``, ``AWS_REGION``) for the store and s3:// weights; None: no credentials."""
    sandbox_image: str = "ghcr.io/polymorph/engine:0.1.0"
    """Image of both sandbox containers (the engine image carries the ``polymorph`` command)."""
    fetch_image: str = "amazon/aws-cli:2.17.0"
    """Image of the init container that copies s3:// weights into the pod."""
    anthropic_secret: tuple[str, str] | None = None
    """(name, key) of the Anthropic key for Claude jobs whose spec names no apiKeySecretRef."""


def build_label(build_id: str) -> str:
    """A label-safe form of a build id: ``reference``, or ``sha256-`` and the first 56 hex digits.

    Label values are limited to 63 characters, so the full id goes in an annotation beside it.
    """
    match = _HEX.match(build_id)
    if match:
        return "sha256-" + match.group(1)[:56]
    return re.sub(r"[^A-Za-z0-9_.-]", "-", build_id)[:63].strip("-_.") or "unknown"


def canary_name(md_name: str) -> str:
    return f"{md_name}-canary"


def configmap_name(cj_name: str) -> str:
    return f"{cj_name}-spec"[:63]


def owner_reference(obj: ModelDeployment | CompileJob) -> dict[str, Any]:
    """A controller owner reference to ``obj`` (its uid must be set: it came from the API)."""
    if not obj.metadata.uid:
        raise ValueError(f"{obj.kind} {obj.metadata.name} has no metadata.uid; owner references need one")
    return {
        "apiVersion": obj.apiVersion,
        "kind": obj.kind,
        "name": obj.metadata.name,
        "uid": obj.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(name: str, obj: ModelDeployment | CompileJob, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": obj.metadata.namespace,
        "labels": {LABEL_MANAGED_BY: MANAGED_BY, **labels},
        "ownerReferences": [owner_reference(obj)],
    }


@dataclass(frozen=True)
class ModelMount:
    """How the weights reach the engine: its ``--model`` argument, volumes, mounts and init containers."""

    model_arg: str
    volumes: list[dict[str, Any]]
    mounts: list[dict[str, Any]]
    init_containers: list[dict[str, Any]]


def _hardened(read_only: bool = True) -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": NONROOT_UID,
        "runAsGroup": NONROOT_UID,
        "readOnlyRootFilesystem": read_only,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _hardened_pod() -> dict[str, Any]:
    """The pod-level settings of every pod the operator makes (its containers take ``_hardened``):
    no service account token or service links, non-root, volumes owned by the non-root group."""
    return {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "fsGroup": NONROOT_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


def _store_env(settings: ClusterSettings) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": "POLYMORPH_STORE", "value": settings.store}]
    if settings.store_secret:
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION"):
            ref = {"name": settings.store_secret, "key": key, "optional": True}
            env.append({"name": key, "valueFrom": {"secretKeyRef": ref}})
    return env


def model_mount(model: ModelSource, settings: ClusterSettings) -> ModelMount:
    """Volumes for ``spec.model.uri``: a read-only PVC, an emptyDir filled from S3, or nothing."""
    uri = model.uri
    if uri.startswith("pvc://"):
        claim, _, path = uri.removeprefix("pvc://").partition("/")
        return ModelMount(
            f"{MODEL_DIR}/{path}".rstrip("/"),
            [{"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}],
            [{"name": "model", "mountPath": MODEL_DIR, "readOnly": True}],
            [],
        )
    if uri.startswith("s3://"):
        fetch = {
            "name": "fetch-model",
            "image": settings.fetch_image,
            "command": ["aws", "s3", "sync", "--only-show-errors", uri.rstrip("/") + "/", MODEL_DIR],
            "env": [e for e in _store_env(settings) if e["name"] != "POLYMORPH_STORE"]
            + [{"name": "HOME", "value": "/tmp"}],
            "volumeMounts": [
                {"name": "model", "mountPath": MODEL_DIR},
                {"name": "fetch-tmp", "mountPath": "/tmp"},
            ],
            "securityContext": _hardened(),
        }
        return ModelMount(
            MODEL_DIR,
            [{"name": "model", "emptyDir": {}}, {"name": "fetch-tmp", "emptyDir": {}}],
            [{"name": "model", "mountPath": MODEL_DIR, "readOnly": True}],
            [fetch],
        )
    # A plain path (or a model shape such as "tiny"): baked into the image or on the node; CPU and dev.
    return ModelMount(uri, [], [], [])


def tensor_parallel(hw: HardwareSpec) -> list[str]:
    """The engine's ``--tensor-parallel N`` for a pod of ``hw.count`` > 1 accelerators (one rank
    per GPU, all in this one pod; ``placement`` requests the N devices); none for one, or on CPU."""
    if hw.count <= 1 or hw.resource_name() is None:
        return []
    return ["--tensor-parallel", str(hw.count)]


def _selector_labels(md: ModelDeployment, track: str) -> dict[str, str]:
    return {LABEL_MODEL_DEPLOYMENT: md.metadata.name, LABEL_TRACK: track}


def serving_deployment(
    md: ModelDeployment, track: str, build_id: str, replicas: int, settings: ClusterSettings
) -> dict[str, Any]:
    """The stable (``<md>``) or canary (``<md>-canary``) Deployment serving ``build_id``."""
    if track not in ("stable", "canary"):
        raise ValueError(f"track must be stable or canary, not {track!r}")
    name = md.metadata.name if track == "stable" else canary_name(md.metadata.name)
    spec = md.spec
    engine = spec.engine
    place = placement(spec.hardware)
    mount = model_mount(spec.model, settings)
    labels = {**_selector_labels(md, track), LABEL_BUILD: build_label(build_id)}
    command = [
        "polymorph", "engine", "serve",
        "--model", mount.model_arg,
        "--build", build_id,
        "--store", settings.store,
        "--track", track,
        "--model-deployment", md.metadata.name,
        "--namespace", md.metadata.key[0],
        "--host", "0.0.0.0",
        "--port", str(engine.port),
        "--device", place.device,
        "--dtype", spec.model.dtype,
        "--max-seq-len", str(spec.model.maxSeqLen),
        "--build-cache", "/tmp/builds",
        *tensor_parallel(spec.hardware),
        *engine.args,
    ]  # fmt: skip
    resources = {
        "requests": {**engine.resources.requests, **place.resources.get("requests", {})},
        "limits": {**engine.resources.limits, **place.resources.get("limits", {})},
    }
    env = [
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "HOME", "value": "/tmp"},
        *_store_env(settings),
        *[e.model_dump(exclude_none=True) for e in engine.env],
    ]
    container = {
        "name": "engine",
        "image": engine.image,
        "imagePullPolicy": engine.imagePullPolicy,
        "command": command,
        "ports": [{"name": "http", "containerPort": engine.port, "protocol": "TCP"}],
        "env": env,
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5},
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, *mount.mounts],
        "securityContext": _hardened(),
    }
    if any(resources.values()):
        container["resources"] = {k: v for k, v in resources.items() if v}
    pod_spec: dict[str, Any] = {
        **_hardened_pod(),
        "initContainers": mount.init_containers,
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}, *mount.volumes],
        "nodeSelector": place.node_selector,
        "tolerations": place.tolerations,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(name, md, labels),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": _selector_labels(md, track)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": dict(SERVING_ROLLING_UPDATE)},
            "template": {
                "metadata": {
                    "labels": {LABEL_MANAGED_BY: MANAGED_BY, **labels},
                    "annotations": {
                        ANNOTATION_BUILD_ID: build_id,
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(engine.port),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {k: v for k, v in pod_spec.items() if v != [] and v != {}},
            },
        },
    }


def serving_service(md: ModelDeployment) -> dict[str, Any]:
    """One Service ``<md>`` selecting both tracks: the replica ratio is the traffic split."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(md.metadata.name, md, {LABEL_MODEL_DEPLOYMENT: md.metadata.name}),
        "spec": {
            "selector": {LABEL_MODEL_DEPLOYMENT: md.metadata.name},
            "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def _sandbox_doc(cj: CompileJob) -> dict[str, Any]:
    meta = {"name": cj.metadata.name, "namespace": cj.metadata.namespace, "uid": cj.metadata.uid}
    return {
        "apiVersion": cj.apiVersion,
        "kind": cj.kind,
        "metadata": meta,
        "spec": cj.spec.model_dump(mode="json", exclude_none=True),
    }


def sandbox_configmap(cj: CompileJob) -> dict[str, Any]:
    """The ConfigMap holding the resolved CompileJob the sandbox containers read (owned by the CompileJob).

    ``cj`` must be resolved (model, hardware and workload filled in, no deploymentRef): the
    sandbox reads it as a standalone job and never talks to the Kubernetes API.
    """
    if cj.spec.model is None or cj.spec.hardware is None:
        raise ValueError("the sandbox needs a resolved CompileJob with spec.model and spec.hardware")
    doc = json.dumps(_sandbox_doc(cj), sort_keys=True, indent=1)
    labels = {LABEL_COMPILEJOB: cj.metadata.name}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(configmap_name(cj.metadata.name), cj, labels),
        "data": {"compilejob.json": doc},
    }


def sandbox_job(cj: CompileJob, settings: ClusterSettings, max_batch: int | None = None) -> dict[str, Any]:
    """The Indexed Job running ``spec.budget.sandboxes`` sandbox pods for a resolved CompileJob.

    ``max_batch``: the batch the deployment's engines decode (``serving_max_batch`` of its
    ``spec.engine.args``); the sandbox benchmarks every build with caches of that many slots, as it
    will serve. None (a CompileJob of no deployment): the workload's concurrency."""
    spec = cj.spec
    if spec.model is None or spec.hardware is None:
        raise ValueError("the sandbox needs a resolved CompileJob with spec.model and spec.hardware")
    place = placement(spec.hardware)
    mount = model_mount(spec.model, settings)
    sandboxes = spec.budget.sandboxes
    labels = {LABEL_COMPILEJOB: cj.metadata.name}
    spec_mount = {"name": "spec", "mountPath": SANDBOX_SPEC_DIR, "readOnly": True}
    engine = {
        "name": "engine",
        "image": settings.sandbox_image,
        # A native sidecar: it starts before the agent and is stopped when the agent exits.
        "restartPolicy": "Always",
        "command": [
            "polymorph",
            "sandbox",
            "engine",
            "--spec",
            SANDBOX_SPEC_FILE,
            "--model",
            mount.model_arg,
            "--device",
            place.device,
            "--port",
            str(SANDBOX_ADMIN_PORT),
            "--workdir",
            "/tmp/work",
            *tensor_parallel(spec.hardware),
            *(["--max-batch", str(max_batch)] if max_batch is not None else []),
        ],
        "env": [{"name": "HOME", "value": "/tmp"}],
        "resources": place.resources,
        "volumeMounts": [spec_mount, {"name": "engine-tmp", "mountPath": "/tmp"}, *mount.mounts],
        "securityContext": _hardened(),
    }
    agent_env = [{"name": "HOME", "value": "/tmp"}, *_store_env(settings)]
    ref = spec.agent.apiKeySecretRef
    key_ref = {"name": ref.name, "key": ref.key} if ref is not None else None
    if key_ref is None and settings.anthropic_secret is not None:
        key_ref = {"name": settings.anthropic_secret[0], "key": settings.anthropic_secret[1]}
    if spec.agent.kind == "Claude" and key_ref is not None:
        agent_env.append({"name": "ANTHROPIC_API_KEY", "valueFrom": {"secretKeyRef": key_ref}})
    agent = {
        "name": "agent",
        "image": settings.sandbox_image,
        "command": [
            "polymorph",
            "sandbox",
            "agent",
            "--spec",
            SANDBOX_SPEC_FILE,
            "--store",
            settings.store,
            "--engine-url",
            f"http://127.0.0.1:{SANDBOX_ADMIN_PORT}",
        ],
        "env": agent_env,
        "volumeMounts": [spec_mount, {"name": "agent-tmp", "mountPath": "/tmp"}],
        "securityContext": _hardened(),
    }
    volumes = [
        {"name": "spec", "configMap": {"name": configmap_name(cj.metadata.name)}},
        {"name": "engine-tmp", "emptyDir": {}},
        {"name": "agent-tmp", "emptyDir": {}},
        *mount.volumes,
    ]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        **_hardened_pod(),
        "initContainers": [*mount.init_containers, engine],
        "containers": [agent],
        "volumes": volumes,
    }
    if place.node_selector:
        pod_spec["nodeSelector"] = place.node_selector
    if place.tolerations:
        pod_spec["tolerations"] = place.tolerations
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(cj.metadata.name, cj, labels),
        "spec": {
            "completionMode": "Indexed",
            "completions": sandboxes,
            "parallelism": sandboxes,
            "backoffLimit": 2 * sandboxes,
            "activeDeadlineSeconds": max(1, math.ceil(parse_duration(spec.budget.deadline))),  # whole seconds
            "template": {
                "metadata": {"labels": {LABEL_MANAGED_BY: MANAGED_BY, **labels}},
                "spec": pod_spec,
            },
        },
    }
