"""Lists (kind, resourceVersion, selectors, pagination), discovery and server-side Tables."""

from __future__ import annotations

import httpx
import pytest

from support.k8s_emulator import labels_match, parse_label_selector

CMS = "/api/v1/namespaces/default/configmaps"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("app=a", {"app": "a"}, True),
        ("app==a", {"app": "b"}, False),
        ("app!=a", {}, True),
        ("app!=a", {"app": "a"}, False),
        ("tier in (x, y)", {"tier": "y"}, True),
        ("tier in (x,y)", {}, False),
        ("tier notin (x,y)", {}, True),
        ("tier notin (x,y)", {"tier": "x"}, False),
        ("tier", {"tier": ""}, True),
        ("!tier", {"tier": "x"}, False),
        ("!tier", {}, True),
        ("app=a,tier in (x),!gone", {"app": "a", "tier": "x"}, True),
        ("app=a,tier in (x),!gone", {"app": "a", "tier": "x", "gone": "1"}, False),
    ],
)
def test_label_selector_semantics(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert labels_match(parse_label_selector(selector), labels) is expected


def test_a_malformed_selector_is_refused(api: httpx.Client) -> None:
    with pytest.raises(ValueError):
        parse_label_selector("a in x")
    assert api.get(CMS, params={"labelSelector": "a in x"}).status_code == 400
    assert api.get(CMS, params={"fieldSelector": "spec.nope=1"}).status_code == 400


def _seed(api: httpx.Client) -> None:
    for name, labels in [("a", {"app": "x"}), ("b", {"app": "y"}), ("c", {})]:
        api.post(CMS, json={"metadata": {"name": name, "labels": labels}})
    api.post("/api/v1/namespaces/kube-system/configmaps", json={"metadata": {"name": "z"}})


def test_lists_carry_kind_api_version_and_resource_version(api: httpx.Client) -> None:
    _seed(api)
    listed = api.get(CMS).json()
    assert listed["kind"] == "ConfigMapList" and listed["apiVersion"] == "v1"
    assert int(listed["metadata"]["resourceVersion"]) > 0
    assert [i["metadata"]["name"] for i in listed["items"]] == ["a", "b", "c"]
    everywhere = api.get("/api/v1/configmaps").json()["items"]
    assert [i["metadata"]["name"] for i in everywhere] == ["a", "b", "c", "z"]


def test_label_and_field_selectors_filter(api: httpx.Client) -> None:
    _seed(api)

    def names(**params: str) -> list[str]:
        return [i["metadata"]["name"] for i in api.get("/api/v1/configmaps", params=params).json()["items"]]

    assert names(labelSelector="app") == ["a", "b"]
    assert names(labelSelector="app notin (x)") == ["b", "c", "z"]
    assert names(fieldSelector="metadata.name=b") == ["b"]
    assert names(fieldSelector="metadata.namespace!=default") == ["z"]


def test_limit_and_continue_page_through(api: httpx.Client) -> None:
    _seed(api)
    first = api.get(CMS, params={"limit": "2"}).json()
    assert [i["metadata"]["name"] for i in first["items"]] == ["a", "b"]
    assert first["metadata"]["remainingItemCount"] == 1
    rest = api.get(CMS, params={"limit": "2", "continue": first["metadata"]["continue"]}).json()
    assert [i["metadata"]["name"] for i in rest["items"]] == ["c"] and "continue" not in rest["metadata"]


def test_discovery(api: httpx.Client, crds: None) -> None:
    assert api.get("/api").json()["versions"] == ["v1"]
    groups = {g["name"] for g in api.get("/apis").json()["groups"]}
    assert {"apps", "batch", "events.k8s.io", "coordination.k8s.io", "polymorph.dev"} <= groups
    resources = api.get("/apis/polymorph.dev/v1alpha1").json()["resources"]
    by_name = {r["name"]: r for r in resources}
    assert by_name["modeldeployments"]["shortNames"] == ["md"] and by_name["modeldeployments"]["namespaced"]
    assert "modeldeployments/status" in by_name
    assert "deployments/status" in {r["name"] for r in api.get("/apis/apps/v1").json()["resources"]}
    assert api.get("/apis/kopf.dev/v1").status_code == 404
    assert api.get("/version").json()["major"] == "1"
    assert "apis/polymorph.dev/v1alpha1" in api.get("/openapi/v3").json()["paths"]


@pytest.mark.usefixtures("crds")
def test_table_uses_the_printer_columns(api: httpx.Client) -> None:
    url = "/apis/polymorph.dev/v1alpha1/namespaces/inference/modeldeployments"
    body = {
        "metadata": {"name": "m"},
        "spec": {"model": {"uri": "s3://m/"}, "hardware": {"accelerator": "cpu"}},
    }
    api.post(url, json=body)
    figures = dict.fromkeys(
        ["totalTokensPerSecond", "ttftP50Ms", "ttftP95Ms", "itlP50Ms", "itlP95Ms", "noise"], 1.0
    )
    build = {"shortId": "fast", "tokensPerSecond": 813, "figures": figures | {"outputTokensPerSecond": 812.5}}
    status = {"phase": "Serving", "activeBuild": build}
    merge = {"Content-Type": "application/merge-patch+json"}
    assert api.patch(f"{url}/m/status", json={"status": status}, headers=merge).status_code == 200
    table = api.get(url, headers={"Accept": TABLE}).json()
    assert table["kind"] == "Table"
    columns = [c["name"] for c in table["columnDefinitions"]]
    assert columns[:5] == ["Name", "Build", "Phase", "Drift", "Bench-Tok/s"] and columns[-1] == "Age"
    cells = table["rows"][0]["cells"]
    assert cells[:5] == ["m", "fast", "Serving", None, 813] and cells[-1].endswith("s")
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
