"""``kubectl polymorph`` against the running system: the real kubectl finds the plugin, which reads
and steers a deployment the real operator is rolling out on the real control plane (the real
Deployment and ReplicaSet controllers, a node agent whose pods answer their readiness probes; the
engines' metrics come from FakeEngine); the live objects, as the real API server serves them, go
through the real kstatus library and the Argo CD health script; a ``get -w`` screen is looked at
through tmux."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from documents import SLOW, figures
from operator_harness import GROUP, Api, FakeEngine, OperatorProcess, wait_for

from polymorph.contract.store import S3Store, ledger_key
from support.control_plane import ControlPlane
from support.go_tools import run_json
from support.k8s_binaries import kubectl
from support.node_agent import NodeAgent

REPO = Path(__file__).resolve().parents[2]
HEALTH = REPO / "resource_customizations" / "polymorph.dev"
PLUGIN = Path(sys.executable).parent / "kubectl-polymorph"


def deployment(ns: str) -> dict[str, Any]:
    return {
        "apiVersion": "polymorph.dev/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "chat", "namespace": ns},
        "spec": {
            "model": {"uri": "tiny"},
            "hardware": {"accelerator": "cpu"},
            "replicas": 4,
            "recompile": {"enabled": False},
            "build": {"policy": "Manual"},
            "rollout": {
                "steps": [{"weight": 25, "pause": "2s"}, {"weight": 50, "pause": "2s"}],
                "analysis": {"interval": "2s", "failureLimit": 1},
                "onFailure": "Pause",
            },
        },
    }


class Plugin:
    """``kubectl polymorph ...`` through the real kubectl binary, which finds the plugin on PATH;
    ``view`` reads the deployment in ``ns``."""

    def __init__(self, kubeconfig: Path, ns: str) -> None:
        assert PLUGIN.is_file(), f"{PLUGIN} is missing: the kubectl-polymorph entry point is not installed"
        self.ns = ns
        self.env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "PATH": f"{PLUGIN.parent}{os.pathsep}{Path(kubectl()).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def __call__(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(kubectl()), "polymorph", *args], env=self.env, capture_output=True, text=True, timeout=120
        )
        if ok:
            assert done.returncode == 0, f"kubectl polymorph {' '.join(args)}: {done.stdout}{done.stderr}"
        return done

    def view(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self("get", "md", "chat", "-n", self.ns, "-o", "json").stdout)
        return result


def live(api: Api) -> dict[str, Any]:
    md = api.md("chat")
    assert md is not None
    return md


def phase(api: Api) -> str | None:
    """``status.rollout.phase`` of the live object. The waits poll the API server: each call of the
    plugin is a process (about 0.5 s of CPU), so the plugin is run once the state is reached."""
    rollout: dict[str, Any] = (live(api).get("status") or {}).get("rollout") or {}
    return rollout.get("phase")


def reasons(api: Api) -> list[str]:
    """The reasons of the live object's status conditions."""
    return [c.get("reason", "") for c in (live(api).get("status") or {}).get("conditions") or []]


def verdicts(api: Api) -> tuple[str, str]:
    """(kstatus, Argo CD health) of the live object, from the real tools."""
    obj = json.dumps(live(api))
    ks = run_json("kstatus", [], obj)[0]["status"]
    argo = run_json("argocd-lua", ["health", str(HEALTH / "ModelDeployment" / "health.lua")], obj)[0][
        "status"
    ]
    return str(ks), str(argo)


@pytest.fixture
def tmux() -> Iterator[Callable[[str], str]]:
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed; make system-packages installs it with apt")
    name = f"polymorph-{uuid.uuid4().hex[:8]}"
    started: list[str] = []

    def start(command: str) -> str:
        subprocess.run(
            ["tmux", "new-session", "-d", "-s", name, "-x", "170", "-y", "60", command],
            check=True,
            timeout=10,
        )
        started.append(name)
        return name

    yield start
    for session in started:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False, timeout=10)


def screen(session: str, escapes: bool = False) -> str:
    args = ["tmux", "capture-pane", "-p", "-t", session] + (["-e"] if escapes else [])
    return subprocess.run(args, capture_output=True, text=True, check=True, timeout=10).stdout


