"""ClaudeAgent over the wire: the real ``anthropic`` SDK against a local Messages API server.

The end-to-end test runs ``polymorph compile --agent claude`` as a process on the real engine:
a 529 answer that the SDK retries, several tool calls in one turn, a build that fails
verification (reported back to the model), a passing build, an unknown tool and a path
escape (both answered with is_error), then ``finish``; and the API key appears nowhere.
The in-process tests cover a persistent API failure, a turn that ends without ``finish``,
the token budget and path safety, with a model-free runner.
"""

from __future__ import annotations

import gzip
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fake_anthropic import FakeAnthropic, Reply, error, message, result_text, text, tool_results, tool_use
from pairing_support import paired

from polymorph.compile.agents.claude import TOOLS, ClaudeAgent, ToolError, resolve_api_key, safe_path
from polymorph.compile.agents.claude_context import describe_record
from polymorph.compile.campaign import Campaign, CampaignSettings
from polymorph.compile.ledger import CampaignPaths
from polymorph.contract import timeouts
from polymorph.contract.api import Budget, ExperimentRecord, Figures, Verification
from polymorph.contract.api.common import Histogram, WorkloadProfile
from polymorph.contract.builds import read_build
from polymorph.contract.store import build_id, open_store

WRONG = '''"""A deliberately wrong build: the reference hot path with negated logits."""
from .hotpath import load as _load


class Wrong:
    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def prefill(self, cache, slot, tokens):
        return -self.inner.prefill(cache, slot, tokens)

    def decode(self, cache, slots, tokens):
        return -self.inner.decode(cache, slots, tokens)


def load(model, knobs):
    return Wrong(_load(model, knobs))
'''


def _script() -> Any:
    state: dict[str, str] = {}

    def brain(request: dict[str, Any], n: int) -> Reply:
        if n == 0:
            return error(529, "overloaded_error", "Overloaded")
        if n == 1:
            return message(
                [
                    text("Let me look."),
                    tool_use("list_files", {}),
                    tool_use("read_file", {"path": "build.toml"}),
                ]
            )
        if n == 2:
            toml = result_text(tool_results(request)[1])
            state["toml"] = toml
            wrong_toml = toml.replace('entry = "hotpath.py"', 'entry = "wrong.py"')
            return message(
                [
                    tool_use("write_file", {"path": "wrong.py", "content": WRONG}),
                    tool_use("write_file", {"path": "build.toml", "content": wrong_toml}),
                    tool_use("run_experiment", {"description": "negate the logits"}),
                ]
            )
        if n == 3:
            fused = state["toml"].replace(
                "[knobs.fused_qkv]\nchoices = [false, true]\ndefault = false",
                "[knobs.fused_qkv]\nchoices = [false, true]\ndefault = true",
            )
            return message(
                [
                    text("That failed verification; fusing qkv instead."),
                    tool_use("write_file", {"path": "build.toml", "content": fused + "\n# fused qkv\n"}),
                    tool_use("run_experiment", {"description": "fuse the q/k/v projections"}),
                    tool_use("rm_rf", {"path": "/"}),
                    tool_use("read_file", {"path": "../../../etc/passwd"}),
                ]
            )
        if n == 4:
            return message([tool_use("finish", {"summary": "fused qkv"})])
        return message([text("done")], stop_reason="end_turn")

    return brain


def _all_text(root: Path) -> str:
    out = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            out.append(
                (gzip.decompress(data) if path.name.endswith(".gz") else data).decode(errors="replace")
            )
    return "\n".join(out)


