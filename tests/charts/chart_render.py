"""Rendering the Polymorph chart with the real helm v4 binary, for the chart tests.

``render(values)`` runs ``helm template`` on ``charts/polymorph`` with ``values`` (a dict written
as a values file) and returns the parsed documents; renders are cached per values, since
several tests read the same one. ``helm_run`` runs any helm command and returns the completed
process. ``VALUE_SETS`` are the default and the non-default configurations every test covers.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from support import yamls
from support.k8s_binaries import helm

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "polymorph"
RELEASE = "pm"
NAMESPACE = "polymorph-system"
FULLNAME = "pm-polymorph"

VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "namespaced": {"watchNamespaces": ["team-a", "team-b"]},
    "peering": {"replicas": 2},
    "peering-namespaced": {"replicas": 2, "watchNamespaces": ["team-a", "team-b"]},
    "monitors": {"monitoring": {"operator": {"enabled": True}, "engines": {"enabled": True}}},
    "service-monitors": {
        "monitoring": {
            "kind": "ServiceMonitor",
            "labels": {"release": "kube-prometheus-stack"},
            "operator": {"enabled": True},
            "engines": {"enabled": True},
            "dashboard": {
                "enabled": True,
                "namespace": "grafana",
                "annotations": {"grafana_folder": "Polymorph"},
            },
            "prometheusRule": {"enabled": True, "alertLabels": {"team": "ml-platform"}},
        },
        "watchNamespaces": ["team-a"],
    },
    "network-policy": {
        "networkPolicy": {"enabled": True, "store": {"cidrs": ["10.20.0.0/16"], "ports": [9000]}},
        "watchNamespaces": ["team-a", "team-b"],
    },
    "everything": {
        "replicas": 3,
        "watchNamespaces": ["team-a"],
        "image": {"repository": "registry.example.com/polymorph", "tag": "1.2.3", "pullPolicy": "Always"},
        "engineImage": {"repository": "registry.example.com/polymorph-engine", "tag": "1.2.4"},
        "settings": {"prometheusUrl": "https://prom.example.com", "driftInterval": "5m", "logLevel": "debug"},
        "store": {"uri": "s3://fleet-builds/prod", "credentialsSecret": "store-creds"},
        "anthropic": {"apiKeySecret": {"name": "anthropic", "key": "token"}},
        "monitoring": {
            "operator": {"enabled": True},
            "engines": {"enabled": True},
            "dashboard": {"enabled": True},
            "prometheusRule": {"enabled": True, "labels": {"role": "alert-rules"}},
        },
        "networkPolicy": {
            "enabled": True,
            "store": {"cidrs": [], "peers": [{"namespaceSelector": {"matchLabels": {"name": "minio"}}}]},
        },
        "imagePullSecrets": [{"name": "regcred"}],
        "nodeSelector": {"kubernetes.io/os": "linux"},
    },
}


def helm_run(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the real helm binary with ``args`` (no check: callers read the exit status)."""
    return subprocess.run([str(helm()), *args], capture_output=True, text=True, check=False, timeout=120)


def values_file(values: dict[str, Any], folder: Path) -> Path:
    path = folder / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


@cache
def _render(values_json: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = values_file(json.loads(values_json), Path(tmp))
        done = helm_run(
            "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--include-crds", "-f", str(path)
        )
    if done.returncode != 0:
        raise AssertionError(f"helm template failed:\n{done.stderr}")
    return done.stdout


def render_text(values: dict[str, Any]) -> str:
    """The rendered manifests, as helm prints them."""
    return _render(json.dumps(values, sort_keys=True))


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    """The rendered manifests, parsed (empty documents dropped)."""
    return [d for d in yamls.load_all(render_text(values)) if d]


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in of_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]
