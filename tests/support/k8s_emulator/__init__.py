"""A conformant-enough Kubernetes API server for tests: kmock 0.8's emulator with real API semantics.

``ConformantKubernetesEmulator`` subclasses ``kmock.KubernetesEmulator``. It keeps kmock's DSL (user
reactions such as ``emulator['get /api/v1/pods'] << 500`` take priority; iterating the emulator yields
the recorded requests; ``emulator.objects[res, ns, name].history`` holds every stored version) and
replaces its storage semantics with what the real kube-apiserver does, so kopf, kubectl and the
kubernetes client behave as they would against a cluster:

- Every write bumps a global ``resourceVersion``; objects get ``uid``, ``creationTimestamp`` and a
  ``generation`` that changes only when something other than metadata and status changes.
  ``generateName`` is honoured, and namespaced objects need an existing namespace.
- The status subresource is separated for built-ins that have one and for CRDs that declare it.
- Create answers 201; GET, LIST (``XxxList`` with ``metadata.resourceVersion``, label and field
  selectors, ``limit``/``continue``), PUT (409 on a stale ``resourceVersion``), PATCH (merge,
  strategic treated as merge, JSON-patch with a failed ``test`` giving 422, server-side apply
  approximated as create-or-merge), DELETE (finalizers keep the object with ``deletionTimestamp``;
  owner references cascade as the garbage collector would; ``propagationPolicy=Orphan`` orphans)
  and deletecollection.
- Watches honour ``resourceVersion`` (after it; absent or ``0``: synthetic ADDED events first),
  ``timeoutSeconds`` and selectors (an object leaving a selector is DELETED for that watch), answer
  ``application/json``, and send 410 Gone for a version older than the retained history.
- Discovery (``/api``, ``/apis``, ``/apis/<g>``, ``/apis/<g>/<v>``, ``/version``, ``/openapi/v3``)
  lists the built-in kinds the operator uses and every CRD created through ``apiextensions.k8s.io/v1``.
- Server-side Tables use a CRD's ``additionalPrinterColumns``, so ``kubectl get md`` prints them.
- Custom objects are defaulted, pruned and validated against the CRD's ``openAPIV3Schema`` with
  jsonschema: 422 ``Invalid`` naming the field; unknown fields are pruned with a ``Warning`` header,
  or refused with 400 "strict decoding error" under ``fieldValidation=Strict`` (kubectl's default),
  as the real server does.
- ``access_log`` records (verb, apiGroup, resource, subresource, namespace) per API request with RBAC
  verb names; ``GET /_emulator/access-log`` serves it to tests in another process.

Protobuf request bodies (kubectl's typed commands such as ``kubectl create namespace|secret|configmap``,
helm's release Secrets) are decoded for Namespace, Secret, ConfigMap and ServiceAccount; other kinds
get 415, as client-go never falls back to JSON. Responses are always JSON.

It is not a full server: no admission webhooks, no RBAC enforcement, no managed fields (server-side
apply is create-or-merge), strategic merge replaces lists, and there are no controllers (Deployments
never get pods; namespaces are deleted at once; tests patch ``/status`` themselves).

Running it: the ``k8s_emulator`` pytest fixture (a fresh ``EmulatorThread`` per test);
``python -m support.k8s_emulator --port N --ready-file F [--kubeconfig K] [--preload crds/]`` as a
process; ``write_kubeconfig`` points clients at it over plain http.
"""

from .resources import Access, ApiError, ResourceType, types_from_crd
from .running import EmulatorThread, k8s_emulator, main, write_kubeconfig
from .schemas import prune_and_default, validate_object
from .selectors import labels_match, parse_field_selector, parse_label_selector
from .server import WATCH_HISTORY, ConformantKubernetesEmulator

__all__ = [
    "WATCH_HISTORY",
    "Access",
    "ApiError",
    "ConformantKubernetesEmulator",
    "EmulatorThread",
    "ResourceType",
    "k8s_emulator",
    "labels_match",
    "main",
    "parse_field_selector",
    "parse_label_selector",
    "prune_and_default",
    "types_from_crd",
    "validate_object",
    "write_kubeconfig",
]