@pytest.mark.slow
def test_claude_campaign_over_the_wire_on_the_real_engine(tmp_path: Path) -> None:
    key = "sk-ant-test-" + secrets.token_hex(16)
    store = tmp_path / "store"
    with FakeAnthropic(key, _script()) as api:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
        env.update(ANTHROPIC_BASE_URL=api.url, ANTHROPIC_API_KEY=key)
        cmd = [
            sys.executable,
            "-m",
            "polymorph.cli",
            "compile",
            "--agent",
            "claude",
            "--store",
            str(store),
            "--json",
        ]
        proc = subprocess.run(
            [*cmd, "--repeats", "3", "--max-experiments", "6", "--campaign", "claude"],
            capture_output=True,
            text=True,
            timeout=240,
            env=env,
        )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["stopReason"] == "finished" and "fused qkv" in doc["stopMessage"]
    # 529 retried by the SDK: five requests reached the server, each authenticated.
    assert len(api.requests) == 5
    assert all(h.get("x-api-key") == key or h.get("authorization") == f"Bearer {key}" for h in api.headers)
    first = api.requests[1]
    assert {t["name"] for t in first["tools"]} == {
        "list_files",
        "read_file",
        "write_file",
        "run_experiment",
        "finish",
    }
    assert "Workload profile" in first["system"] and "Gates" in first["system"]
    assert "never special-case the benchmark" in first["system"].lower()
    listing, toml = tool_results(api.requests[2])
    assert "build.toml" in result_text(listing) and "[build]" in result_text(toml)
    # The wrong build failed verification, and the model was told so.
    wrong = tool_results(api.requests[3])[-1]
    assert "status: rejected" in result_text(wrong) and "verification: passed=False" in result_text(wrong)
    ran, unknown, escape = tool_results(api.requests[4])[1:]
    assert "status: passed" in result_text(ran)
    assert unknown.get("is_error") and "unknown tool 'rm_rf'" in result_text(unknown)
    assert escape.get("is_error") and ".." in result_text(escape)
    # The ledger: baseline, rejected, passed; tokens recorded per experiment and in progress.
    s = open_store(str(store))
    ledger_key = next(k for k in s.list("compilejobs/") if k.endswith(".jsonl"))
    records = s.read_jsonl(ledger_key)
    assert [r["status"] for r in records] == ["passed", "rejected", "passed"]
    assert all(r["agent"] == "claude" for r in records)
    assert records[1]["usage"] == {"inputTokens": 2000, "outputTokens": 400}
    progress = s.get_json(ledger_key.replace("ledger-0.jsonl", "progress-0.json"))
    assert progress["tokens"] == {"inputTokens": 4000, "outputTokens": 800}
    # The key is nowhere: not in stdout, stderr, the ledger, progress, result or any stored build.
    assert key not in proc.stdout and key not in proc.stderr
    assert key not in _all_text(store)


# ----------------------------------------------------------------------------------------------
# In process, with a model-free runner
# ----------------------------------------------------------------------------------------------

TOML = '[build]\nname = "toy"\n\n[knobs.batch]\nchoices = [1, 2]\ndefault = 1\n'


def _toy_figures(tps: float, shift: int = 0) -> Figures:
    offsets = (0.0, 0.01, -0.01, 0.005, -0.005)
    reps = [tps * (1 + offsets[(i + shift) % len(offsets)]) for i in range(len(offsets))]
    return Figures(
        outputTokensPerSecond=tps,
        totalTokensPerSecond=tps,
        ttftP50Ms=1,
        ttftP95Ms=1,
        itlP50Ms=1,
        itlP95Ms=1,
        noise=0.01,
        repeats=reps,
    )


class ToyRunner:
    """tok/s = 100 x batch, paired with ``against``'s figures when asked."""

    def run(
        self, build_dir: Path, *, description: str = "", against: Path | None = None, screen: bool = False
    ) -> ExperimentRecord:
        fig = _toy_figures(100.0 * int(read_build(build_dir).defaults()["batch"]))
        comparison = None
        if against is not None:
            base = _toy_figures(100.0 * int(read_build(against).defaults()["batch"]), shift=1)
            comparison = paired(fig, base, build_id(against))
        ver = Verification(tokenAgreement=1, logitError=0, finite=True, passed=True)
        return ExperimentRecord(
            build="x", status="passed", verification=ver, figures=fig, comparison=comparison
        )


def _campaign(tmp_path: Path) -> Campaign:
    base = tmp_path / "toy"
    base.mkdir()
    (base / "build.toml").write_text(TOML)
    (base / "hotpath.py").write_text("def load(model, knobs):\n    raise NotImplementedError\n")
    profile = WorkloadProfile(
        inputTokens=Histogram(bounds=[8], counts=[1]), outputTokens=Histogram(bounds=[8], counts=[1])
    )
    settings = CampaignSettings(
        paths=CampaignPaths("local", "claude", "u1"),
        base_dir=base,
        base_build="reference",
        workload=profile,
        workload_hash=profile.digest(),
        budget=Budget(maxExperiments=10, sandboxes=1),
        agent="claude",
    )
    return Campaign(settings, open_store(str(tmp_path / "store")), ToyRunner())


def test_persistent_api_failure_ends_the_campaign_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk-ant-test-" + secrets.token_hex(8)
    with FakeAnthropic(key, lambda req, n: error(529, "overloaded_error", "Overloaded")) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        out = _campaign(tmp_path).run(
            ClaudeAgent(api_key=key, limits=timeouts.Limits(connect_s=5, read_s=30, attempts=3))
        )
    assert len(api.requests) == 3  # the first try and two retries
    assert out.stopReason == "agentError" and "HTTP 529" in out.message and key not in out.message
    assert out.result.baseline is not None and out.result.state == "noImprovement"
    assert out.progress.state == "finished"