def test_plugin_steers_a_manual_rollout(
    real_cluster: tuple[ControlPlane, Api, Path],
    real_operator: Callable[..., OperatorProcess],
    engines: Callable[..., FakeEngine],
    real_kubelet: NodeAgent,
    tmux: Callable[[str], str],
    tmp_path: Path,
    ns: str,
) -> None:
    _, api, kubeconfig = real_cluster
    real_operator()
    plugin = Plugin(kubeconfig, ns)
    listed = subprocess.run(
        [str(kubectl()), "plugin", "list"], env=plugin.env, capture_output=True, text=True
    )
    assert "kubectl-polymorph" in listed.stdout, listed.stdout + listed.stderr

    for _ in range(2):
        engines("chat", "stable", "reference").serve(prompt=64, generated=32, itl_s=0.02)
    for _ in range(2):
        engines("chat", "canary", SLOW).serve(prompt=64, generated=32, itl_s=0.04)  # fails analysis
    api.create(f"{GROUP}/namespaces/{ns}/modeldeployments", deployment(ns))
    wait_for("the stable Deployment", lambda: api.deployment("chat"))
    candidate = {"id": SLOW, "uri": f"file:///store/{SLOW}", "figures": figures(130).model_dump()}
    api.patch(
        f"{GROUP}/namespaces/{ns}/modeldeployments/chat/status", {"status": {"candidateBuild": candidate}}
    )

    # Waiting for approval: Reconciling (kstatus InProgress), Suspended in Argo CD.
    wait_for("the approval wait", lambda: "WaitingForApproval" in reasons(api), timeout=30)
    view = plugin.view()
    assert any(c["reason"] == "WaitingForApproval" for c in view["conditions"]), view["conditions"]
    assert view["kstatus"] == "InProgress" and view["candidateBuild"]["id"] == SLOW
    assert view["rollout"]["phase"] == "Idle" and view["policy"] == "Manual"
    assert verdicts(api) == ("InProgress", "Suspended")

    # Piped, `get` prints the plain tree: no escape codes.
    text = plugin("get", "md", "chat", "-n", ns).stdout
    assert "\x1b[" not in text
    assert f"ModelDeployment {ns}/chat" in text and "Candidate" in text and SLOW[:19] in text
    assert "waits for approval" in text

    # The watch screen through tmux: rich on a terminal, redrawn as the rollout moves.
    session = tmux(
        f"env -u COLUMNS -u LINES KUBECONFIG={kubeconfig} PATH={plugin.env['PATH']} kubectl polymorph get md chat -n {ns} -w --interval 500ms"
    )
    wait_for("the watch screen", lambda: "Active build" in screen(session), timeout=20)
    assert "\x1b[" in screen(session, escapes=True)  # coloured: rich saw a terminal
    assert "└──" in screen(session) or "├──" in screen(session)

    # approve: printed, then applied; the canary starts.
    done = plugin("approve", "chat", "-n", ns)
    assert (
        f"kubectl -n {ns} annotate modeldeployment chat polymorph.dev/approve={SLOW} --overwrite"
        in done.stdout
    )
    assert done.stdout.index("annotate") < done.stdout.index("applied")
    assert live(api)["metadata"]["annotations"]["polymorph.dev/approve"] == SLOW
    wait_for("step 1", lambda: phase(api) == "Progressing", timeout=30)
    assert plugin.view()["rollout"]["phase"] in ("Progressing", "Paused")
    wait_for("the step on screen", lambda: "step 1/2" in screen(session) and "weight 25%" in screen(session), timeout=20)  # fmt: skip

    # Two failed analyses: Paused (onFailure Pause): Stalled, kstatus Failed, Argo CD Suspended.
    wait_for("Paused", lambda: phase(api) == "Paused", timeout=60)
    view = plugin.view()
    assert view["rollout"]["phase"] == "Paused"
    values = {a["name"]: a for a in view["rollout"]["analysis"]}
    assert values["throughput"]["verdict"] == "Fail" and values["throughput"]["min"] == 0.98
    assert view["kstatus"] == "Failed"
    assert verdicts(api) == ("Failed", "Suspended")
    text = plugin("get", "md", "chat", "-n", ns).stdout
    assert "throughput" in text and "threshold >= 0.98" in text and "Fail" in text
    (tmp_path / "watch-paused.txt").write_text(screen(session))
    wait_for("Paused on screen", lambda: "Paused" in screen(session) and "threshold >= 0.98" in screen(session), timeout=20)  # fmt: skip

    # retry: the approval was already set when it paused, so remove it, let the operator see that, set it again.
    done = plugin("retry", "chat", "-n", ns)
    assert "polymorph.dev/approve-" in done.stdout and f"polymorph.dev/approve={SLOW}" in done.stdout
    wait_for("Resumed", lambda: api.events("Resumed"), timeout=30)

    # abort: back to the stable build; Aborted reads Current / Healthy.
    wait_for("in progress", lambda: phase(api) in ("Progressing", "Paused"), timeout=10)
    done = plugin("abort", "chat", "-n", ns)
    assert "polymorph.dev/abort=true --overwrite" in done.stdout
    wait_for("Aborted", lambda: phase(api) == "Aborted", timeout=30)
    assert plugin.view()["rollout"]["phase"] == "Aborted"
    wait_for("Aborted on screen", lambda: "Aborted" in screen(session), timeout=20)
    assert verdicts(api) == ("Current", "Healthy")
    assert plugin("abort", "chat", "-n", ns, ok=False).returncode == 2  # nothing to abort now
    again = plugin("approve", "chat", "-n", ns, ok=False)  # the operator never rolls a build out twice
    assert again.returncode == 2 and "already ran (Aborted)" in again.stderr, again.stderr
    done = plugin("retry", "chat", "-n", ns, "--dry-run")
    assert "polymorph.dev/abort-" in done.stdout and "dry run" in done.stdout
    assert live(api)["metadata"]["annotations"].get("polymorph.dev/abort") == "true"
    plugin("retry", "chat", "-n", ns)
    assert "polymorph.dev/abort" not in live(api)["metadata"]["annotations"]

    # pin / unpin: the spec change, printed first.
    done = plugin("pin", "chat", "-n", ns)
    assert """--type merge -p '{"spec":{"build":{"pinned":"reference"}}}'""" in done.stdout
    assert live(api)["spec"]["build"]["pinned"] == "reference"
    try:
        wait_for("pinned on screen", lambda: "pinned reference" in screen(session), timeout=20)
    except AssertionError:
        print(screen(session))
        raise
    plugin("unpin", "chat", "-n", ns)
    assert "pinned" not in live(api)["spec"]["build"]

    # list, plain and json
    listed_text = plugin("list", "-n", ns).stdout
    assert listed_text.splitlines()[0].split()[:4] == ["NAMESPACE", "NAME", "PHASE", "STATUS"]
    assert any(line.split()[1] == "chat" for line in listed_text.splitlines()[1:])

    # -A: every namespace's, just as the API server lists them across namespaces, this test's among
    # them. The control plane is shared: an earlier test's namespace (tests/control_plane deletes
    # theirs without waiting) may still be going, so the server lists them before and after the
    # plugin, and the plugin's list is compared with theirs once nothing changed meanwhile.
    def served() -> list[tuple[str, str]]:
        items = api.items(f"{GROUP}/modeldeployments")
        return sorted((m["metadata"]["namespace"], m["metadata"]["name"]) for m in items)

    def listed_while_still() -> tuple[list[tuple[str, str]], list[tuple[str, str]]] | None:
        before = served()
        listed = [(v["namespace"], v["name"]) for v in json.loads(plugin("list", "-A", "-o", "json").stdout)]
        return (listed, before) if served() == before else None

    everywhere, still = wait_for(
        "the deployments of every namespace, unchanged", listed_while_still, timeout=30
    )
    assert everywhere == still and (ns, "chat") in everywhere, (everywhere, still)

    # Bad input: one sentence, exit 2, no traceback.
    for args, words in [
        (("get", "pods", "chat", "-n", ns), "unknown TYPE 'pods'"),
        (("approve", "nosuch", "-n", ns), f"ModelDeployment {ns}/nosuch not found."),
        (("pin", "chat", "-n", ns, "--build", "latest"), "--build: 'latest' is not a build id"),
        (("get", "md", "chat", "-w", "--interval", "soon"), "--interval"),
        (("unpin", "chat", "-n", ns), "is not pinned"),
    ]:
        bad = plugin(*args, ok=False)
        assert bad.returncode == 2 and words in bad.stderr, (args, bad.stderr)
        assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    time.sleep(0)


