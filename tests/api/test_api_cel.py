"""The CRDs' CEL rules, evaluated by a CEL interpreter (cel-python), agree with ``polymorph validate``.

``cel_failures`` plays the API server's part: it walks a manifest beside the generated
``openAPIV3Schema``, binds ``self`` to each node that carries ``x-kubernetes-validations`` (numbers
typed by the schema, as the API server types them), evaluates every rule and reports
``(path + fieldPath, message)`` for each rule that does not hold. A rule that cannot be evaluated
(a field read without ``has()``, a type mismatch) fails the test, as it would fail the request.
The Kubernetes CEL list library's ``isSorted()`` is supplied here, since cel-python has only
standard CEL.
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Iterator
from functools import cache
from itertools import pairwise
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from celpy import celtypes

from polymorph import crdgen
from polymorph.contract.api.common import StrictModel
from polymorph.contract.api.rules import Rule
from polymorph.contract.validate import validate_document

EXAMPLES = Path(__file__).resolve().parents[2] / "crds" / "examples"
MD: dict[str, Any] = yaml.safe_load((EXAMPLES / "modeldeployment-full.yaml").read_text())
CJ: dict[str, Any] = yaml.safe_load((EXAMPLES / "compilejob-deploymentref.yaml").read_text())
STANDALONE: dict[str, Any] = yaml.safe_load((EXAMPLES / "compilejob-standalone.yaml").read_text())
_ENV = celpy.Environment()


def _schema(kind: str) -> dict[str, Any]:
    resource = next(r for r in crdgen.RESOURCES if r.kind == kind)
    schema: dict[str, Any] = crdgen.crd(resource)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


SCHEMAS = {kind: _schema(kind) for kind in ("ModelDeployment", "CompileJob")}


def _is_sorted(values: celtypes.ListType) -> celtypes.BoolType:
    """The Kubernetes CEL list library's ``<list>.isSorted()``."""
    return celtypes.BoolType(all(a <= b for a, b in pairwise(values)))


@cache
def _program(rule: str) -> celpy.Runner:
    return _ENV.program(_ENV.compile(rule), functions={"isSorted": _is_sorted})


def to_cel(value: Any, schema: dict[str, Any]) -> Any:
    """A JSON value as the API server hands it to CEL: typed by its schema (``number`` is double)."""
    if value is None:
        return None
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties") or {}
        return celtypes.MapType(
            {  # a field whose value is null is absent for CEL: has() is false, as on the API server
                celtypes.StringType(k): to_cel(v, props.get(k, extra))
                for k, v in value.items()
                if v is not None
            }
        )
    if isinstance(value, list):
        return celtypes.ListType([to_cel(v, schema.get("items", {})) for v in value])
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if schema.get("type") == "number" or isinstance(value, float):
        return celtypes.DoubleType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    return celtypes.StringType(value)


def _join(path: str, field_path: str) -> str:
    return (path + field_path).lstrip(".")


def cel_failures(value: Any, schema: dict[str, Any], path: str = "") -> list[tuple[str, str]]:
    """``(path, message)`` of every CEL rule the API server would find broken in ``value``."""
    if value is None:
        return []  # a null (nullable) field: the API server runs no rule on it
    failures: list[tuple[str, str]] = []
    for validation in schema.get("x-kubernetes-validations", []):
        try:
            result = _program(validation["rule"]).evaluate({"self": to_cel(value, schema)})
        except celpy.CELEvalError as exc:
            raise AssertionError(
                f"{path or '<root>'}: {validation['rule']} does not evaluate: {exc}"
            ) from exc
        if not isinstance(result, celtypes.BoolType):
            raise AssertionError(f"{path or '<root>'}: {validation['rule']} gives {result!r}, not a bool")
        if not result:
            failures.append((_join(path, validation.get("fieldPath", "")), validation["message"]))
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key, sub in value.items():
            sub_schema = props.get(key, schema.get("additionalProperties"))
            if isinstance(sub_schema, dict):
                where = f"{path}.{key}" if re.match(r"^[A-Za-z_][A-Za-z0-9_-]*$", key) else f"{path}[{key!r}]"
                failures += cel_failures(sub, sub_schema, where.lstrip("."))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            failures += cel_failures(item, schema["items"], f"{path}[{i}]")
    return failures


