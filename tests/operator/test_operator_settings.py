"""`polymorph operator` flags: environment fallbacks, and one sentence naming the flag for bad values."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
from operator_harness import REPO

from polymorph.contract.errors import UsageError
from polymorph.contract.inputs import Parser
from polymorph.handlers.registry import kopf_settings
from polymorph.handlers.settings import DRIFT_INTERVAL, SETTINGS, OperatorConfig, configure, from_args

BASE = ["--namespace", "a", "--prometheus-url", "http://prom:9090", "--store", "s3://bucket/store"]


def parse(argv: list[str], env: dict[str, str] | None = None) -> OperatorConfig:
    parser = Parser()  # the class every polymorph command parses with
    configure(parser)
    return from_args(parser.parse_args(argv), env or {})


def test_flags() -> None:
    config = parse([*BASE, "--namespace", "b", "--drift-interval", "2m", "--rollout-interval", "500ms", "--standalone",
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
            "--prometheus-url (or POLYMORPH_PROMETHEUS_URL) is required: the http(s):// URL of Prometheus",
        ),
        (["--namespace", "a", "--prometheus-url", "http://p"], "--store is required"),
        (
            [*BASE, "--drift-interval", "soon"],
            "--drift-interval: 'soon' is not a duration; use a positive whole",
        ),
        (
            [*BASE, "--rollout-interval", "0"],
            "--rollout-interval: '0' is not a duration (durations must be positive)",
        ),
        ([*BASE, "--rollout-interval", "30"], "--rollout-interval: '30' is not a duration (add a unit: 30s)"),
        (
            [*BASE, "--rollout-interval", "0.5"],
            "--rollout-interval: '0.5' is not a duration (whole numbers only: 500ms)",
        ),
        (
            [*BASE, "--drift-interval", "-5m"],
            "--drift-interval: '-5m' is not a duration (durations must be positive)",
        ),
        (
            [*BASE, "--drift-interval", "400d"],
            "--drift-interval: '400d' is longer than the longest duration allowed",
        ),
        (
            ["--namespace", "a", "--prometheus-url", "http://[::1", "--store", "/s"],
            "--prometheus-url must be an http(s):// URL (Invalid IPv6 URL)",
        ),
        (
            ["--namespace", "a", "--prometheus-url", "http://127.0.0.1:99999", "--store", "/s"],
            "--prometheus-url must be an http(s):// URL (Port out of range",
        ),
        (
            ["--namespace", "a", "--prometheus-url", "ftp://p", "--store", "/s"],
            "--prometheus-url must be an http(s):// URL such as",
        ),
        (
            ["--namespace", "a", "--prometheus-url", "http://p", "--store", "store"],
            "--store 'store' is a relative path",
        ),
        (
            ["--namespace", "a", "--prometheus-url", "http://p", "--store", "./.polymorph/store"],
            "--store './.polymorph/store' is a relative path",
        ),
        (
            [*BASE, "--metrics-port", "9" * 5000],
            "--metrics-port must be a port number from 1 to 65535; got '999",
        ),
        (
            [*BASE, "--peering-priority", "9" * 5000],
            "--peering-priority must be a whole number from 0 to 2147483647",
        ),
        ([*BASE, "--metrics-port", "99999"], "--metrics-port must be a port number from 1 to 65535"),
        ([*BASE, "--log-level", "loud"], "--log-level must be one of debug, info, warning, error"),
        (
            ["--namespace", "Bad_NS", "--prometheus-url", "http://p", "--store", "x"],
            "--namespace 'Bad_NS' is not a namespace name",
        ),
        (
            [*BASE, "--peering-priority", "-3"],
            "--peering-priority must be a whole number from 0 to 2147483647",
        ),
        ([*BASE, "--peering-priority", "2147483648"], "--peering-priority must be a whole number from 0"),
    ],
)
def test_bad_values_are_one_sentence(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as err:
        parse(argv)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"POLYMORPH_ROLLOUT_INTERVAL": "30"},
            "POLYMORPH_ROLLOUT_INTERVAL: '30' is not a duration (add a unit: 30s)",
        ),
        ({"POLYMORPH_DRIFT_INTERVAL": "1.5"}, "POLYMORPH_DRIFT_INTERVAL: '1.5' is not a duration"),
        ({"POLYMORPH_METRICS_PORT": "http"}, "POLYMORPH_METRICS_PORT must be a port number from 1 to 65535"),
        ({"POLYMORPH_STANDALONE": "maybe"}, "POLYMORPH_STANDALONE must be true or false"),
    ],
)
def test_bad_environment_values_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError) as err:
        parse(BASE, env)
    assert str(err.value).startswith(message)


def test_each_default_is_declared_once() -> None:
    """The help text, the fallback and OperatorConfig's defaults all come from the one Setting."""
    for setting in SETTINGS:
        assert setting.env in setting.help_text()
        if setting.default and not setting.shown:
            assert f"default: {setting.default};" in setting.help_text()
    config = parse(BASE)
    assert (config.drift_interval_s, config.rollout_interval_s, config.metrics_port) == (60, 30, 9090)
    assert (config.health_port, config.peering, config.log_level) == (8080, "polymorph", "info")
    fields = OperatorConfig.__dataclass_fields__
    assert fields["drift_interval_s"].default == DRIFT_INTERVAL.default_value() == 60


def test_the_docs_table_shows_each_default() -> None:
    """docs/configuration.md's table of operator flags states the defaults the settings declare."""
    page = (REPO / "docs" / "configuration.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| `--")]
    for setting in SETTINGS:
        row = next((r for r in rows if f"`{setting.flag}" in r), None)
        assert row is not None, f"{setting.flag} is missing from the table of operator flags"
        if setting.default and not setting.shown:
            assert f"`{setting.default}`" in row, (setting.flag, row)


def test_the_process_reports_bad_flags_without_a_traceback() -> None:
    done = subprocess.run([sys.executable, "-m", "polymorph.cli", "operator", "--namespace", "a"],
                          capture_output=True, text=True, cwd=REPO, timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == "error: --prometheus-url (or POLYMORPH_PROMETHEUS_URL) is required: the http(s):// URL of Prometheus"
    )


def test_peering_priority_is_random_per_process_unless_given() -> None:
    """kopf pauses every replica that sees a peer of equal priority: two processes must not share one."""
    drawn = {parse(BASE).peering_priority for _ in range(20)}
    assert len(drawn) == 20 and all(0 < p < 2**31 for p in drawn)
    assert parse([*BASE, "--peering-priority", "7"]).peering_priority == 7
    assert parse(BASE, {"POLYMORPH_PEERING_PRIORITY": "9"}).peering_priority == 9
    assert (
        parse([*BASE, "--peering-priority", "7"], {"POLYMORPH_PEERING_PRIORITY": "9"}).peering_priority == 7
    )


def test_kopf_settings_carry_the_peering_priority() -> None:
    config = parse([*BASE, "--peering-priority", "42", "--peering", "pm"])
    settings = kopf_settings(SimpleNamespace(config=config))  # type: ignore[arg-type]  # only .config is read
    assert (
        settings.peering.priority == 42 and settings.peering.name == "pm" and not settings.peering.standalone
    )
