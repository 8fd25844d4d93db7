"""Object semantics: resourceVersion, uid, generation, generateName, status subresource, PUT, PATCH, DELETE."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

MDS = "/apis/polymorph.dev/v1alpha1/namespaces/inference/modeldeployments"
CMS = "/api/v1/namespaces/default/configmaps"


def md(name: str = "m", **spec: Any) -> dict[str, Any]:
    body = {"model": {"uri": "s3://models/m/"}, "hardware": {"accelerator": "cpu"}} | spec
    return {
        "apiVersion": "polymorph.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": body,
    }


def cm(name: str = "c", **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def merge(api: httpx.Client, url: str, patch: Any, kind: str = "merge") -> httpx.Response:
    return api.patch(url, json=patch, headers={"Content-Type": f"application/{kind}-patch+json"})


def test_create_answers_201_with_server_fields(api: httpx.Client) -> None:
    response = api.post(CMS, json=cm(a="1"))
    assert response.status_code == 201
    meta = response.json()["metadata"]
    assert meta["namespace"] == "default" and meta["generation"] == 1
    assert len(meta["uid"]) == 36 and meta["creationTimestamp"].endswith("Z") and meta["resourceVersion"]
    assert api.post(CMS, json=cm(a="1")).status_code == 409


def test_every_write_bumps_the_global_resource_version(api: httpx.Client) -> None:
    versions = [int(api.post(CMS, json=cm("a")).json()["metadata"]["resourceVersion"])]
    versions.append(int(api.post(CMS, json=cm("b")).json()["metadata"]["resourceVersion"]))
    versions.append(int(merge(api, f"{CMS}/a", {"data": {"x": "1"}}).json()["metadata"]["resourceVersion"]))
    versions.append(int(api.delete(f"{CMS}/b").json()["metadata"]["resourceVersion"]))
    assert versions == sorted(set(versions))
    listed = api.get(CMS).json()["metadata"]["resourceVersion"]
    assert int(listed) == versions[-1]
    same = merge(api, f"{CMS}/a", {"data": {"x": "1"}})  # a no-op patch stores nothing
    assert int(same.json()["metadata"]["resourceVersion"]) == versions[2]


def test_generate_name_and_missing_name(api: httpx.Client) -> None:
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "job-"}}
    names = {api.post(CMS, json=body).json()["metadata"]["name"] for _ in range(3)}
    assert len(names) == 3 and all(n.startswith("job-") and len(n) == 9 for n in names)
    assert api.post(CMS, json={"metadata": {}}).status_code == 422


def test_namespaced_create_needs_the_namespace(api: httpx.Client) -> None:
    response = api.post("/api/v1/namespaces/nowhere/configmaps", json=cm())
    assert response.status_code == 404 and response.json()["message"] == 'namespaces "nowhere" not found'
    names = [n["metadata"]["name"] for n in api.get("/api/v1/namespaces").json()["items"]]
    assert "default" in names and "kube-system" in names
    assert api.get("/api/v1/namespaces/default").json()["status"]["phase"] == "Active"


@pytest.mark.usefixtures("crds")
def test_generation_counts_spec_changes_only(api: httpx.Client) -> None:
    assert api.post(MDS, json=md()).status_code == 201
    url = f"{MDS}/m"
    assert merge(api, url, {"metadata": {"labels": {"a": "b"}}}).json()["metadata"]["generation"] == 1
    assert merge(api, f"{url}/status", {"status": {"phase": "Serving"}}).json()["metadata"]["generation"] == 1
    assert merge(api, url, {"spec": {"replicas": 3}}).json()["metadata"]["generation"] == 2


@pytest.mark.usefixtures("crds")
def test_status_subresource_is_separated(api: httpx.Client) -> None:
    created = api.post(MDS, json=md() | {"status": {"phase": "Ignored"}}).json()
    assert "status" not in created
    url = f"{MDS}/m"
    main = merge(api, url, {"spec": {"replicas": 2}, "status": {"phase": "Ignored"}}).json()
    assert "status" not in main and main["spec"]["replicas"] == 2
    status = merge(api, f"{url}/status", {"spec": {"replicas": 9}, "status": {"phase": "Serving"}}).json()
    assert status["status"] == {"phase": "Serving"} and status["spec"]["replicas"] == 2
    assert api.get(url).json()["status"] == {"phase": "Serving"}
    assert merge(api, f"{CMS}/x/status", {"status": {}}).status_code == 404  # configmaps have no /status


def test_put_replaces_and_refuses_a_stale_resource_version(api: httpx.Client) -> None:
    created = api.post(CMS, json=cm(a="1", b="2")).json()
    replaced = api.put(f"{CMS}/c", json=created | {"data": {"a": "3"}})
    assert replaced.status_code == 200 and replaced.json()["data"] == {"a": "3"}
    assert replaced.json()["metadata"]["uid"] == created["metadata"]["uid"]
    stale = api.put(f"{CMS}/c", json=created | {"data": {"a": "4"}})
    assert stale.status_code == 409 and stale.json()["reason"] == "Conflict"
    assert api.put(f"{CMS}/missing", json=cm("missing")).status_code == 404


def test_patch_kinds(api: httpx.Client) -> None:
    api.post(CMS, json=cm(a="1", b="2") | {"metadata": {"name": "c", "labels": {"x": "1"}}})
    url = f"{CMS}/c"
    assert merge(api, url, {"data": {"a": None, "c": "3"}}).json()["data"] == {"b": "2", "c": "3"}
    strategic = merge(api, url, {"$setElementOrder/x": [], "data": {"d": "4"}}, kind="strategic-merge")
    assert strategic.json()["data"] == {"b": "2", "c": "3", "d": "4"}
    ops = [
        {"op": "test", "path": "/data/b", "value": "2"},
        {"op": "replace", "path": "/data/b", "value": "5"},
    ]
    assert merge(api, url, ops, kind="json").json()["data"]["b"] == "5"
    failed = merge(api, url, [{"op": "test", "path": "/data/b", "value": "2"}], kind="json")
    assert failed.status_code == 422 and failed.json()["kind"] == "Status"
    assert api.get(url).json()["data"]["b"] == "5"


@pytest.mark.usefixtures("crds")
def test_custom_resources_refuse_strategic_merge(api: httpx.Client) -> None:
    api.post(MDS, json=md())
    assert merge(api, f"{MDS}/m", {"spec": {"replicas": 2}}, kind="strategic-merge").status_code == 415


def test_finalizers_keep_the_object_until_removed(api: httpx.Client) -> None:
    api.post(CMS, json=cm() | {"metadata": {"name": "c", "finalizers": ["x/y"]}})
    marked = api.delete(f"{CMS}/c").json()
    assert marked["metadata"]["deletionTimestamp"]
    assert api.get(f"{CMS}/c").status_code == 200
    assert merge(api, f"{CMS}/c", {"metadata": {"finalizers": ["x/y", "new/one"]}}).status_code == 422
    merge(api, f"{CMS}/c", {"metadata": {"finalizers": None}})
    assert api.get(f"{CMS}/c").status_code == 404


def _owned(name: str, owner: dict[str, Any]) -> dict[str, Any]:
    ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
    }
    return cm(name) | {"metadata": {"name": name, "ownerReferences": [ref]}}


def test_delete_cascades_through_owner_references(api: httpx.Client) -> None:
    owner = api.post(CMS, json=cm("owner")).json()
    child = api.post(CMS, json=_owned("child", owner)).json()
    api.post(CMS, json=_owned("grandchild", child))
    api.post(CMS, json=cm("bystander"))
    assert api.delete(f"{CMS}/owner").status_code == 200
    assert [i["metadata"]["name"] for i in api.get(CMS).json()["items"]] == ["bystander"]


def test_orphan_propagation_keeps_dependents(api: httpx.Client) -> None:
    owner = api.post(CMS, json=cm("owner")).json()
    api.post(CMS, json=_owned("child", owner))
    api.request("DELETE", f"{CMS}/owner", json={"propagationPolicy": "Orphan"})
    assert api.get(f"{CMS}/child").json()["metadata"]["ownerReferences"] == []


def test_deleting_a_namespace_deletes_its_objects(api: httpx.Client) -> None:
    api.post("/api/v1/namespaces", json={"metadata": {"name": "tmp"}})
    api.post("/api/v1/namespaces/tmp/configmaps", json=cm())
    assert api.delete("/api/v1/namespaces/tmp").status_code == 200
    assert api.get("/api/v1/namespaces/tmp/configmaps/c").status_code == 404


def test_events_are_stored_in_both_groups(api: httpx.Client) -> None:
    core = {
        "metadata": {"generateName": "e-"},
        "reason": "Promoted",
        "involvedObject": {"kind": "ModelDeployment", "name": "m"},
    }
    new = {
        "metadata": {"generateName": "e-"},
        "reason": "RolledBack",
        "regarding": {"kind": "ModelDeployment", "name": "m"},
    }
    assert api.post("/api/v1/namespaces/default/events", json=core).status_code == 201
    assert api.post("/apis/events.k8s.io/v1/namespaces/default/events", json=new).status_code == 201
    selected = api.get(
        "/api/v1/events", params={"fieldSelector": "involvedObject.name=m,reason=Promoted"}
    ).json()
    assert [e["reason"] for e in selected["items"]] == ["Promoted"]
    assert api.get("/apis/events.k8s.io/v1/events").json()["items"][0]["reason"] == "RolledBack"


def test_access_log_uses_rbac_verbs(api: httpx.Client, k8s_emulator: Any) -> None:
    api.post(CMS, json=cm())
    api.get(CMS)
    api.get(f"{CMS}/c")
    merge(api, f"{CMS}/c", {"data": {}})
    api.put(f"{CMS}/c", json=cm())
    api.delete(f"{CMS}/c")
    api.get("/apis/apps/v1/deployments", params={"watch": "true", "timeoutSeconds": "0"})
    verbs = [(a.verb, a.api_group, a.resource, a.namespace) for a in k8s_emulator.emulator.access_log]
    assert verbs == [
        ("create", "", "configmaps", "default"),
        ("list", "", "configmaps", "default"),
        ("get", "", "configmaps", "default"),
        ("patch", "", "configmaps", "default"),
        ("update", "", "configmaps", "default"),
        ("delete", "", "configmaps", "default"),
        ("watch", "apps", "deployments", ""),
    ]
    assert api.get("/_emulator/access-log").json()[0]["verb"] == "create"


def test_deletecollection_honours_the_selector_and_cascades(api: httpx.Client) -> None:
    owner = api.post(
        CMS, json=cm("owner") | {"metadata": {"name": "owner", "labels": {"gone": "yes"}}}
    ).json()
    child = _owned("child", owner)
    child["metadata"]["labels"] = {"gone": "yes"}
    api.post(CMS, json=child)
    api.post(CMS, json=cm("kept"))
    assert api.delete(CMS, params={"labelSelector": "gone=yes"}).status_code == 200
    assert [i["metadata"]["name"] for i in api.get(CMS).json()["items"]] == ["kept"]
