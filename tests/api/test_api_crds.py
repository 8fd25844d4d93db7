"""Generated CRDs: structural, deterministic, committed up to date, and agreeing with the models."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError

from polymorph import crdgen
from polymorph.cli import main
from polymorph.contract.api import CompileJob, ModelDeployment
from support import yamls

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "crds" / "examples").glob("*.yaml"))
MODELS = {"ModelDeployment": ModelDeployment, "CompileJob": CompileJob}


def schema_of(kind: str) -> dict[str, Any]:
    resource = next(r for r in crdgen.RESOURCES if r.kind == kind)
    return crdgen.crd(resource)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_committed_crds_are_up_to_date(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    assert main(["crds", "--check"]) == 0, capsys.readouterr().out
    assert (REPO / "charts/polymorph/crds/polymorph.dev_modeldeployments.yaml").is_file()
    for resource in crdgen.RESOURCES:
        for directory in crdgen.DEFAULT_DIRS:
            assert (REPO / directory / resource.filename).read_text() == crdgen.render(resource)


def test_generation_is_deterministic() -> None:
    assert crdgen.render_all() == crdgen.render_all()
    docs = list(yamls.load_all(crdgen.render_all()))
    assert [d["spec"]["names"]["kind"] for d in docs] == ["ModelDeployment", "CompileJob"]


def test_check_reports_each_stale_file_and_output_fixes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["crds", "--check", str(tmp_path)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all("missing" in line for line in lines)

    assert main(["crds", "--output", str(tmp_path / "a"), "--output", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    assert main(["crds", "--check", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    capsys.readouterr()

    md = tmp_path / "a" / "polymorph.dev_modeldeployments.yaml"
    md.write_text(md.read_text().replace("shortNames:\n    - md", "shortNames:\n    - mdx"))
    assert main(["crds", "--check", str(tmp_path / "a")]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [
        f"{md} is stale (it differs from the models); run `polymorph crds --output {tmp_path / 'a'}`"
    ]


def test_print_is_both_crds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crds"]) == 0
    docs = list(yamls.load_all(capsys.readouterr().out))
    assert [d["metadata"]["name"] for d in docs] == [
        "modeldeployments.polymorph.dev",
        "compilejobs.polymorph.dev",
    ]


def test_output_into_a_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    assert main(["crds", "--output", str(target)]) == 2
    assert "is a file" in capsys.readouterr().err


@pytest.mark.parametrize("resource", crdgen.RESOURCES, ids=lambda r: r.kind)
def test_crd_shape(resource: crdgen.Resource) -> None:
    crd = crdgen.crd(resource)
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    spec = crd["spec"]
    assert spec["group"] == "polymorph.dev" and spec["scope"] == "Namespaced"
    assert spec["names"]["categories"] == ["polymorph"]
    assert spec["names"]["shortNames"] == [{"ModelDeployment": "md", "CompileJob": "cj"}[resource.kind]]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    schema = version["schema"]["openAPIV3Schema"]
    assert crdgen.structural_problems(schema) == []
    assert set(schema["properties"]) == {"apiVersion", "kind", "metadata", "spec", "status"}
    assert (
        schema["properties"]["status"]["x-kubernetes-preserve-unknown-fields"] is True
    )  # kopf's status.kopf
    assert "$ref" not in crdgen.render(resource) and "additionalProperties: false" not in crdgen.render(
        resource
    )


def _resolve(schema: dict[str, Any], json_path: str) -> dict[str, Any]:
    node = schema
    for part in json_path.strip(".").split("."):
        node = node["properties"][part]
    return node


@pytest.mark.parametrize("resource", crdgen.RESOURCES, ids=lambda r: r.kind)
def test_printer_columns_point_at_real_fields(resource: crdgen.Resource) -> None:
    schema = schema_of(resource.kind)
    kinds = {"string": "string", "number": "number", "integer": "integer"}
    names = [c["name"] for c in resource.columns]
    for column in resource.columns:
        if column["jsonPath"].startswith(".metadata"):
            continue
        node = _resolve(schema, column["jsonPath"])
        assert node["type"] == kinds[column["type"]], column
    expected = {
        "ModelDeployment": {"Build", "Phase", "Drift", "Bench-Tok/s"},
        "CompileJob": {"Phase", "Experiments", "Speedup"},
    }
    assert expected[resource.kind] <= set(names)


def test_schema_carries_validation_and_nullability() -> None:
    md = schema_of("ModelDeployment")
    spec = md["properties"]["spec"]
    assert spec["required"] == ["model", "hardware"]
    assert spec["properties"]["replicas"]["minimum"] == 0
    assert spec["properties"]["build"]["properties"]["policy"]["enum"] == ["Auto", "Manual"]
    assert spec["properties"]["build"]["properties"]["pinned"]["nullable"] is True
    assert "pattern" in spec["properties"]["recompile"]["properties"]["window"]
    drift = spec["properties"]["recompile"]["properties"]["driftThreshold"]
    assert (drift["minimum"], drift["exclusiveMinimum"], drift["maximum"]) == (0, True, 1)
    steps = spec["properties"]["rollout"]["properties"]["steps"]
    assert steps["minItems"] == 1 and steps["items"]["properties"]["weight"]["maximum"] == 100
    rules = [r["rule"] for r in spec["properties"]["rollout"]["x-kubernetes-validations"]]
    assert any("isSorted" in r for r in rules)
    cj = schema_of("CompileJob")["properties"]["spec"]
    assert any("deploymentRef" in r["rule"] for r in cj["x-kubernetes-validations"])
    cpu = spec["properties"]["engine"]["properties"]["resources"]["properties"]["limits"][
        "additionalProperties"
    ]
    assert cpu["x-kubernetes-int-or-string"] is True


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate_against_model_and_generated_schema(path: Path) -> None:
    docs = list(yamls.load_all(path.read_text()))
    assert docs
    for doc in docs:
        MODELS[doc["kind"]].model_validate(doc)
        jsonschema.validate(doc, crdgen.crd_json_schema(schema_of(doc["kind"])))


def test_all_four_examples_exist() -> None:
    assert {p.name for p in EXAMPLES} >= {
        "modeldeployment-minimal.yaml",
        "modeldeployment-full.yaml",
        "compilejob-deploymentref.yaml",
        "compilejob-standalone.yaml",
    }


def _example(name: str) -> dict[str, Any]:
    return yamls.load((REPO / "crds" / "examples" / name).read_text())


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("spec.replicas", -1),
        ("spec.replicas", "four"),
        ("spec.model.dtype", "int8"),
        ("spec.hardware.accelerator", "tpu"),
        ("spec.build.policy", "auto"),
        ("spec.build.pinned", "sha256:xyz"),
        ("spec.recompile.window", "5 minutes"),
        ("spec.recompile.driftThreshold", 0),
        ("spec.rollout.onFailure", "Explode"),
        ("spec.rollout.analysis.noDataPolicy", "Skip"),
        ("spec.rollout.steps", []),
        ("spec.model", None),
    ],
)
def test_schema_and_model_reject_the_same_single_field_errors(path: str, value: Any) -> None:
    doc = copy.deepcopy(_example("modeldeployment-full.yaml"))
    *parents, leaf = path.split(".")
    node = doc
    for part in parents:
        node = node[part]
    node[leaf] = value
    with pytest.raises(ValidationError):
        ModelDeployment.model_validate(doc)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, crdgen.crd_json_schema(schema_of("ModelDeployment")))


def _rule_nodes(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, schema)] if "x-kubernetes-validations" in schema else []
    for name, sub in schema.get("properties", {}).items():
        found += _rule_nodes(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += _rule_nodes(schema[key], f"{path}[*]")
    return found


@pytest.mark.parametrize("resource", crdgen.RESOURCES, ids=lambda r: r.kind)
def test_cel_rules_name_only_fields_of_their_node(resource: crdgen.Resource) -> None:
    nodes = _rule_nodes(schema_of(resource.kind))
    assert nodes, "cross-field rules should reach the CRD as CEL"
    for path, node in nodes:
        for validation in node["x-kubernetes-validations"]:
            assert validation["message"] and validation["rule"]
            for field in re.findall(r"self\.(\w+)", validation["rule"]):
                assert field in node["properties"], (
                    f"{path}: {validation['rule']} names unknown field {field}"
                )