def test_retry_runs_a_failed_compilejob_again(real_cluster: tuple[ControlPlane, Api, Path], ns: str) -> None:
    """retry of a deployment whose last CompileJob Failed: a new CompileJob with its spec, owned by the deployment."""
    _, api, kubeconfig = real_cluster
    plugin = Plugin(kubeconfig, ns)
    md = api.create(f"{GROUP}/namespaces/{ns}/modeldeployments", deployment(ns))
    spec = {
        "deploymentRef": {"name": "chat"},
        "baseBuild": "reference",
        "budget": {"maxExperiments": 5, "sandboxes": 1, "deadline": "5m", "experimentTimeout": "1m"},
    }
    cj = {"apiVersion": "polymorph.dev/v1alpha1", "kind": "CompileJob",
          "metadata": {"name": "chat-1a2b3c4d", "namespace": ns}, "spec": spec}  # fmt: skip
    api.create(f"{GROUP}/namespaces/{ns}/compilejobs", cj)
    api.patch(
        f"{GROUP}/namespaces/{ns}/compilejobs/chat-1a2b3c4d/status",
        {
            "status": {
                "phase": "Failed",
                "message": "the sandbox Job ended (DeadlineExceeded) without a campaign result",
            }
        },
    )
    shown = plugin("get", "cj", "chat-1a2b3c4d", "-n", ns).stdout
    assert f"CompileJob {ns}/chat-1a2b3c4d" in shown and "Failed" in shown and "DeadlineExceeded" in shown
    done = plugin("retry", "chat", "-n", ns)
    assert "run CompileJob chat-1a2b3c4d (Failed) again as chat-1a2b3c4d-retry-1" in done.stdout
    assert f"kubectl -n {ns} create -f - <<'EOF'" in done.stdout
    made = api.get(f"{GROUP}/namespaces/{ns}/compilejobs/chat-1a2b3c4d-retry-1")
    assert made is not None and made["spec"]["deploymentRef"] == {"name": "chat"}
    assert made["spec"]["budget"]["maxExperiments"] == 5
    owner = made["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "ModelDeployment" and owner["uid"] == md["metadata"]["uid"]
    assert made["metadata"]["annotations"]["polymorph.dev/retry-of"] == "chat-1a2b3c4d"
    # the newest CompileJob is now the deployment's last one, not Failed: nothing more to retry
    bad = plugin("retry", "chat", "-n", ns, ok=False)
    assert bad.returncode == 2 and "has nothing to retry" in bad.stderr
    listed = json.loads(plugin("list", "cj", "-n", ns, "-o", "json").stdout)
    assert [v["name"] for v in listed] == ["chat-1a2b3c4d", "chat-1a2b3c4d-retry-1"]


def test_get_with_store_reads_the_leaderboard_from_the_ledgers_in_s3(
    real_cluster: tuple[ControlPlane, Api, Path], s3_store: S3Store, s3_bucket: str, ns: str
) -> None:
    """get cj --store s3://...: the leaderboard from the CompileJob's ledger in S3 (moto), credentials from the environment."""
    _, api, kubeconfig = real_cluster
    plugin = Plugin(kubeconfig, ns)
    base, fast = "sha256:" + "0" * 64, "sha256:" + "9" * 64
    cj = {"apiVersion": "polymorph.dev/v1alpha1", "kind": "CompileJob",
          "metadata": {"name": "chat-1a2b3c4d", "namespace": ns},
          "spec": {"deploymentRef": {"name": "chat"}, "budget": {"sandboxes": 1}}}  # fmt: skip
    made = api.create(f"{GROUP}/namespaces/{ns}/compilejobs", cj)
    api.patch(
        f"{GROUP}/namespaces/{ns}/compilejobs/chat-1a2b3c4d/status",
        {"status": {"phase": "Succeeded", "baseline": {"build": base, "value": 100.0, "speedup": 1.0},
                    "best": {"build": fast, "value": 140.0, "speedup": 1.4}}},
    )  # fmt: skip
    paired = {"against": base, "ratio": 1.4, "lo": 1.3, "hi": 1.5, "pairs": 8}
    s3_store.append_jsonl(
        ledger_key(ns, "chat-1a2b3c4d", made["metadata"]["uid"], 0),
        [
            {"build": base, "status": "passed"},
            {"build": fast, "status": "passed", "comparison": paired, "description": "static cache"},
        ],
    )
    view = json.loads(
        plugin("get", "cj", "chat-1a2b3c4d", "-n", ns, "-o", "json", "--store", f"s3://{s3_bucket}").stdout
    )
    assert view["leaderboardFrom"] == "ledger" and view["ledgerRecords"] == 2
    assert [(r["build"], r["speedup"], r["ci"], r["pairs"], r["role"]) for r in view["leaderboard"]] == [
        (fast, 1.4, [1.3, 1.5], 8, "best")
    ]
    text = plugin("get", "cj", "chat-1a2b3c4d", "-n", ns, "--store", f"s3://{s3_bucket}").stdout
    assert "1.40x  [1.30, 1.50] (8 pairs)" in text and "static cache" in text
    bad = plugin("get", "cj", "chat-1a2b3c4d", "-n", ns, "--store", "ftp://x", ok=False)
    assert (
        bad.returncode == 2
        and bad.stderr.startswith("kubectl polymorph: --store:")
        and "Traceback" not in bad.stderr
    )