def check(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return cel_failures(doc, SCHEMAS[doc["kind"]])


def validate_lines(doc: dict[str, Any]) -> list[str]:
    _, _, lines = validate_document(copy.deepcopy(doc))
    return lines


# ---------------------------------------------------------------------------------------------
# Documents


def at(doc: dict[str, Any], path: str) -> Any:
    node: Any = doc
    for part in path.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def with_(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(base)
    *parents, leaf = path.split(".")
    node = at(doc, ".".join(parents)) if parents else doc
    if isinstance(node, list):
        node[int(leaf)] = value
    else:
        node[leaf] = value
    return doc


def without(base: dict[str, Any], path: str) -> dict[str, Any]:
    doc = copy.deepcopy(base)
    *parents, leaf = path.split(".")
    del (at(doc, ".".join(parents)) if parents else doc)[leaf]
    return doc


def _md_min(**spec: Any) -> dict[str, Any]:
    base = {"model": {"uri": "s3://models/m/"}, "hardware": {"accelerator": "cpu"}}
    return {
        "apiVersion": "polymorph.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "m"},
        "spec": {**base, **spec},
    }


_ENV_VAR = {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}

# Manifests that break exactly one rule: (id, document, the path where it is reported).
BROKEN: list[tuple[str, dict[str, Any], str]] = [
    ("weights-down", with_(MD, "spec.rollout.steps.1.weight", 20), "spec.rollout.steps"),
    ("weights-equal", with_(MD, "spec.rollout.steps.1.weight", 25), "spec.rollout.steps"),
    (
        "metric-both",
        with_(MD, "spec.rollout.analysis.metrics.0.query", "up"),
        "spec.rollout.analysis.metrics[0]",
    ),
    (
        "metric-neither",
        without(MD, "spec.rollout.analysis.metrics.2.query"),
        "spec.rollout.analysis.metrics[2]",
    ),
    (
        "metric-names",
        with_(MD, "spec.rollout.analysis.metrics.1.name", "throughput"),
        "spec.rollout.analysis.metrics",
    ),
    (
        "range-order",
        with_(MD, "spec.rollout.analysis.metrics.0.thresholdRange", {"min": 2, "max": 1.5}),
        "spec.rollout.analysis.metrics[0].thresholdRange.min",
    ),
    (
        "range-empty",
        with_(MD, "spec.rollout.analysis.metrics.0.thresholdRange", {}),
        "spec.rollout.analysis.metrics[0].thresholdRange",
    ),
    (
        "env-both",
        with_(MD, "spec.engine.env", [{**_ENV_VAR, "value": "x"}]),
        "spec.engine.env[0]",
    ),
    (
        "env-two-sources",
        with_(
            MD,
            "spec.engine.env",
            [
                {
                    "name": "A",
                    "valueFrom": {**_ENV_VAR["valueFrom"], "fieldRef": {"fieldPath": "metadata.name"}},
                }
            ],
        ),
        "spec.engine.env[0].valueFrom",
    ),
    (
        "env-no-source",
        with_(MD, "spec.engine.env", [{"name": "A", "valueFrom": {}}]),
        "spec.engine.env[0].valueFrom",
    ),
    (
        "md-claude",
        with_(MD, "spec.recompile.compile.agent", {"kind": "Claude"}),
        "spec.recompile.compile.agent.apiKeySecretRef",
    ),
    ("md-name", with_(MD, "metadata.name", "a" * 57), "metadata.name"),
    ("md-name-digit", with_(MD, "metadata.name", "8b-chat"), "metadata.name"),
    ("md-name-70", with_(MD, "metadata.name", "a" * 70), "metadata.name"),
    (
        "cj-both",
        {
            **CJ,
            "spec": {**CJ["spec"], "model": STANDALONE["spec"]["model"], "hardware": {"accelerator": "cpu"}},
        },
        "spec",
    ),
    ("cj-neither", {**STANDALONE, "spec": {"workload": STANDALONE["spec"]["workload"]}}, "spec"),
    ("cj-no-hardware", without(STANDALONE, "spec.hardware"), "spec.hardware"),
    ("cj-no-model", without(STANDALONE, "spec.model"), "spec.model"),
    ("cj-no-workload", without(STANDALONE, "spec.workload"), "spec.workload"),
    ("cj-claude", without(CJ, "spec.agent.apiKeySecretRef"), "spec.agent.apiKeySecretRef"),
    ("cj-name", with_(CJ, "metadata.name", "x" * 64), "metadata.name"),
    ("cj-name-70", with_(CJ, "metadata.name", "x" * 70), "metadata.name"),
    (
        "workload-both",
        with_(CJ, "spec.workload.traceUri", "s3://traces/a.jsonl"),
        "spec.workload",
    ),
    ("workload-neither", with_(CJ, "spec.workload", {}), "spec.workload"),
    (
        "histogram-lengths",
        with_(CJ, "spec.workload.profile.inputTokens.counts", [1, 2]),
        "spec.workload.profile.inputTokens.counts",
    ),
    (
        "histogram-order",
        with_(CJ, "spec.workload.profile.outputTokens.bounds", [64, 1024, 256]),
        "spec.workload.profile.outputTokens.bounds",
    ),
    (
        "histogram-repeat",
        with_(CJ, "spec.workload.profile.outputTokens.bounds", [64, 64, 256]),
        "spec.workload.profile.outputTokens.bounds",
    ),
    (
        "histogram-zero",
        with_(CJ, "spec.workload.profile.outputTokens.counts", [0, 0, 0]),
        "spec.workload.profile.outputTokens.counts",
    ),
    (
        "constraint-order",
        with_(CJ, "spec.objective.constraints", [{"metric": "itlP95Ms", "min": 5, "max": 1}]),
        "spec.objective.constraints[0].min",
    ),
    (
        "constraint-empty",
        with_(CJ, "spec.objective.constraints", [{"metric": "itlP95Ms"}]),
        "spec.objective.constraints[0]",
    ),
]

# Valid manifests that omit what the CRD has no default for: rules must guard with has().
VALID: list[tuple[str, dict[str, Any]]] = [
    *[(p.name, yaml.safe_load(p.read_text())) for p in sorted(EXAMPLES.glob("*.yaml"))],
    ("md-bare", _md_min()),
    ("md-rollout-without-steps", _md_min(rollout={"onFailure": "Pause", "analysis": {"interval": "2m"}})),
    ("md-agent-without-kind", _md_min(recompile={"compile": {"agent": {"model": "claude-sonnet-4-5"}}})),
    ("md-env", _md_min(engine={"env": [{"name": "A", "value": "1"}, _ENV_VAR]})),
    ("md-one-step", _md_min(rollout={"steps": [{"weight": 100}]})),
    ("md-range-equal", with_(MD, "spec.rollout.analysis.metrics.0.thresholdRange", {"min": 1, "max": 1})),
    ("cj-trace", with_(CJ, "spec.workload", {"traceUri": "s3://traces/a.jsonl"})),
    ("cj-live-profile", without(CJ, "spec.workload")),
]


# ---------------------------------------------------------------------------------------------
# Tests


@pytest.mark.parametrize(("case", "doc"), VALID, ids=[c[0] for c in VALID])
def test_valid_manifests_pass_every_rule(case: str, doc: dict[str, Any]) -> None:
    assert validate_lines(doc) == []
    assert check(doc) == []


@pytest.mark.parametrize(("case", "doc", "path"), BROKEN, ids=[c[0] for c in BROKEN])
def test_api_server_and_validate_give_the_same_sentence(case: str, doc: dict[str, Any], path: str) -> None:
    failures = check(doc)
    assert len(failures) == 1, failures
    ((where, message),) = failures
    assert where == path
    assert validate_lines(doc) == [f"{path}: {message}" if path else message]


def _models() -> Iterator[type[StrictModel]]:
    stack: list[type[StrictModel]] = [StrictModel]
    while stack:
        cls = stack.pop()
        yield cls
        stack += cls.__subclasses__()


def _model_rules() -> dict[str, Rule]:
    return {
        r.message: r
        for cls in _models()
        if cls.__module__.startswith("polymorph.contract.api")
        for r in cls.RULES
    }


def test_crd_rules_are_the_models_rules_and_each_is_tested() -> None:
    in_crds = {(v["rule"], v["message"]) for s in SCHEMAS.values() for _, v in _walk(s)}
    in_models = {(r.cel, r.message) for r in _model_rules().values()}
    assert in_crds == in_models
    broken = {message for _, doc, _ in BROKEN for _, message in check(doc)}
    assert broken == set(_model_rules()), f"rules without a failing case: {set(_model_rules()) - broken}"


def _walk(schema: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, str]]]:
    """Every (schema node, validation rule) pair below ``schema``."""
    for v in schema.get("x-kubernetes-validations", []):
        yield schema, v
    for sub in [
        *schema.get("properties", {}).values(),
        schema.get("items"),
        schema.get("additionalProperties"),
    ]:
        if isinstance(sub, dict):
            yield from _walk(sub)


