"""Real kopf runs a trivial operator against the emulator: each handler fires exactly once per change.

kopf keeps its progress and diff-base in ``status`` (as the operator will), so this also shows that
the status subresource, resourceVersion ordering and watch resumption hold up under a real client.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import kopf
import pytest
from kopf.testing import KopfRunner

from support.k8s_emulator import EmulatorThread

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
GADGETS = "/apis/example.dev/v1/namespaces/default/gadgets"
MERGE = {"Content-Type": "application/merge-patch+json"}


def gadget_crd() -> dict[str, Any]:
    schema = {
        "type": "object",
        "properties": {
            "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
    }
    version = {
        "name": "v1",
        "served": True,
        "storage": True,
        "subresources": {"status": {}},
        "schema": {"openAPIV3Schema": schema},
    }
    names = {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"}
    spec = {"group": "example.dev", "scope": "Namespaced", "names": names, "versions": [version]}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": "gadgets.example.dev"}, "spec": spec}  # fmt: skip


def operator(server: str, calls: Counter[str]) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.progress_storage = kopf.StatusProgressStorage()
        settings.persistence.diffbase_storage = kopf.StatusDiffBaseStorage()
        settings.posting.enabled = True
        settings.watching.server_timeout = 5

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=server)  # plain http to the emulator, no credentials

    @kopf.on.create("example.dev", "v1", "gadgets", id="created", registry=registry)
    def created(retry: int, **_: Any) -> dict[str, str]:
        calls["create"] += 1
        if retry == 0:
            raise kopf.TemporaryError("once more", delay=0.2)  # forces progress into status
        return {"seen": "yes"}

    @kopf.on.update("example.dev", "v1", "gadgets", id="updated", registry=registry)
    def updated(body: kopf.Body, **_: Any) -> None:
        calls["update"] += 1
        kopf.info(body, reason="Resized", message=f"size {body['spec']['size']}")

    @kopf.on.delete("example.dev", "v1", "gadgets", id="deleted", registry=registry)
    def deleted(**_: Any) -> None:
        calls["delete"] += 1

    return registry


def wait_for(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the operator")
        time.sleep(0.05)


@pytest.mark.timeout(60)
def test_kopf_handlers_fire_exactly_once_per_change(
    k8s_emulator: EmulatorThread,
) -> None:
    calls: Counter[str] = Counter()
    with httpx.Client(base_url=k8s_emulator.url, timeout=10) as api:
        assert api.post(CRDS, json=gadget_crd()).status_code == 201
        runner = KopfRunner(
            ["run", "--standalone", "--all-namespaces"], registry=operator(k8s_emulator.url, calls)
        )
        with runner:
            body = {
                "apiVersion": "example.dev/v1",
                "kind": "Gadget",
                "metadata": {"name": "g"},
                "spec": {"size": 1},
            }
            assert api.post(GADGETS, json=body).status_code == 201
            wait_for(
                lambda: api.get(f"{GADGETS}/g").json().get("status", {}).get("created") == {"seen": "yes"}
            )
            for updates, size in enumerate((2, 3), start=1):
                api.patch(f"{GADGETS}/g", json={"spec": {"size": size}}, headers=MERGE)
                wait_for(lambda: calls["update"] == updates)  # noqa: B023 (waited for right here)
            time.sleep(0.5)  # room for any duplicate to show up
            wait_for(
                lambda: (
                    len(api.get("/api/v1/events", params={"fieldSelector": "reason=Resized"}).json()["items"])
                    == 2
                )
            )
            api.delete(f"{GADGETS}/g")
            wait_for(lambda: api.get(f"{GADGETS}/g").status_code == 404)
            time.sleep(0.3)
        assert runner.exception is None, runner.output
        assert calls == Counter({"create": 2, "update": 2, "delete": 1})  # create: one retry, then success
        history = k8s_emulator.call(
            lambda e: [
                v.raw for v in e.objects["example.dev/v1/gadgets", "default", "g"].history if v is not None
            ]
        )
        assert any((v.get("status") or {}).get("kopf", {}).get("progress") for v in history)
        assert all(
            not k.startswith("kopf.zalando.org")
            for v in history
            for k in v["metadata"].get("annotations", {})
        )
        reasons = [
            (e["reason"], e["involvedObject"]["name"]) for e in api.get("/api/v1/events").json()["items"]
        ]
        assert reasons.count(("Resized", "g")) == 2


def peering_crd() -> dict[str, Any]:
    """kopf's cluster-wide peering CRD, as kopf ships it."""
    schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    version = {"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}
    names = {"kind": "ClusterKopfPeering", "plural": "clusterkopfpeerings", "singular": "clusterkopfpeering"}
    spec = {"scope": "Cluster", "group": "kopf.dev", "names": names, "versions": [version]}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": "clusterkopfpeerings.kopf.dev"}, "spec": spec}  # fmt: skip


@pytest.mark.timeout(60)
def test_kopf_peering_registers_the_operator(k8s_emulator: EmulatorThread) -> None:
    peerings = "/apis/kopf.dev/v1/clusterkopfpeerings"
    calls: Counter[str] = Counter()
    with httpx.Client(base_url=k8s_emulator.url, timeout=10) as api:
        assert api.post(CRDS, json=peering_crd()).status_code == 201
        assert api.post(CRDS, json=gadget_crd()).status_code == 201
        peering = {
            "apiVersion": "kopf.dev/v1",
            "kind": "ClusterKopfPeering",
            "metadata": {"name": "polymorph"},
        }
        assert api.post(peerings, json=peering).status_code == 201
        runner = KopfRunner(
            ["run", "--peering=polymorph", "--all-namespaces"], registry=operator(k8s_emulator.url, calls)
        )
        with runner:
            wait_for(lambda: bool(api.get(f"{peerings}/polymorph").json().get("status")))
            (peer,) = api.get(f"{peerings}/polymorph").json()["status"].values()
            assert {"priority", "lifetime", "lastseen"} <= set(peer)
            body = {
                "apiVersion": "example.dev/v1",
                "kind": "Gadget",
                "metadata": {"name": "g"},
                "spec": {"size": 1},
            }
            api.post(GADGETS, json=body)
            wait_for(lambda: calls["create"] == 2)
        assert runner.exception is None, runner.output
        assert not api.get(f"{peerings}/polymorph").json().get("status")  # a clean exit leaves the peering
