"""``polymorph validate`` and ``load_manifest``: one clear line per problem, never a traceback."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from polymorph.cli import main
from polymorph.contract.api import CompileJob, ModelDeployment, ModelDeploymentSpec
from polymorph.contract.errors import UsageError
from polymorph.contract.validate import check_text, format_path, format_validation_error, load_manifest
from polymorph.contract.yaml_input import MAX_YAML_NODES, load_yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "crds" / "examples"
MD: dict[str, Any] = yaml.safe_load((EXAMPLES / "modeldeployment-full.yaml").read_text())
CJ: dict[str, Any] = yaml.safe_load((EXAMPLES / "compilejob-deploymentref.yaml").read_text())
STANDALONE: dict[str, Any] = yaml.safe_load((EXAMPLES / "compilejob-standalone.yaml").read_text())


def run_validate(capsys: pytest.CaptureFixture[str], *paths: Path | str) -> tuple[int, list[str]]:
    code = main(["validate", *map(str, paths)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return code, (captured.out + captured.err).strip().splitlines()


def write(tmp_path: Path, text: str, name: str = "m.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def edit(base: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    doc = copy.deepcopy(base)
    change(doc)
    return doc


def test_examples_are_ok(capsys: pytest.CaptureFixture[str]) -> None:
    paths = sorted(EXAMPLES.glob("*.yaml"))
    code, lines = run_validate(capsys, *paths)
    assert code == 0
    assert f"{EXAMPLES / 'modeldeployment-full.yaml'}: ok (ModelDeployment/llama-8b-chat)" in lines
    assert f"{EXAMPLES / 'compilejob-deploymentref.yaml'}: ok (CompileJob/llama-8b-chat-7f3a)" in lines
    assert len(lines) == len(paths)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        node: Any = doc
        *parents, leaf = path.split(".")
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node[int(leaf)] = value
        else:
            node[leaf] = value

    return change


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        node: Any = doc
        *parents, leaf = path.split(".")
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        del node[leaf]

    return change


# (base document, change, the expected "path: message" fragment)
INVALID: list[tuple[str, dict[str, Any], Callable[[dict[str, Any]], None], str]] = [
    (
        "typo",
        MD,
        _set("spec.replcas", 3),
        "spec: unknown field 'replcas' (allowed: model, hardware, replicas,",
    ),
    ("typo-hint", MD, _set("spec.replcas", 3), "did you mean 'replicas'?"),
    ("enum", MD, _set("spec.build.policy", "auto"), "spec.build.policy: must be one of Auto, Manual"),
    ("negative", MD, _set("spec.replicas", -1), "spec.replicas: must be >= 0"),
    ("not-int", MD, _set("spec.replicas", "four"), "spec.replicas: must be an integer"),
    ("string-int", MD, _set("spec.replicas", "4"), "spec.replicas: must be an integer"),
    ("float-int", MD, _set("spec.replicas", 1.5), "spec.replicas: must be an integer (got 1.5)"),
    (
        "float-whole",
        MD,
        _set("spec.replicas", 2.0),
        "spec.replicas: must be an integer written without a decimal point",
    ),
    (
        "int-key",
        MD,
        lambda d: d["spec"]["hardware"].__setitem__(5, 1),
        "spec.hardware: unknown field '5'",  # a whole-number key is a string key, as kubectl sends it
    ),
    ("bool-int", MD, _set("spec.replicas", True), "spec.replicas: must be an integer (got true)"),
    (
        "weight-high",
        MD,
        _set("spec.rollout.steps.1.weight", 101),
        "spec.rollout.steps[1].weight: must be <= 100",
    ),
    ("weight-zero", MD, _set("spec.rollout.steps.0.weight", 0), "spec.rollout.steps[0].weight: must be >= 1"),
    (
        "weight-order",
        MD,
        _set("spec.rollout.steps.1.weight", 20),
        "spec.rollout.steps: step weights must be strictly increasing, each step above the one before",
    ),
    (
        "weight-equal",
        MD,
        _set("spec.rollout.steps.1.weight", 25),
        "spec.rollout.steps: step weights must be strictly increasing",
    ),
    ("no-steps", MD, _set("spec.rollout.steps", []), "spec.rollout.steps: must have at least 1 item"),
    (
        "duration",
        MD,
        _set("spec.recompile.window", "30 minutes"),
        "spec.recompile.window: must be a duration",
    ),
    (
        "duration-zero",
        MD,
        _set("spec.recompile.cooldown", "0h"),
        "spec.recompile.cooldown: must be a duration",
    ),
    (
        "drift-zero",
        MD,
        _set("spec.recompile.driftThreshold", 0),
        "spec.recompile.driftThreshold: must be > 0",
    ),
    (
        "drift-high",
        MD,
        _set("spec.recompile.driftThreshold", 1.5),
        "spec.recompile.driftThreshold: must be <= 1",
    ),
    (
        "dtype",
        MD,
        _set("spec.model.dtype", "int4"),
        "spec.model.dtype: must be one of bfloat16, float16, float32",
    ),
    (
        "accelerator",
        MD,
        _set("spec.hardware.accelerator", "tpu"),
        "spec.hardware.accelerator: must be one of cpu,",
    ),
    ("model-missing", MD, _drop("spec.model"), "spec.model: is required"),
    ("uri-missing", MD, _drop("spec.model.uri"), "spec.model.uri: is required"),
    (
        "uri-scheme",
        MD,
        _set("spec.model.uri", "http://x/m"),
        "spec.model.uri: 'http://x/m' is not a model location",
    ),
    (
        "pinned",
        MD,
        _set("spec.build.pinned", "sha256:abc"),
        "spec.build.pinned: must be 'reference' or a build id",
    ),
    (
        "metric-both",
        MD,
        _set("spec.rollout.analysis.metrics.0.query", "up"),
        "spec.rollout.analysis.metrics[0]: a metric needs exactly one of builtin or query",
    ),
    (
        "metric-neither",
        MD,
        _drop("spec.rollout.analysis.metrics.2.query"),
        "spec.rollout.analysis.metrics[2]: a metric needs exactly one of builtin or query",
    ),
    (
        "range",
        MD,
        _set("spec.rollout.analysis.metrics.0.thresholdRange", {"min": 2, "max": 1}),
        "spec.rollout.analysis.metrics[0].thresholdRange.min: thresholdRange min must be <= max",
    ),
    (
        "builtin",
        MD,
        _set("spec.rollout.analysis.metrics.0.builtin", "latency"),
        "spec.rollout.analysis.metrics[0].builtin: must be one of outputTokensPerSecondRatio,",
    ),
    (
        "no-data",
        MD,
        _set("spec.rollout.analysis.noDataPolicy", "Skip"),
        "must be one of Inconclusive, Pass, Fail",
    ),
    (
        "on-failure",
        MD,
        _set("spec.rollout.onFailure", "Retry"),
        "spec.rollout.onFailure: must be one of Rollback, Pause",
    ),
    ("bool", MD, _set("spec.recompile.enabled", "maybe"), "spec.recompile.enabled: must be true or false"),
    ("list", MD, _set("spec.rollout.steps", {"weight": 5}), "spec.rollout.steps: must be a list"),
    ("mapping", MD, _set("spec.hardware", "h200"), "spec.hardware: must be a mapping of fields"),
    ("string", MD, _set("spec.engine.image", 5), "spec.engine.image: must be a string"),
    (
        "quantity",
        MD,
        _set("spec.engine.resources", {"limits": {"cpu": "lots"}}),
        "spec.engine.resources.limits.cpu:",
    ),
    (
        "node-selector",
        MD,
        _set("spec.hardware.nodeSelector", {"kubernetes.io/arch": 5}),
        "spec.hardware.nodeSelector['kubernetes.io/arch']: must be a string",
    ),
    ("meta-typo", MD, _set("metadata.lables", {}), "metadata: unknown field 'lables'"),
    (
        "root-typo",
        MD,
        _set("specs", {}),
        "unknown field 'specs' (allowed: apiVersion, kind, metadata, spec, status)",
    ),
    ("name", MD, _set("metadata.name", "Llama_8B"), "metadata.name: must be lowercase letters"),
    ("null-default", MD, _set("spec.replicas", None), "spec.replicas: must not be null"),
    ("null-required", MD, _set("spec", None), "spec: is required and must not be null"),
    (
        "cj-both",
        CJ,
        _set("spec.model", {"uri": "/m"}),
        "spec: give exactly one of deploymentRef or model + hardware",
    ),
    (
        "cj-neither",
        CJ,
        _drop("spec.deploymentRef"),
        "spec: give exactly one of deploymentRef or model + hardware",
    ),
    (
        "cj-half",
        STANDALONE,
        _drop("spec.hardware"),
        "spec.hardware: hardware is required with model: a standalone CompileJob needs both",
    ),
    (
        "cj-no-workload",
        STANDALONE,
        _drop("spec.workload"),
        "spec.workload: workload (a profile or a traceUri) is required for a standalone CompileJob",
    ),
    (
        "workload-both",
        CJ,
        _set("spec.workload.traceUri", "s3://t/x.jsonl"),
        "spec.workload: workload needs exactly one of profile or traceUri",
    ),
    (
        "claude-key",
        CJ,
        _drop("spec.agent.apiKeySecretRef"),
        "spec.agent.apiKeySecretRef: kind Claude requires apiKeySecretRef",
    ),
    ("agent-kind", CJ, _set("spec.agent.kind", "GPT"), "spec.agent.kind: must be one of Search, Claude"),
    (
        "histogram-len",
        CJ,
        _set("spec.workload.profile.inputTokens.counts", [1, 2]),
        "spec.workload.profile.inputTokens.counts: bounds and counts must have the same length",
    ),
    (
        "histogram-order",
        CJ,
        _set("spec.workload.profile.outputTokens.bounds", [64, 1024, 256]),
        "spec.workload.profile.outputTokens.bounds: bounds must be strictly increasing",
    ),
    ("budget", CJ, _set("spec.budget.sandboxes", 0), "spec.budget.sandboxes: must be > 0"),
    ("deadline", CJ, _set("spec.budget.deadline", "1w"), "spec.budget.deadline: must be a duration"),
    ("base-build", CJ, _set("spec.baseBuild", "latest"), "spec.baseBuild: must be 'reference' or a build id"),
    (
        "objective",
        CJ,
        _set("spec.objective.metric", "speed"),
        "spec.objective.metric: must be one of outputTokensPerSecond",
    ),
    (
        "constraint",
        CJ,
        _set("spec.objective.constraints", [{"metric": "itlP95Ms", "min": 5, "max": 1}]),
        "spec.objective.constraints[0].min: constraint min must be <= max",
    ),
    ("gates", CJ, _set("spec.gates.tokenAgreement", 1.5), "spec.gates.tokenAgreement: must be <= 1"),
    ("min-speedup", CJ, _set("spec.gates.minSpeedup", 0.5), "spec.gates.minSpeedup: must be >= 1"),
    ("ref-name", CJ, _set("spec.deploymentRef", {"name": ""}), "spec.deploymentRef.name: must not be empty"),
]


@pytest.mark.parametrize(("case", "base", "change", "expected"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_manifest_gets_one_clear_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    case: str,
    base: dict[str, Any],
    change: Callable[[dict[str, Any]], None],
    expected: str,
) -> None:
    doc = edit(base, change)
    path = write(tmp_path, yaml.safe_dump(doc, sort_keys=False))
    code, lines = run_validate(capsys, path)
    assert code == 1
    label = f"{doc['kind']}/{doc['metadata']['name']}"
    assert any(line.startswith(f"{path}: {label}: ") and expected in line for line in lines), lines
    assert not any(": ok (" in line for line in lines)


def test_problem_line_has_the_documented_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, yaml.safe_dump(edit(MD, _set("spec.rollout.steps.1.weight", 150))))
    assert run_validate(capsys, path) == (
        1,
        [f"{path}: ModelDeployment/llama-8b-chat: spec.rollout.steps[1].weight: must be <= 100 (got 150)"],
    )


def test_several_problems_one_line_each(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = edit(MD, _set("spec.replicas", -1))
    doc["spec"]["build"]["policy"] = "Sometimes"
    doc["spec"]["bogus"] = 1
    code, lines = run_validate(capsys, write(tmp_path, yaml.safe_dump(doc)))
    assert code == 1 and len(lines) == 3


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: [1\nb: 2\n", "invalid YAML at line 2"),
        ("apiVersion: v1\n\tkind: x\n", "invalid YAML at line 2"),
        (
            "kind: ModelDeployment\nkind: CompileJob\n",
            "invalid YAML at line 2, column 1: duplicate key 'kind'",
        ),
        ("", "empty file"),
        ("# only a comment\n---\n", "empty file"),
        ("- a\n- b\n", "expected a mapping with apiVersion, kind, metadata and spec, got a list"),
        ("just text\n", "expected a mapping with apiVersion, kind, metadata and spec, got str 'just text'"),
        (
            "apiVersion: polymorph.dev/v1alpha1\nmetadata: {name: x}\n",
            "missing kind (expected ModelDeployment or CompileJob)",
        ),
        (
            "apiVersion: apps/v1\nkind: Deployment\n",
            "unknown kind 'Deployment' (expected ModelDeployment or CompileJob)",
        ),
        ("apiVersion: polymorph.dev/v1alpha1\nkind: modeldeployment\n", "did you mean 'ModelDeployment'?"),
        (
            "apiVersion: polymorph.dev/v1\nkind: CompileJob\nmetadata: {name: x}\n",
            "CompileJob/x: apiVersion 'polymorph.dev/v1' is not supported (expected polymorph.dev/v1alpha1)",
        ),
        (
            "kind: CompileJob\nmetadata: {name: x}\n",
            "CompileJob/x: missing apiVersion (expected polymorph.dev/v1alpha1)",
        ),
        (
            "apiVersion: polymorph.dev/v1alpha1\nkind: CompileJob\nspec: {deploymentRef: {name: m}}\n",
            "CompileJob/<no name>: metadata: is required",
        ),
    ],
)
def test_file_level_problems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    path = write(tmp_path, text)
    code, lines = run_validate(capsys, path)
    assert code == 1
    assert len(lines) == 1 and lines[0].startswith(f"{path}: ") and expected in lines[0], lines


def test_missing_file_and_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path, yaml.safe_dump(MD))
    code, lines = run_validate(capsys, tmp_path / "nope.yaml", tmp_path, good)
    assert code == 1
    assert lines == [
        f"{tmp_path / 'nope.yaml'}: file not found",
        f"{tmp_path}: is a directory; give YAML files",
        f"{good}: ok (ModelDeployment/llama-8b-chat)",
    ]


def test_multi_document_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = edit(CJ, _set("spec.budget.maxExperiments", 0))
    text = yaml.safe_dump_all([MD, None, bad, [1], STANDALONE])
    path = write(tmp_path, text)
    code, lines = run_validate(capsys, path)
    assert code == 1
    assert lines == [
        f"{path}: ok (ModelDeployment/llama-8b-chat)",
        f"{path}: CompileJob/llama-8b-chat-7f3a: spec.budget.maxExperiments: must be > 0 (got 0)",
        f"{path}: document 4: expected a mapping with apiVersion, kind, metadata and spec, got a list",
        f"{path}: ok (CompileJob/tiny-llama-cpu-search)",
    ]


def test_yaml_error_after_good_documents(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, yaml.safe_dump(MD) + "---\nkey: [unclosed\n")
    code, lines = run_validate(capsys, path)
    assert code == 1
    assert lines[0] == f"{path}: ok (ModelDeployment/llama-8b-chat)"
    assert lines[1].startswith(f"{path}: invalid YAML at line ")


def test_kubectl_list_documents(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    listing = {"apiVersion": "v1", "kind": "List", "items": [MD, edit(CJ, _set("spec.baseBuild", "x"))]}
    code, lines = run_validate(capsys, write(tmp_path, yaml.safe_dump(listing)))
    assert code == 1 and len(lines) == 2 and "ok (ModelDeployment/llama-8b-chat)" in lines[0]
    assert "CompileJob/llama-8b-chat-7f3a: spec.baseBuild:" in lines[1]


def test_load_manifest_from_path_and_text(tmp_path: Path) -> None:
    path = write(tmp_path, yaml.safe_dump_all([MD, CJ]))
    objects = load_manifest(path)
    assert [type(o) for o in objects] == [ModelDeployment, CompileJob]
    assert load_manifest(str(path)) == objects
    assert load_manifest(yaml.safe_dump(MD))[0].metadata.name == "llama-8b-chat"


def test_load_manifest_raises_usage_error_with_friendly_lines(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"spec\.replicas: must be >= 0"):
        load_manifest(yaml.safe_dump(edit(MD, _set("spec.replicas", -3))))
    with pytest.raises(UsageError, match="file not found"):
        load_manifest(tmp_path / "missing.yaml")
    with pytest.raises(UsageError, match="file not found"):
        load_manifest("missing.yaml")


def test_format_validation_error_is_reusable() -> None:
    with pytest.raises(ValidationError) as info:
        ModelDeploymentSpec.model_validate(
            {"model": {"uri": "/m"}, "hardware": {"accelerator": "cpu"}, "replcas": 1}
        )
    lines = format_validation_error(info.value, "spec.yaml: ", root=ModelDeploymentSpec)
    assert lines == [
        "spec.yaml: unknown field 'replcas' (allowed: model, hardware, replicas, engine, build, recompile, rollout); "
        "did you mean 'replicas'?"
    ]
    assert (
        format_validation_error(info.value, "spec.yaml: ") == lines
    )  # the root is found by the model's name
    assert format_path(("spec", "steps", 1, "weight")) == "spec.steps[1].weight"


def test_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(yaml.safe_dump(MD)))
    assert run_validate(capsys, "-") == (0, ["-: ok (ModelDeployment/llama-8b-chat)"])


def test_check_text_is_pure() -> None:
    objects, lines, problems = check_text(yaml.safe_dump(STANDALONE), "x.yaml")
    assert len(objects) == 1 and lines == ["x.yaml: ok (CompileJob/tiny-llama-cpu-search)"] and problems == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("? [a, b]\n: c\n", "invalid YAML at line 1, column 3: a mapping key must be a plain value"),
        ("a: !!python/object:os.system x\n", "invalid YAML at line 1"),
        ("a: &x [1]\nb: *y\n", "invalid YAML at line 2, column 4: found undefined alias"),
        ("a: &x [1, *x]\n", "invalid YAML at line 1"),
        ("a: " + "[" * 100_000 + "\n", "invalid YAML at line 1"),
    ],
)
def test_hostile_yaml_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    path = write(tmp_path, text)
    code, lines = run_validate(capsys, path)
    assert code == 1 and len(lines) == 1 and lines[0].startswith(f"{path}: {expected}"), lines


def test_binary_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "blob.yaml"
    path.write_bytes(b"\xff\xfe\x00binary")
    assert run_validate(capsys, path) == (1, [f"{path}: not a UTF-8 text file"])


def _laughs(levels: int, fanout: int = 9) -> str:
    """A "billion laughs": ``levels`` anchors, each a list of ``fanout`` aliases of the one before."""
    lines = ["l0: &l0 [" + ", ".join(['"lol"'] * fanout) + "]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * fanout) + "]")
    return "\n".join(lines) + "\n"


def test_billion_laughs_in_kind_is_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, f"apiVersion: polymorph.dev/v1alpha1\n{_laughs(9)}kind: *l8\n")
    started = time.monotonic()
    code, lines = run_validate(capsys, path)
    assert time.monotonic() - started < 5  # expanded, this is 387 million strings
    assert code == 1 and len(lines) == 1
    assert f"aliases expand to more than {MAX_YAML_NODES} nodes" in lines[0], lines


def test_a_huge_unknown_kind_or_field_gets_no_fuzzy_match(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    huge = "ModelDeploymen" + "t" * 200_000
    doc = edit(MD, lambda d: d["spec"].update({"x" * 200_000: 1}))
    path = write(tmp_path, yaml.safe_dump({**MD, "kind": huge}) + "---\n" + yaml.safe_dump(doc))
    started = time.monotonic()
    code, lines = run_validate(capsys, path)
    assert time.monotonic() - started < 5
    assert code == 1 and len(lines) == 2 and all(len(line) < 1000 for line in lines), lines
    assert "unknown kind" in lines[0] and "did you mean" not in lines[0]


def _many(n: int) -> str:
    one = yaml.safe_dump(MD) + "---\n" + yaml.safe_dump(CJ)
    return "---\n".join([one] * (n // 2))


def test_validation_is_linear_in_the_number_of_documents() -> None:
    # CPU seconds of this process, the least of three runs: other processes on the machine (a
    # parallel test worker) change wall time, not the work done here.
    def seconds(n: int) -> float:
        text = _many(n)
        best = float("inf")
        for _ in range(3):
            started = time.process_time()
            objects, _, problems = check_text(text, "many.yaml")
            best = min(best, time.process_time() - started)
            assert len(objects) == n and not problems
        return best

    seconds(100)  # warm caches (pydantic, regexes)
    small, large = seconds(400), seconds(1600)
    assert large / small < 8, (small, large)  # 4x the documents; quadratic would be ~16x


def test_load_yaml_refuses_duplicates_aliases_and_several_documents() -> None:
    assert load_yaml("a: 1\nb: [x]\n", "f.yaml") == {"a": 1, "b": ["x"]}
    assert load_yaml("", "f.yaml") is None
    for text, expected in [
        ("a: 1\na: 2\n", "f.yaml: invalid YAML at line 2, column 1: duplicate key 'a'"),
        (_laughs(9), f"more than {MAX_YAML_NODES} nodes"),
        ("a: 1\n---\nb: 2\n", "f.yaml: holds 2 YAML documents; expected one"),
        ("a: [1\n", "f.yaml: invalid YAML at line"),
    ]:
        with pytest.raises(UsageError) as err:
            load_yaml(text, "f.yaml")
        assert expected in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("anchor", ["", "x: &x 1\n"])
def test_deep_nesting_is_one_line_with_or_without_anchors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], anchor: str
) -> None:
    path = write(tmp_path, anchor + "a: " + "[" * 5000 + "]" * 5000 + "\n")
    code, lines = run_validate(capsys, path)
    assert code == 1 and len(lines) == 1 and "nesting depth" in lines[0], lines