def test_end_turn_without_finish_and_max_tokens_nudge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    replies = [
        message([text("thinking out loud...")], stop_reason="max_tokens"),
        message(
            [
                tool_use(
                    "write_file",
                    {"path": "build.toml", "content": TOML.replace("default = 1", "default = 2")},
                )
            ]
        ),
        message(
            [
                tool_use("run_experiment", {"description": "batch 2"}),
                tool_use("write_file", {"path": "build.toml/inside", "content": "x"}),
            ]
        ),
        message([text("I am done.")], stop_reason="end_turn"),
    ]
    with FakeAnthropic("k", lambda req, n: replies[n]) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        out = _campaign(tmp_path).run(ClaudeAgent(api_key="k"))
    assert "Continue" in json.dumps(api.requests[1]["messages"][-1])
    ran, bad_write = tool_results(api.requests[3])
    assert "status: passed" in result_text(ran) and bad_write.get("is_error")
    assert out.stopReason == "finished" and "without calling finish" in out.message
    assert (
        out.result.state == "improved"
        and out.result.best is not None
        and out.result.best.speedup == pytest.approx(2.0, rel=0.01)
    )


def test_token_budget_stops_the_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeAnthropic("k", lambda req, n: message([tool_use("list_files", {})], usage=(1000, 200))) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        out = _campaign(tmp_path).run(ClaudeAgent(api_key="k", max_tokens=2000))
    assert len(api.requests) == 2 and out.stopReason == "tokens"
    assert out.progress.tokens.model_dump() == {"inputTokens": 2000, "outputTokens": 400}


def test_paths_are_confined_to_the_working_copy(tmp_path: Path) -> None:
    root = tmp_path / "wc"
    (root / "sub").mkdir(parents=True)
    (tmp_path / "outside").write_text("secret")
    (root / "link").symlink_to(tmp_path / "outside")
    (root / "dirlink").symlink_to(tmp_path)
    assert safe_path(root, "sub/new.py") == root / "sub" / "new.py"
    for bad in ("../outside", "/etc/passwd", "sub/../../outside", "link", "dirlink/outside", "", 3, "~/x"):
        with pytest.raises(ToolError):
            safe_path(root, bad)
    assert [t["name"] for t in TOOLS] == ["list_files", "read_file", "write_file", "run_experiment", "finish"]


def test_api_key_sources(tmp_path: Path) -> None:
    keyfile = tmp_path / "key"
    keyfile.write_text("from-file\n")
    assert resolve_api_key(str(keyfile), {}) == "from-file"
    assert (
        resolve_api_key(None, {"POLYMORPH_ANTHROPIC_KEY_FILE": str(keyfile), "ANTHROPIC_API_KEY": "env"})
        == "from-file"
    )
    assert resolve_api_key(None, {"ANTHROPIC_API_KEY": "env"}) == "env"
    assert "secret" not in repr(ClaudeAgent(api_key="secret"))


def test_compact_elides_old_tool_io_but_keeps_the_shape() -> None:
    from polymorph.compile.agents.claude import compact

    big = "y" * 5000
    messages: list[dict[str, Any]] = [{"role": "user", "content": "intro " + big}]
    for i in range(10):
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": f"t{i}",
                        "name": "write_file",
                        "input": {"path": "a.py", "content": big},
                    }
                ],
            }
        )
        messages.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": big}]}
        )
    compact(messages, keep=4)
    assert messages[0]["content"].endswith(big)  # the intro stays whole
    assert (
        len(messages[1]["content"][0]["input"]["content"]) < 500
        and len(messages[2]["content"][0]["content"]) < 500
    )
    assert (
        messages[-1]["content"][0]["content"] == big and messages[-2]["content"][0]["input"]["content"] == big
    )
    assert [m["content"][0]["tool_use_id"] for m in messages[2::2]] == [f"t{i}" for i in range(10)]


def test_the_agent_is_told_which_knobs_change_nothing_for_the_model(tmp_path: Path) -> None:
    campaign = _campaign(tmp_path)
    record = ExperimentRecord(build="x", status="passed", inertKnobs=["moe_experts", "moe_routing"])
    assert "knobs that change nothing for this model: moe_experts, moe_routing" in describe_record(
        record, campaign
    )
    assert "change nothing" not in describe_record(ExperimentRecord(build="x", status="passed"), campaign)
