"""Custom objects are defaulted, pruned and validated against the CRD's openAPIV3Schema."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from support.k8s_emulator import prune_and_default, validate_object

MDS = "/apis/polymorph.dev/v1alpha1/namespaces/inference/modeldeployments"
WIDGETS = "/apis/example.dev/v1/namespaces/default/widgets"

WIDGET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "required": ["size"],
            "properties": {
                "size": {"type": "integer", "minimum": 1},
                "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
                "ratio": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "nullable": True},
                "port": {"x-kubernetes-int-or-string": True},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "tags": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
    },
}


def widget_crd() -> dict[str, Any]:
    version = {"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": WIDGET_SCHEMA}}
    names = {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"}
    spec = {"group": "example.dev", "scope": "Namespaced", "names": names, "versions": [version]}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.dev"},
        "spec": spec,
    }


@pytest.fixture
def widgets(api: httpx.Client) -> None:
    assert (
        api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=widget_crd()).status_code
        == 201
    )


def widget(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "example.dev/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": spec}


def test_defaults_and_pruning_as_pure_functions() -> None:
    unknown: list[str] = []
    obj = prune_and_default(
        widget(size=2, typo=1, extra={"free": {"form": 1}}), WIDGET_SCHEMA, "", unknown, top=True
    )
    assert obj["spec"] == {"size": 2, "mode": "a", "extra": {"free": {"form": 1}}}
    assert unknown == ["spec.typo"]
    assert validate_object(widget(size=0, port="http", ratio=None), WIDGET_SCHEMA)[0]["field"] == "spec.size"
    assert validate_object(widget(size=1, port=8080, ratio=0.5, tags={"a": "b"}), WIDGET_SCHEMA) == []


@pytest.mark.usefixtures("widgets")
def test_an_invalid_value_is_422_naming_the_field(api: httpx.Client) -> None:
    response = api.post(WIDGETS, json=widget(size=1, ratio=0))
    assert response.status_code == 422
    status = response.json()
    assert status["reason"] == "Invalid" and status["details"]["causes"][0]["field"] == "spec.ratio"
    assert "spec.ratio" in status["message"]
    missing = api.post(WIDGETS, json=widget(mode="a")).json()
    assert missing["details"]["causes"][0]["field"] == "spec.size"
    assert api.post(WIDGETS, json=widget(size=1, mode="c")).status_code == 422


@pytest.mark.usefixtures("widgets")
def test_patches_and_replacements_are_validated_too(api: httpx.Client) -> None:
    created = api.post(WIDGETS, json=widget(size=1)).json()
    assert created["spec"]["mode"] == "a"  # defaulted on create
    merge = {"Content-Type": "application/merge-patch+json"}
    assert api.patch(f"{WIDGETS}/w", json={"spec": {"size": -1}}, headers=merge).status_code == 422
    assert api.put(f"{WIDGETS}/w", json=created | {"spec": {"size": "big"}}).status_code == 422
    assert api.get(f"{WIDGETS}/w").json()["spec"]["size"] == 1


@pytest.mark.usefixtures("widgets")
def test_unknown_fields_are_pruned_with_a_warning_or_refused_when_strict(api: httpx.Client) -> None:
    pruned = api.post(WIDGETS, json=widget(size=1, sise=2))
    assert pruned.status_code == 201 and "sise" not in pruned.json()["spec"]
    assert pruned.headers["Warning"] == '299 - "unknown field \\"spec.sise\\""'
    api.delete(f"{WIDGETS}/w")
    strict = api.post(WIDGETS, params={"fieldValidation": "Strict"}, json=widget(size=1, sise=2))
    assert strict.status_code == 400
    assert 'strict decoding error: unknown field "spec.sise"' in strict.json()["message"]


@pytest.mark.usefixtures("crds")
def test_the_project_crds_validate_their_examples(api: httpx.Client) -> None:
    body = {"apiVersion": "polymorph.dev/v1alpha1", "kind": "ModelDeployment", "metadata": {"name": "m"}}
    wrong = body | {"spec": {"model": {"uri": "s3://m/"}, "hardware": {"accelerator": "tpu"}}}
    response = api.post(MDS, json=wrong)
    assert response.status_code == 422
    assert response.json()["details"]["causes"][0]["field"] == "spec.hardware.accelerator"


def test_deleting_the_crd_removes_its_objects_and_discovery(api: httpx.Client, widgets: None) -> None:
    api.post(WIDGETS, json=widget(size=1))
    assert (
        api.delete("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.dev").status_code
        == 200
    )
    assert api.get(WIDGETS).status_code == 404
    assert api.get("/apis/example.dev/v1").status_code == 404