def test_every_field_path_names_a_field_of_its_node() -> None:
    for schema in SCHEMAS.values():
        for node, validation in _walk(schema):
            if "fieldPath" in validation:
                target = node
                for part in validation["fieldPath"].lstrip(".").split("."):
                    assert part in target.get("properties", {}), validation
                    target = target["properties"][part]
            assert "\n" not in validation["message"]


def test_every_root_rule_names_its_field() -> None:
    """A rule on the whole object without a fieldPath is reported by the API server at ``<nil>``."""
    for kind, schema in SCHEMAS.items():
        for validation in schema.get("x-kubernetes-validations", []):
            assert validation.get("fieldPath"), (kind, validation)


def _iterates(rule: str, field: str) -> bool:
    return re.search(rf"self\.{field}\.(all|exists|exists_one|map|filter|isSorted)\(", rule) is not None


def test_lists_a_rule_iterates_have_max_items() -> None:
    """The API server rejects a CRD whose estimated CEL cost is unbounded; maxItems bounds it."""

    def walk(schema: dict[str, Any], path: str) -> Iterator[str]:
        props = schema.get("properties", {})
        for v in schema.get("x-kubernetes-validations", []):
            for name, sub in props.items():
                if sub.get("type") == "array" and _iterates(v["rule"], name) and "maxItems" not in sub:
                    yield f"{path}.{name}"
        for name, sub in props.items():
            carries = "x-kubernetes-validations" in sub.get("items", {})
            if sub.get("type") == "array" and carries and "maxItems" not in sub:
                yield f"{path}.{name}[*] carries rules but {name} has no maxItems"
            yield from walk(sub, f"{path}.{name}")
        if isinstance(schema.get("items"), dict):
            yield from walk(schema["items"], f"{path}[*]")

    for kind, schema in SCHEMAS.items():
        assert list(walk(schema, kind)) == []


