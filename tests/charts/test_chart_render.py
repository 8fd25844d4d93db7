"""The Helm chart: lint-clean, valid Kubernetes manifests, a values schema that says what is wrong,
CRDs identical to crds/, and the Deployment, settings, peering, monitors and NetworkPolicy that
each configuration asks for. Everything is rendered by the real helm v4 binary."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from chart_render import (
    CHART,
    FULLNAME,
    NAMESPACE,
    RELEASE,
    REPO,
    VALUE_SETS,
    helm_run,
    of_kind,
    one,
    render,
    render_text,
    values_file,
)

from polymorph import crdgen
from polymorph.contract.api.modeldeployment import EngineSpec
from polymorph.core.resources import ClusterSettings
from polymorph.handlers import settings as operator_flags

KUBERNETES_VALIDATE = Path(sys.executable).with_name("kubernetes-validate")
# Kinds kubernetes-validate has no schema for; each is checked below against its own definition.
CUSTOM_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule", "KopfPeering", "ClusterKopfPeering"}
CASES = list(VALUE_SETS.items())
IDS = list(VALUE_SETS)


def test_helm_is_v4() -> None:
    done = helm_run("version", "--short")
    assert done.returncode == 0 and done.stdout.startswith("v4."), done.stdout + done.stderr


@pytest.mark.parametrize(("case", "values"), CASES, ids=IDS)
def test_helm_lint_is_clean(case: str, values: dict[str, Any], tmp_path: Path) -> None:
    done = helm_run(
        "lint", "--strict", str(CHART), "--namespace", NAMESPACE, "-f", str(values_file(values, tmp_path))
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout, done.stdout


def _kubernetes_validate(path: Path, version: str) -> subprocess.CompletedProcess[str]:
    command = [str(KUBERNETES_VALIDATE), "--strict", "-k", version, str(path)]
    return subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)


@pytest.mark.parametrize("version", ["1.29.0", "1.35.0"])
@pytest.mark.parametrize(("case", "values"), CASES, ids=IDS)
def test_rendered_manifests_pass_kubernetes_validate_strict(
    case: str, values: dict[str, Any], version: str, tmp_path: Path
) -> None:
    path = tmp_path / "rendered.yaml"
    path.write_text(render_text(values))
    done = _kubernetes_validate(path, version)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 0, "\n".join(lines)
    docs = render(values)
    builtin = [d for d in docs if d["kind"] not in CUSTOM_KINDS]
    assert sum(" passed for resource " in line for line in lines) == len(builtin), "\n".join(lines)
    others = [line for line in lines if " passed for resource " not in line]
    for line in others:
        kind = re.search(r"schema for kind (\w+) ", line)
        assert kind and kind.group(1) in CUSTOM_KINDS, line


def test_kubernetes_validate_catches_a_bad_manifest(tmp_path: Path) -> None:
    """The check above can fail: an unknown field in the Deployment is rejected under --strict."""
    docs = render({})
    one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["securityContexts"] = {}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    done = _kubernetes_validate(path, "1.35.0")
    assert done.returncode != 0 and "securityContexts" in done.stdout + done.stderr


# ---------------------------------------------------------------------------------------------
# values.schema.json


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicas": 0}, "at '/replicas': minimum: got 0, want 1"),
        ({"replicas": "two"}, "at '/replicas': got string, want integer"),
        ({"watchNamespaces": "team-a"}, "at '/watchNamespaces': got string, want array"),
        ({"watchNamespaces": ["Team_A"]}, "at '/watchNamespaces/0': 'Team_A' does not match pattern"),
        (
            {"settings": {"driftInterval": "5 minutes"}},
            "at '/settings/driftInterval': '5 minutes' does not match",
        ),
        ({"settings": {"logLevel": "loud"}}, "at '/settings/logLevel': value must be one of 'debug'"),
        ({"settings": {"prometheusUrl": "prometheus:9090"}}, "at '/settings/prometheusUrl'"),
        ({"store": {"uri": "gs://bucket"}}, "at '/store/uri': 'gs://bucket' does not match pattern"),
        ({"image": {"tag": 1.5}}, "at '/image/tag': got number, want string"),
        ({"engineImage": {"repository": ""}}, "at '/engineImage/repository': minLength: got 0, want 1"),
        (
            {"settings": {"sandboxImage": "engine:1"}},
            "additional properties 'sandboxImage' not allowed",
        ),  # engineImage names it now
        (
            {"monitoring": {"kind": "Probe"}},
            "at '/monitoring/kind': value must be one of 'PodMonitor', 'ServiceMonitor'",
        ),
        ({"networkPolicy": {"enabled": True}}, "at '/networkPolicy/store/cidrs': minItems: got 0, want 1"),
        ({"networkPolicy": {"store": {"cidrs": ["10.0.0.0"]}}}, "at '/networkPolicy/store/cidrs/0'"),
        ({"ports": {"health": 70000}}, "at '/ports/health': maximum: got 70,000, want 65,535"),
        ({"replica": 2}, "additional properties 'replica' not allowed"),
        (
            {"monitoring": {"prometheusRule": {"engineNotReady": {"for": "10 minutes"}}}},
            "at '/monitoring/prometheusRule/engineNotReady/for': '10 minutes' does not match",
        ),
        (
            {"monitoring": {"prometheusRule": {"rolloutStuck": {"factor": 0.5}}}},
            "at '/monitoring/prometheusRule/rolloutStuck/factor': minimum: got 0.5, want 1",
        ),
        (
            {"monitoring": {"dashboard": {"labels": {"grafana_dashboard": None}}}},
            "at '/monitoring/dashboard/labels': minProperties",
        ),
        ({"monitoring": {"dashboard": {"enable": True}}}, "additional properties 'enable' not allowed"),
        (
            {"settings": {"prometheusURL": "http://p:9090"}},
            "additional properties 'prometheusURL' not allowed",
        ),
    ],
    ids=lambda case: json.dumps(case, separators=(",", ":")) if isinstance(case, dict) else None,
)
def test_values_schema_rejects_bad_values_naming_the_field(
    values: dict[str, Any], message: str, tmp_path: Path
) -> None:
    done = helm_run("template", RELEASE, str(CHART), "-f", str(values_file(values, tmp_path)))
    assert done.returncode != 0
    assert "values don't meet the specifications of the schema" in done.stderr
    assert message in done.stderr, done.stderr


def test_values_yaml_is_valid_under_its_own_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load((CHART / "values.yaml").read_text()), schema)
    for values in VALUE_SETS.values():
        render(values)  # renders, so the schema accepted it


# ---------------------------------------------------------------------------------------------
# CRDs


def test_chart_crds_are_identical_to_crds_dir() -> None:
    chart = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    plain = {p.name: p.read_bytes() for p in (REPO / "crds").glob("*.yaml")}
    assert chart == plain
    assert set(chart) == {r.filename for r in crdgen.RESOURCES}
    for resource in crdgen.RESOURCES:
        assert chart[resource.filename].decode() == crdgen.render(resource)


def test_rendered_chart_carries_the_polymorph_crds() -> None:
    names = {d["metadata"]["name"] for d in of_kind(render({}), "CustomResourceDefinition")}
    assert names == {"modeldeployments.polymorph.dev", "compilejobs.polymorph.dev"}


# ---------------------------------------------------------------------------------------------
# The operator Deployment and its settings


def _container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize(("case", "values"), CASES, ids=IDS)
def test_deployment_is_restricted_and_probed_on_the_health_port(case: str, values: dict[str, Any]) -> None:
    docs = render(values)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = _container(docs)
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    health = values.get("ports", {}).get("health", 8080)
    assert ports == {"metrics": values.get("ports", {}).get("metrics", 9090), "health": health}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert pod["serviceAccountName"] == FULLNAME


def test_default_images_are_what_this_repository_builds_at_the_charts_version() -> None:
    """The operator image runs the chart's Deployment and the engine image every sandbox pod: both
    this repository's (``make images`` builds them under these names), tagged with the appVersion,
    which is the package version the images install. The engine image is also what a
    ModelDeployment serves by default and what the operator falls back to without the chart."""
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert version == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    docs = render({})
    operator_image = _container(docs)["image"]
    engine_image = one(docs, "ConfigMap", FULLNAME)["data"]["POLYMORPH_SANDBOX_IMAGE"]
    assert operator_image == f"ghcr.io/polymorph/operator:{version}"
    assert engine_image == f"ghcr.io/polymorph/engine:{version}"
    assert EngineSpec().image == engine_image == ClusterSettings(store="/store").sandbox_image
    dry_run = subprocess.run(
        ["make", "--no-print-directory", "-n", "images"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    built = re.findall(r"^docker build -f (\S+) -t (\S+) .*\.$", dry_run, re.MULTILINE)
    assert built == [("operator/Dockerfile", operator_image), ("engine_image/Dockerfile", engine_image)]


def test_images_come_from_values() -> None:
    docs = render(VALUE_SETS["everything"])
    container = _container(docs)
    assert container["image"] == "registry.example.com/polymorph:1.2.3"
    assert container["imagePullPolicy"] == "Always"
    engine = one(docs, "ConfigMap", FULLNAME)["data"]["POLYMORPH_SANDBOX_IMAGE"]
    assert engine == "registry.example.com/polymorph-engine:1.2.4"
    # A repository alone keeps the appVersion as its tag.
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    alone = render(
        {"image": {"repository": "r.example.com/op"}, "engineImage": {"repository": "r.example.com/en"}}
    )
    assert _container(alone)["image"] == f"r.example.com/op:{version}"
    assert (
        one(alone, "ConfigMap", FULLNAME)["data"]["POLYMORPH_SANDBOX_IMAGE"] == f"r.example.com/en:{version}"
    )


def _args(values: dict[str, Any]) -> list[str]:
    container = _container(render(values))
    assert container["command"] == ["polymorph"]
    args: list[str] = container["args"]
    return args


def test_operator_command_line() -> None:
    assert _args({}) == [
        "operator",
        "--all-namespaces",
        "--standalone",
        "--metrics-port",
        "9090",
        "--health-port",
        "8080",
    ]
    namespaced = _args(VALUE_SETS["peering-namespaced"])
    assert namespaced == [
        "operator",
        "--namespace",
        "team-a",
        "--namespace",
        "team-b",
        "--metrics-port",
        "9090",
        "--health-port",
        "8080",
    ]


@pytest.mark.parametrize(
    ("replicas", "strategy", "standalone"), [(1, "Recreate", True), (2, "RollingUpdate", False)]
)
def test_one_replica_is_standalone_and_never_overlaps(replicas: int, strategy: str, standalone: bool) -> None:
    docs = render({"replicas": replicas})
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == replicas
    assert deployment["spec"]["strategy"]["type"] == strategy
    assert ("--standalone" in _args({"replicas": replicas})) is standalone
    affinity = deployment["spec"]["template"]["spec"].get("affinity")
    if standalone:
        assert affinity is None
    else:
        (term,) = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        assert (
            term["podAffinityTerm"]["labelSelector"]["matchLabels"]
            == deployment["spec"]["selector"]["matchLabels"]
        )


def test_settings_configmap_feeds_the_env_fallbacks() -> None:
    docs = render(VALUE_SETS["everything"])
    data = one(docs, "ConfigMap", FULLNAME)["data"]
    assert data == {
        "POLYMORPH_PROMETHEUS_URL": "https://prom.example.com",
        "POLYMORPH_STORE": "s3://fleet-builds/prod",
        "POLYMORPH_DRIFT_INTERVAL": "5m",
        "POLYMORPH_ROLLOUT_INTERVAL": "30s",
        "POLYMORPH_LOG_LEVEL": "debug",
        "POLYMORPH_SANDBOX_IMAGE": "registry.example.com/polymorph-engine:1.2.4",
        "POLYMORPH_FETCH_IMAGE": "amazon/aws-cli:2.17.0",
        "POLYMORPH_STORE_SECRET": "store-creds",
        "POLYMORPH_ANTHROPIC_SECRET_NAME": "anthropic",
        "POLYMORPH_ANTHROPIC_SECRET_KEY": "token",
        "POLYMORPH_PEERING": "polymorph",
    }
    container = _container(docs)
    assert container["envFrom"] == [{"configMapRef": {"name": FULLNAME}}]
    secret_env = {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for e in container["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert secret_env == {
        key: {"name": "store-creds", "key": key, "optional": True}
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION")
    }
    # No Secret named: no secret is referenced anywhere, and the ConfigMap says so by omission.
    default = render({})
    assert not [e for e in _container(default)["env"] if "secretKeyRef" in e.get("valueFrom", {})]
    assert not {k for k in one(default, "ConfigMap", FULLNAME)["data"] if "SECRET" in k or "PEERING" in k}


def _config_checksum(values: dict[str, Any]) -> str:
    checksum: str = one(render(values), "Deployment")["spec"]["template"]["metadata"]["annotations"][
        "checksum/config"
    ]
    return checksum


def test_settings_change_rolls_the_pods() -> None:
    assert _config_checksum({}) != _config_checksum({"settings": {"logLevel": "debug"}})
    assert _config_checksum({}) == _config_checksum({"nodeSelector": {"a": "b"}})


# ---------------------------------------------------------------------------------------------
# kopf peering


def _crd_schema(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return crdgen.crd_json_schema(schema)


@pytest.mark.parametrize(
    ("values", "kind", "namespaces"),
    [
        ({"replicas": 2}, "ClusterKopfPeering", [None]),
        ({"replicas": 2, "watchNamespaces": ["team-a", "team-b"]}, "KopfPeering", ["team-a", "team-b"]),
    ],
)
def test_peering_ships_kopf_crd_and_objects_when_replicas_above_one(
    values: dict[str, Any], kind: str, namespaces: list[str | None]
) -> None:
    docs = render(values)
    crd = one(docs, "CustomResourceDefinition", f"{kind.lower()}s.kopf.dev")
    assert crd["spec"]["names"]["kind"] == kind
    assert crd["spec"]["scope"] == ("Cluster" if kind.startswith("Cluster") else "Namespaced")
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    peerings = of_kind(docs, kind)
    assert [p["metadata"].get("namespace") for p in peerings] == namespaces
    for peering in peerings:
        assert peering["metadata"]["name"] == "polymorph"
        assert peering["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
        jsonschema.validate(peering, _crd_schema(crd))
    assert "--standalone" not in _container(docs)["args"]


def test_no_peering_with_one_replica_or_without_the_crd() -> None:
    docs = render({})
    assert not [
        d for d in docs if d["apiVersion"].startswith("kopf.dev") or "kopf.dev" in d["metadata"]["name"]
    ]
    docs = render({"replicas": 2, "peering": {"name": "polymorph", "installCRD": False}})
    assert not [d for d in of_kind(docs, "CustomResourceDefinition") if "kopf" in d["metadata"]["name"]]
    assert len(of_kind(docs, "ClusterKopfPeering")) == 1


# ---------------------------------------------------------------------------------------------
# Monitors

# The spec fields of the Prometheus Operator's monitoring.coreos.com/v1 monitors that the chart
# uses; kubernetes-validate has no schema for them.
_MONITOR_FIELDS = {"selector", "namespaceSelector", "endpoints", "podMetricsEndpoints"}
_ENDPOINT_FIELDS = {"port", "path", "interval", "honorLabels"}


@pytest.mark.parametrize("kind", ["PodMonitor", "ServiceMonitor"])
def test_monitors_for_operator_and_engines(kind: str) -> None:
    values = VALUE_SETS["monitors" if kind == "PodMonitor" else "service-monitors"]
    docs = render(values)
    monitors = {m["metadata"]["name"]: m for m in of_kind(docs, kind)}
    assert set(monitors) == {f"{FULLNAME}-operator", f"{FULLNAME}-engines"}
    endpoints_key = "podMetricsEndpoints" if kind == "PodMonitor" else "endpoints"
    for monitor in monitors.values():
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert set(monitor["spec"]) <= _MONITOR_FIELDS and endpoints_key in monitor["spec"]
        for endpoint in monitor["spec"][endpoints_key]:
            assert set(endpoint) <= _ENDPOINT_FIELDS and endpoint["path"] == "/metrics"
        assert monitor["metadata"]["labels"].items() >= values["monitoring"].get("labels", {}).items()
    operator = monitors[f"{FULLNAME}-operator"]["spec"]
    assert operator[endpoints_key][0]["port"] == "metrics"
    assert operator["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    engines = monitors[f"{FULLNAME}-engines"]["spec"]
    assert engines["selector"] == {
        "matchExpressions": [{"key": "polymorph.dev/model-deployment", "operator": "Exists"}]
    }
    assert operator[endpoints_key][0]["honorLabels"] is True  # the series' own namespace label wins
    assert engines[endpoints_key] == [
        {"port": "http", "path": "/metrics", "interval": "30s", "honorLabels": True}
    ]
    watched = values.get("watchNamespaces")
    assert engines["namespaceSelector"] == ({"matchNames": watched} if watched else {"any": True})
    services = of_kind(docs, "Service")
    if kind == "ServiceMonitor":
        (service,) = services  # the operator's metrics Service; engines' Services are the operator's
        assert service["spec"]["ports"][0]["name"] == "metrics"
        assert service["spec"]["selector"] == one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
        assert operator["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    else:
        assert services == []


def test_no_monitors_by_default() -> None:
    docs = render({})
    assert (
        not of_kind(docs, "PodMonitor")
        and not of_kind(docs, "ServiceMonitor")
        and not of_kind(docs, "Service")
    )


# ---------------------------------------------------------------------------------------------
# Sandbox NetworkPolicy


def test_network_policy_lets_sandboxes_reach_only_dns_store_and_anthropic() -> None:
    docs = render(VALUE_SETS["network-policy"])
    policies = of_kind(docs, "NetworkPolicy")
    assert [p["metadata"]["namespace"] for p in policies] == ["team-a", "team-b"]
    for policy in policies:
        spec = policy["spec"]
        assert spec["podSelector"] == {
            "matchExpressions": [{"key": "polymorph.dev/compilejob", "operator": "Exists"}]
        }
        assert spec["policyTypes"] == ["Ingress", "Egress"] and spec["ingress"] == []
        dns, store, anthropic = spec["egress"]
        assert dns["to"][0]["namespaceSelector"] == {
            "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
        }
        assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
        assert dns["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
        assert store == {
            "to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}],
            "ports": [{"protocol": "TCP", "port": 9000}],
        }
        assert anthropic == {
            "to": [{"ipBlock": {"cidr": "160.79.104.0/23"}}],
            "ports": [{"protocol": "TCP", "port": 443}],
        }


def test_network_policy_store_peers_and_namespaces() -> None:
    docs = render(VALUE_SETS["everything"])
    (policy,) = of_kind(docs, "NetworkPolicy")
    assert policy["metadata"]["namespace"] == "team-a"
    store = policy["spec"]["egress"][1]
    assert store["to"] == [{"namespaceSelector": {"matchLabels": {"name": "minio"}}}]
    cluster_wide = {"networkPolicy": {"enabled": True, "store": {"cidrs": ["10.0.0.0/8"]}}}
    assert [p["metadata"]["namespace"] for p in of_kind(render(cluster_wide), "NetworkPolicy")] == [NAMESPACE]
    listed = {"networkPolicy": {**cluster_wide["networkPolicy"], "namespaces": ["ml-1", "ml-2"]}}
    assert [p["metadata"]["namespace"] for p in of_kind(render(listed), "NetworkPolicy")] == ["ml-1", "ml-2"]
    assert of_kind(render({}), "NetworkPolicy") == []


def test_notes_render(tmp_path: Path) -> None:
    done = helm_run(
        "install",
        RELEASE,
        str(CHART),
        "--dry-run=client",
        "--namespace",
        NAMESPACE,
        "-f",
        str(values_file(VALUE_SETS["peering-namespaced"], tmp_path)),
    )
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    assert "the namespaces team-a, team-b" in notes and 'kopf peering "polymorph"' in notes
    assert f"kubectl -n {NAMESPACE} rollout status deployment/{FULLNAME}" in notes
    assert "helm show crds CHART | kubectl apply --server-side -f -" in notes


def test_chart_needs_a_kubernetes_with_cel_validation() -> None:
    assert helm_run("template", RELEASE, str(CHART), "--kube-version", "1.29.0").returncode == 0
    done = helm_run("template", RELEASE, str(CHART), "--kube-version", "1.28.0")
    assert done.returncode != 0 and "chart requires kubeVersion: >=1.29.0-0" in done.stderr


@pytest.mark.parametrize(("case", "values"), CASES, ids=IDS)
def test_the_operator_accepts_the_charts_command_line_and_settings(case: str, values: dict[str, Any]) -> None:
    """The Deployment's args and the ConfigMap's POLYMORPH_* keys parse with the operator's own flags."""
    docs = render(values)
    container = _container(docs)
    env = {
        **one(docs, "ConfigMap", FULLNAME)["data"],
        **{e["name"]: "x" for e in container["env"] if "valueFrom" in e},
    }
    parser = argparse.ArgumentParser()
    operator_flags.configure(parser)
    known = {"POLYMORPH_" + a.dest.upper() for a in parser._actions if a.dest != "help"}
    assert set(one(docs, "ConfigMap", FULLNAME)["data"]) <= known
    assert container["args"][0] == "operator"
    config = operator_flags.from_args(parser.parse_args(container["args"][1:]), env)
    watched = values.get("watchNamespaces", [])
    assert config.namespaces == tuple(watched) and config.all_namespaces is (not watched)
    assert config.standalone is (values.get("replicas", 1) == 1)
    assert config.peering == "polymorph"
    assert config.store == values.get("store", {}).get("uri", "s3://polymorph-builds")
    assert config.cluster.store_secret == (values.get("store", {}).get("credentialsSecret") or None)
    secret = values.get("anthropic", {}).get("apiKeySecret", {})
    assert config.cluster.anthropic_secret == (
        (secret["name"], secret["key"]) if secret.get("name") else None
    )
    assert config.log_level == values.get("settings", {}).get("logLevel", "info")
    assert (config.metrics_port, config.health_port) == (9090, 8080)
