"""Nothing reports healthy while it does nothing (issue 32, class 4).

- A CompileJob's status follows its sandbox pods, not the Job's ``active`` count (which counts a
  Pending pod): pods that cannot be scheduled (or pull their image) make it ``Pending`` with
  Kubernetes' reason, in the phase, the message and the conditions; a table of observations, and
  the real control plane, whose scheduler finds no node for the pods.
- ``--sandbox-image`` and ``--fetch-image`` are checked against the image reference grammar at
  start-up: one sentence naming the flag, before any Job is made.
- ``polymorph operator`` with peering on and no peering CRD logs a warning saying every watch is
  paused, and ``/healthz`` does not answer 200 until the CRD is served; then it does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_harness import GROUP, NS, REPO, Api, OperatorProcess, wait_for

from polymorph.cli import main
from polymorph.contract.api import CompileJob
from polymorph.core.compilejobs import JobObservation, compilejob_status
from polymorph.handlers.bodies import job_observation
from support import probes
from support.control_plane import ControlPlane
from support.prometheus import PrometheusServer

NOW = datetime(2026, 12, 5, tzinfo=UTC)
UNSCHEDULABLE = "Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."


def _cj() -> CompileJob:
    doc = yaml.safe_load((REPO / "crds" / "examples" / "compilejob-standalone.yaml").read_text())
    doc["metadata"] = {"name": "cj", "namespace": NS, "generation": 1}
    doc["status"] = {"phase": "Running"}
    return CompileJob.model_validate(doc)


def _pod(phase: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "status": {"phase": phase, **status}}


PENDING = _pod(
    "Pending",
    conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": UNSCHEDULABLE.split(": ", 1)[1]}],
)  # fmt: skip
PULLING = _pod(
    "Pending",
    conditions=[{"type": "PodScheduled", "status": "True"}],
    containerStatuses=[{"state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}],
)  # fmt: skip
RUNNING = _pod("Running")


@pytest.mark.parametrize(
    ("active", "pods", "phase", "reason", "message"),
    [
        (
            2,
            [PENDING, PENDING],
            "Pending",
            "Unschedulable",
            f"2 sandbox pod(s) pending ({UNSCHEDULABLE}), 0 experiments so far",
        ),
        (
            1,
            [PULLING],
            "Pending",
            "ImagePullBackOff",
            "1 sandbox pod(s) pending (ImagePullBackOff: Back-off pulling image)",
        ),
        (2, [RUNNING, PENDING], "Running", "Running", f"1 sandbox(es) running, 1 pending ({UNSCHEDULABLE})"),
        (2, [RUNNING, RUNNING], "Running", "Running", "2 sandbox(es) running, 0 experiments so far"),
        (1, [_pod("Pending")], "Pending", "PodsPending", "1 sandbox pod(s) pending, 0 experiments so far"),
        # a pod being deleted is not counted
        (
            2,
            [RUNNING, {**PENDING, "metadata": {"name": "q", "deletionTimestamp": "x"}}],
            "Running",
            "Running",
            "1 sandbox(es) running, 1 pending,",
        ),
        # the pods not read: the Job's count, as before
        (2, None, "Running", "Running", "2 sandbox(es) running, 0 experiments so far"),
    ],
)
def test_a_compilejob_is_pending_while_its_sandbox_pods_wait(
    active: int, pods: list[dict[str, Any]] | None, phase: str, reason: str, message: str
) -> None:
    job = {"status": {"active": active}}
    status = compilejob_status(_cj(), [], None, job_observation(job, pods), "file:///l", NOW)
    assert status.phase == phase and message in (status.message or ""), (status.phase, status.message)
    running = next(c for c in status.conditions if c.type == "Running")
    assert running.status == ("True" if phase == "Running" else "False") and running.reason == reason
    assert "running" not in (status.message or "").split(",")[0] or phase == "Running"


def test_the_job_observation_defaults_keep_the_old_reading() -> None:
    assert JobObservation(exists=True, active=3).running is None


@pytest.mark.parametrize(
    ("flag", "image"),
    [
        ("--sandbox-image", "not an image!!"),
        ("--sandbox-image", "ghcr.io/polymorph/engine:tag:again"),
        ("--sandbox-image", "engine:"),
        ("--sandbox-image", "ghcr.io/polymorph/engine@sha256:abc"),
        ("--sandbox-image", " ghcr.io/polymorph/engine"),
        ("--fetch-image", "amazon/aws cli"),
        ("--fetch-image", "a/" + "b" * 300),
    ],
)
def test_a_bad_image_is_one_sentence_before_anything_starts(
    capsys: pytest.CaptureFixture[str], flag: str, image: str
) -> None:
    argv = ["operator", "--namespace", NS, "--prometheus-url", "http://p:9090", "--store", "/s", flag, image]
    code = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert lines[0].startswith(f"error: {flag} must be an image reference such as"), lines[0]


@pytest.mark.parametrize(
    "image",
    [
        "ghcr.io/polymorph/engine:0.1.0",
        "busybox",
        "localhost:5000/team/engine",
        "registry.example/e@sha256:" + "a" * 64,
    ],
)
def test_a_good_image_is_taken(image: str) -> None:
    from polymorph.cli import build_parser
    from polymorph.handlers.settings import from_args

    args = build_parser("operator").parse_args(
        [
            "operator",
            "--namespace",
            NS,
            "--prometheus-url",
            "http://p:9090",
            "--store",
            "/s",
            "--sandbox-image",
            image,
        ]
    )
    assert from_args(args, {}).cluster.sandbox_image == image


# --- the real control plane ------------------------------------------------------------------------


def test_unschedulable_sandbox_pods_make_the_compilejob_pending(
    real_cluster: tuple[ControlPlane, Api, Path], real_operator: Any, ns: str
) -> None:
    """No node is registered (a test's node agent leaves with its node): the scheduler marks the
    sandbox pods Unschedulable, and the CompileJob says Pending and why, not 'Running, 1
    sandbox(es) running'."""
    _, api, kubeconfig = real_cluster
    real_operator()
    doc = yaml.safe_load((REPO / "crds" / "examples" / "compilejob-standalone.yaml").read_text())
    doc["metadata"] = {"name": "stuck", "namespace": ns}
    api.create(f"{GROUP}/namespaces/{ns}/compilejobs", doc)

    def pending() -> dict[str, Any] | None:
        cj = api.get(f"{GROUP}/namespaces/{ns}/compilejobs/stuck") or {}
        status = cj.get("status") or {}
        return (
            status
            if status.get("phase") == "Pending" and "Unschedulable" in status.get("message", "")
            else None
        )

    status = wait_for("the CompileJob Pending and Unschedulable", pending, timeout=60)
    assert "sandbox pod(s) pending (Unschedulable:" in status["message"], status
    running = next(c for c in status["conditions"] if c["type"] == "Running")
    assert running["status"] == "False" and running["reason"] == "Unschedulable", running
    assert api.get(f"/apis/batch/v1/namespaces/{ns}/jobs/stuck") is not None
    # kubectl polymorph get cj says the same, not "Running, 1 sandbox(es) running"
    plugin = Path(sys.executable).parent / "kubectl-polymorph"
    args = [str(plugin), "get", "cj", "stuck", "-n", ns, "--kubeconfig", str(kubeconfig)]
    shown = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "Pending" in shown.stdout and "Unschedulable" in shown.stdout, shown.stdout
    assert "sandbox(es) running" not in shown.stdout, shown.stdout


def test_peering_without_its_crd_is_a_warning_and_an_unhealthy_healthz(
    real_cluster: tuple[ControlPlane, Api, Path], prometheus: PrometheusServer, tmp_path: Path, ns: str
) -> None:
    """real_cluster serves the project's CRDs only: kopf would pause every watch, silently. The
    peering CRD this test creates is deleted again: the other tests share the control plane."""
    _, api, kubeconfig = real_cluster
    (tmp_path / "store").mkdir()
    log = tmp_path / "operator.log"
    proc = OperatorProcess(kubeconfig, prometheus.url, tmp_path / "store", log, namespace=ns,
                           standalone=False, pod_id="a")  # fmt: skip
    with log.open("ab") as out:
        proc.proc = subprocess.Popen(proc.args, stdout=out, stderr=out, env=proc.env, cwd=REPO)
    try:
        answer = wait_for(
            "an answer on /healthz", lambda: probes.get(proc.health_port, "/healthz", timeout=2), timeout=30
        )
        assert answer[0] != 200, answer
        warnings = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
        paused = [w for w in warnings if w.get("event") == "peering-paused"]
        assert paused and paused[0]["level"] == "warning", warnings[-5:]
        assert "kopfpeerings.kopf.dev" in paused[0]["reason"] and "--standalone" in paused[0]["reason"]
        # The CRD served: healthy again (kopf's probe results are cached for 10 s).
        crd = _peering_crd()
        api.create(PEERING_CRDS, crd)
        wait_for("/healthz 200", lambda: (probes.get(proc.health_port, "/healthz", timeout=2) or (0,))[0] == 200, timeout=40)  # fmt: skip
    finally:
        proc.stop()
        api.delete(f"{PEERING_CRDS}/{PEERING_CRD}")  # with the KopfPeering objects the operator made
        wait_for("the peering CRD gone", lambda: api.get(f"{PEERING_CRDS}/{PEERING_CRD}") is None, timeout=60)


PEERING_CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
PEERING_CRD = "kopfpeerings.kopf.dev"


def _peering_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": PEERING_CRD},
        "spec": {
            "scope": "Namespaced",
            "group": "kopf.dev",
            "names": {"kind": "KopfPeering", "plural": "kopfpeerings", "singular": "kopfpeering"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
            ],
        },
    }
