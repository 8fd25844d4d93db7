"""`polymorph operator` flags: environment fallbacks, and one sentence naming the flag for bad values."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from operator_harness import REPO

from polymorph.errors import UsageError
from polymorph.handlers.settings import OperatorConfig, configure, from_args

BASE = ["--namespace", "a", "--prometheus-url", "http://prom:9090", "--store", "s3://bucket/store"]


def parse(argv: list[str], env: dict[str, str] | None = None) -> OperatorConfig:
    parser = argparse.ArgumentParser()
    configure(parser)
    return from_args(parser.parse_args(argv), env or {})


def test_flags() -> None:
    config = parse([*BASE, "--namespace", "b", "--drift-interval", "2m", "--rollout-interval", "0.5", "--standalone",
                    "--store-secret", "creds", "--metrics-port", "9100"])  # fmt: skip
    assert config.namespaces == ("a", "b") and not config.all_namespaces
    assert config.drift_interval_s == 120 and config.rollout_interval_s == 0.5
    assert config.standalone and config.metrics_port == 9100 and config.health_port == 8080
    assert config.cluster.store == "s3://bucket/store" and config.cluster.store_secret == "creds"


def test_environment_fallbacks() -> None:
    env = {
        "POLYMORPH_ALL_NAMESPACES": "true", "POLYMORPH_PROMETHEUS_URL": "http://p:9090", "POLYMORPH_STORE": "/data",
        "POLYMORPH_DRIFT_INTERVAL": "30s", "POLYMORPH_ANTHROPIC_SECRET_NAME": "anthropic", "POLYMORPH_STANDALONE": "1",
        "POLYMORPH_SANDBOX_IMAGE": "engine:9", "POLYMORPH_PEERING": "pm",
    }  # fmt: skip
    config = parse([], env)
    assert config.all_namespaces and config.namespaces == () and config.prometheus_url == "http://p:9090"
    assert config.drift_interval_s == 30 and config.standalone and config.peering == "pm"
    assert (
        config.cluster.anthropic_secret == ("anthropic", "api-key")
        and config.cluster.sandbox_image == "engine:9"
    )
    # A flag wins over its environment variable.
    assert parse([*BASE, "--drift-interval", "5s"], {"POLYMORPH_DRIFT_INTERVAL": "1h"}).drift_interval_s == 5


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--prometheus-url", "http://p", "--store", "x"],
            "say what to watch: --namespace NS (repeatable) or --all-namespaces",
        ),
        ([*BASE, "--all-namespaces"], "give --namespace NS (repeatable) or --all-namespaces, not both"),
        (
            ["--namespace", "a", "--store", "x"],
            "--prometheus-url must be an http(s):// URL of Prometheus; got None",
        ),
        (["--namespace", "a", "--prometheus-url", "http://p"], "--store is required"),
        ([*BASE, "--drift-interval", "soon"], "--drift-interval must be a duration such as 30s, 1m or 6h"),
        ([*BASE, "--rollout-interval", "0"], "--rollout-interval must be more than 0 seconds"),
        ([*BASE, "--metrics-port", "99999"], "--metrics-port must be a port number from 1 to 65535"),
        ([*BASE, "--log-level", "loud"], "--log-level must be one of debug, info, warning, error"),
        (
            ["--namespace", "Bad_NS", "--prometheus-url", "http://p", "--store", "x"],
            "--namespace 'Bad_NS' is not a namespace name",
        ),
    ],
)
def test_bad_values_are_one_sentence(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as err:
        parse(argv)
    assert str(err.value).startswith(message)


def test_the_process_reports_bad_flags_without_a_traceback() -> None:
    done = subprocess.run([sys.executable, "-m", "polymorph.cli", "operator", "--namespace", "a"],
                          capture_output=True, text=True, cwd=REPO, timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == "error: --prometheus-url must be an http(s):// URL of Prometheus; got None"
