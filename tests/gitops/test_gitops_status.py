"""kstatus and Argo CD health of ModelDeployments and CompileJobs, through the real tools.

The objects are made by the operator's own code in every rollout phase (``phases.py``). Each
goes through ``sigs.k8s.io/cli-utils/pkg/kstatus`` (what Flux and kpt use), built from
``tests/tools/kstatus``, and through the ``resource_customizations/polymorph.dev`` health
scripts in gopher-lua with only the libraries Argo CD opens (``tests/tools/argocd-lua``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from phases import GEN, compilejob_phases, deployment_phases

from support.go_tools import go_tool, run_json

REPO = Path(__file__).resolve().parents[2]
CUSTOM = REPO / "resource_customizations" / "polymorph.dev"

# phase -> (kstatus status, Argo CD health)
DEPLOYMENT = {
    "serving": ("Current", "Healthy"),
    "spec-changed-not-yet-observed": ("InProgress", "Progressing"),
    "replicas-not-ready": ("InProgress", "Progressing"),
    "compiling": ("InProgress", "Progressing"),
    "canary-step-1": ("InProgress", "Progressing"),
    "canary-step-2": ("InProgress", "Progressing"),
    "prometheus-down-mid-rollout": ("InProgress", "Degraded"),
    "promoting": ("InProgress", "Progressing"),
    "promoted": ("Current", "Healthy"),
    "waiting-for-approval": ("InProgress", "Suspended"),
    "aborted": ("Current", "Healthy"),
    "rolling-back": ("InProgress", "Progressing"),
    "rolled-back": ("Failed", "Degraded"),
    "paused-after-failures": ("Failed", "Suspended"),
    "canary-past-progress-deadline": ("Failed", "Degraded"),
    "invalid-spec": ("Failed", "Degraded"),
}
COMPILEJOB = {
    "pending": ("InProgress", "Progressing"),
    "running": ("InProgress", "Progressing"),
    "failed": ("Failed", "Degraded"),
    "succeeded": ("Current", "Healthy"),
    "succeeded-no-improvement": ("Current", "Healthy"),
    "unresolvable": ("Failed", "Degraded"),
}


@pytest.fixture(scope="module")
def deployments() -> dict[str, dict[str, Any]]:
    return deployment_phases()


@pytest.fixture(scope="module")
def compilejobs() -> dict[str, dict[str, Any]]:
    return compilejob_phases()


def kstatus(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return run_json("kstatus", [], json.dumps(objects))


def health(kind: str, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return run_json("argocd-lua", ["health", str(CUSTOM / kind / "health.lua")], json.dumps(objects))


def test_every_phase_is_covered(deployments: dict[str, Any], compilejobs: dict[str, Any]) -> None:
    assert set(deployments) == set(DEPLOYMENT)
    assert set(compilejobs) == set(COMPILEJOB)


def test_kstatus_of_every_deployment_phase(deployments: dict[str, dict[str, Any]]) -> None:
    got = {name: r for name, r in zip(deployments, kstatus(list(deployments.values())), strict=True)}
    assert {n: r["status"] for n, r in got.items()} == {n: want[0] for n, want in DEPLOYMENT.items()}
    # kstatus reports our reason and message, so `kubectl wait`-style tools say why.
    assert "waits for approval" in got["waiting-for-approval"]["message"]
    assert got["paused-after-failures"]["conditions"][0]["reason"] == "AnalysisFailed"
    assert got["rolled-back"]["conditions"][0]["reason"] == "RolledBack"
    assert "step 1/2, weight 25%" in got["canary-step-1"]["message"]
    assert got["spec-changed-not-yet-observed"]["conditions"][0]["reason"] == "LatestGenerationNotObserved"


def test_kstatus_of_every_compilejob_phase(compilejobs: dict[str, dict[str, Any]]) -> None:
    got = [r["status"] for r in kstatus(list(compilejobs.values()))]
    assert dict(zip(compilejobs, got, strict=True)) == {n: want[0] for n, want in COMPILEJOB.items()}


def test_argocd_health_of_every_phase(
    deployments: dict[str, dict[str, Any]], compilejobs: dict[str, dict[str, Any]]
) -> None:
    md = [r["status"] for r in health("ModelDeployment", list(deployments.values()))]
    assert dict(zip(deployments, md, strict=True)) == {n: want[1] for n, want in DEPLOYMENT.items()}
    cj = health("CompileJob", list(compilejobs.values()))
    assert dict(zip(compilejobs, [r["status"] for r in cj], strict=True)) == {
        n: want[1] for n, want in COMPILEJOB.items()
    }
    assert cj[list(compilejobs).index("succeeded")]["message"].endswith(" at 1.52x")


def test_conditions_carry_observed_generation(
    deployments: dict[str, dict[str, Any]], compilejobs: dict[str, dict[str, Any]]
) -> None:
    for name, obj in {**deployments, **compilejobs}.items():
        status = obj["status"]
        assert status.get("observedGeneration") is not None, name
        types = [c["type"] for c in status["conditions"]]
        assert {"Reconciling", "Stalled"} <= set(types), name
        for c in status["conditions"]:
            assert isinstance(c.get("observedGeneration"), int), (name, c)
        # at most one of Reconciling and Stalled is True
        true = {c["type"] for c in status["conditions"] if c["status"] == "True"}
        assert not {"Reconciling", "Stalled"} <= true, name
    serving = {c["type"]: c for c in deployments["serving"]["status"]["conditions"]}
    assert set(serving) >= {"Ready", "Compiling", "RollingOut", "Degraded"}  # the people-facing ones stay
    assert all(c["observedGeneration"] == GEN for c in serving.values())
    invalid = {c["type"]: c for c in deployments["invalid-spec"]["status"]["conditions"]}
    assert invalid["Stalled"]["observedGeneration"] == GEN + 1 == invalid["Degraded"]["observedGeneration"]


def test_the_testdata_pass_in_argo_cds_lua() -> None:
    done = subprocess.run(
        [str(go_tool("argocd-lua")), "test", str(CUSTOM.parent)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    counts = {
        kind: len(list((CUSTOM / kind / "testdata").glob("*.yaml")))
        for kind in ("ModelDeployment", "CompileJob")
    }
    assert f"{sum(counts.values())} of {sum(counts.values())} health tests passed" in done.stdout
    seen = {
        line.split(": ", 1)[1].split(" ", 1)[0]
        for line in done.stdout.splitlines()
        if "/ModelDeployment/" in line
    }
    assert seen == {"Healthy", "Progressing", "Degraded", "Suspended"}


def test_the_runner_opens_only_argo_cds_libraries(tmp_path: Path) -> None:
    """A script that needs the string library fails as it would in Argo CD; a wrong status reads Unknown."""
    obj = [{"apiVersion": "v1", "kind": "X", "metadata": {"name": "x"}}]
    script = tmp_path / "health.lua"
    script.write_text('return {status = string.format("%s", "Healthy")}\n')
    done = subprocess.run(
        [str(go_tool("argocd-lua")), "health", str(script)],
        input=json.dumps(obj),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and "string" in done.stderr
    script.write_text('local t = {}\ntable.insert(t, "x")\nreturn {status = "Fine", message = t[1]}\n')
    assert run_json("argocd-lua", ["health", str(script)], json.dumps(obj))[0] == {
        "name": "x", "status": "Unknown", "message": "Lua returned an invalid health status"
    }  # fmt: skip


def test_the_testdata_fail_when_the_expectation_is_wrong(tmp_path: Path) -> None:
    root = tmp_path / "polymorph.dev" / "ModelDeployment"
    (root / "testdata").mkdir(parents=True)
    (root / "health.lua").write_text((CUSTOM / "ModelDeployment" / "health.lua").read_text())
    (root / "testdata" / "healthy.yaml").write_text(
        (CUSTOM / "ModelDeployment" / "testdata" / "healthy.yaml").read_text()
    )
    (root / "health_test.yaml").write_text(
        "tests:\n- healthStatus: {status: Degraded, message: x}\n  inputPath: testdata/healthy.yaml\n"
    )
    done = subprocess.run([str(go_tool("argocd-lua")), "test", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 1 and "FAIL" in done.stdout and "got Healthy" in done.stdout


def test_the_docs_link_the_scripts_and_the_patch_puts_them_in_argocd_cm() -> None:
    """docs/operate.md links each health.lua rather than holding a copy, and its argocd-cm patch
    command, run from a checkout, puts each script under its key word for word."""
    page = REPO / "docs" / "operate.md"
    text = page.read_text()
    for kind in ("ModelDeployment", "CompileJob"):
        link = f"](../resource_customizations/polymorph.dev/{kind}/health.lua)"
        assert link in text, kind
        assert (page.parent / link[2:-1]).resolve() == (CUSTOM / kind / "health.lua").resolve()
    for doc in (REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))):
        assert "local hs = {}" not in doc.read_text(), f"{doc.name} holds a copy of a health script"
    start = text.index("kubectl -n argocd patch configmap argocd-cm --type merge -p \"$(python3 -c '")
    start = text.index("'", start) + 1
    script = text[start : text.index("')\"", start)]
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "data": {
            f"resource.customizations.health.polymorph.dev_{kind}": (CUSTOM / kind / "health.lua").read_text()
            for kind in ("ModelDeployment", "CompileJob")
        }
    }