def test_strings_a_rule_matches_have_max_length() -> None:
    """A regex over an unbounded string is estimated at the request size (3 MB) and the CRD rejected."""
    seen = 0
    for schema in SCHEMAS.values():
        for node, validation in _walk(schema):
            for path in re.findall(r"self\.([\w.]+)\.matches\(", validation["rule"]):
                target = node
                for part in path.split("."):
                    target = target["properties"][part]
                assert target["type"] == "string" and target["maxLength"] <= 253, (path, target)
                seen += 1
    assert seen >= 2


def test_a_rule_that_reads_an_absent_field_is_caught() -> None:
    """The evaluator is as strict as the API server: an unguarded optional field fails."""
    schema = {
        "type": "object",
        "properties": {"steps": {"type": "array", "items": {"type": "integer"}}},
        "x-kubernetes-validations": [{"rule": "self.steps.isSorted()", "message": "m"}],
    }
    assert cel_failures({"steps": [2, 1]}, schema) == [("", "m")]
    with pytest.raises(AssertionError, match="does not evaluate"):
        cel_failures({}, schema)


def _random_md(rng: random.Random) -> dict[str, Any]:
    steps = [{"weight": rng.randint(1, 100)} for _ in range(rng.randint(1, 4))]
    bounds = (
        sorted(rng.sample(range(1, 50), 3)) if rng.random() < 0.5 else [rng.randint(1, 9) for _ in range(3)]
    )
    threshold = {k: round(rng.uniform(0, 2), 1) for k in ("min", "max") if rng.random() < 0.6}
    doc = copy.deepcopy(STANDALONE)
    doc["spec"]["workload"]["profile"]["inputTokens"] = {
        "bounds": bounds,
        "counts": [rng.randint(0, 1) for _ in range(rng.choice([3, 3, 2]))],
    }
    md = _md_min(
        rollout={
            "steps": steps,
            "analysis": {"metrics": [{"name": "t", "builtin": "errorRate", "thresholdRange": threshold}]},
        }
    )
    return rng.choice([md, doc])


def test_cel_and_pydantic_agree_on_random_manifests() -> None:
    """A reference-versus-fast style check: the two statements of each rule never disagree."""
    rng = random.Random(11)
    verdicts = {True: 0, False: 0}
    for _ in range(400):
        doc = _random_md(rng)
        cel_ok = check(doc) == []
        assert cel_ok == (validate_lines(doc) == []), (doc, check(doc), validate_lines(doc))
        verdicts[cel_ok] += 1
    assert min(verdicts.values()) > 50  # both outcomes were exercised


def test_an_explicit_null_is_absent_for_cel_as_for_validate() -> None:
    """The API server keeps an explicit null on a nullable field, but CEL sees the field as absent
    (``has()`` is false), as validate reads null; the real server accepts this manifest
    (``tests/control_plane/test_cel_server.py``)."""
    doc = with_(CJ, "spec.workload.traceUri", None)
    assert validate_lines(doc) == []
    assert check(doc) == []
