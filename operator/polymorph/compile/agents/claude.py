"""The Claude agent: Claude edits a working copy of the best build through tools and runs experiments.

Speaks the Anthropic Messages API with tool use through the ``anthropic`` SDK. Tools, by
these exact names:
- ``list_files``: the files of the working copy;
- ``read_file {path}`` / ``write_file {path, content}``: inside the working copy only
  (``..``, absolute paths and symlinks are refused);
- ``run_experiment {description}``: snapshots the working copy as a new build, runs it
  through verification and benchmark, and answers with the status, verification values,
  figures and their spread, as text;
- ``finish {summary}``: ends the campaign.

The system prompt gives the hardware, the workload profile, the objective, its constraints,
the gates and the rules; the first message gives the leaderboard and the best build's
source. Budgets: experiments and the deadline are the campaign's; tokens (input + output,
across resumes) are this agent's, and each experiment's record carries the tokens spent
since the previous one. Transient API errors are retried by the SDK (``max_retries``); a
failure that outlasts them raises ``AgentError`` and the campaign ends with its best result.
Old tool results and written file contents are elided from the conversation (``compact``)
so a long campaign stays within the context window.

The API key is passed in by the caller (``resolve_api_key``) and never written anywhere:
not in prompts, records, logs or error messages.

Robust to what a model may send: several tool calls in one turn (answered in order),
text-only turns (a turn that ends without tool calls ends the campaign gracefully; one cut
by ``max_tokens`` is asked to continue), unknown tools and bad arguments (answered with
``is_error``).

It knows nothing about the store, the ledger or how experiments run.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from polymorph.api import ExperimentRecord
from polymorph.api.build import TokenUsage
from polymorph.compile.agents.base import AgentError, BudgetExhausted, CampaignContext
from polymorph.errors import StoreError, UsageError

__all__ = ["TOOLS", "ClaudeAgent", "ToolError", "compact", "resolve_api_key", "safe_path"]

KEY_FILE_ENV = "POLYMORPH_ANTHROPIC_KEY_FILE"
MAX_FILE_BYTES = 512 * 1024
MAX_SOURCE_CHARS = 60_000

TOOLS: list[dict[str, Any]] = [
    {
        "name": "list_files",
        "description": "List the files of the working copy (the build you are editing), with their sizes.",
        "input_schema": {"type": "object", "properties": {}},
    },
    {
        "name": "read_file",
        "description": "Read a text file of the working copy. Paths are relative to the build directory.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "relative path, e.g. hotpath.py"}},
            "required": ["path"],
        },
    },
    {
        "name": "write_file",
        "description": "Create or replace a text file in the working copy. Paths are relative to the build directory.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
    {
        "name": "run_experiment",
        "description": (
            "Snapshot the working copy as a new build, load it into the hot engine, verify it against the "
            "reference outputs and benchmark it on the workload. Returns status, verification, figures and noise."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "description": {"type": "string", "description": "what this build changes and why"}
            },
            "required": ["description"],
        },
    },
    {
        "name": "finish",
        "description": "End the campaign. The best build that passes the gates beyond noise is the result.",
        "input_schema": {
            "type": "object",
            "properties": {"summary": {"type": "string"}},
            "required": ["summary"],
        },
    },
]


class ToolError(Exception):
    """A tool call the agent cannot carry out; the message goes back to the model as is_error."""


def resolve_api_key(key_file: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The Anthropic API key: from ``key_file``, else ``$POLYMORPH_ANTHROPIC_KEY_FILE``, else ``$ANTHROPIC_API_KEY``."""
    env = os.environ if env is None else env
    path = key_file or env.get(KEY_FILE_ENV)
    if path:
        try:
            key = Path(path).read_text().strip()
        except OSError as exc:
            raise UsageError(
                f"cannot read the Anthropic API key file {path}: {exc.strerror or exc}"
            ) from None
        if not key:
            raise UsageError(f"the Anthropic API key file {path} is empty")
        return key
    key = env.get("ANTHROPIC_API_KEY", "").strip()
    if not key:
        raise UsageError(
            "the Claude agent needs an Anthropic API key: set ANTHROPIC_API_KEY, or pass --api-key-file "
            f"(or set {KEY_FILE_ENV}) naming a file that holds it"
        )
    return key


def safe_path(root: Path, rel: object) -> Path:
    """``rel`` inside ``root``; ToolError for non-strings, absolute paths, ``..`` and symlinks on the way."""
    if not isinstance(rel, str) or not rel.strip():
        raise ToolError("path must be a non-empty relative path such as hotpath.py")
    if "\x00" in rel or "\\" in rel:
        raise ToolError(f"path {rel!r} may not contain NUL or backslashes")
    parts = PurePosixPath(rel)
    if parts.is_absolute() or rel.startswith("~"):
        raise ToolError(f"path {rel!r} is absolute; use a path relative to the build directory")
    if any(p == ".." for p in parts.parts):
        raise ToolError(f"path {rel!r} leaves the build directory ('..' is not allowed)")
    current = root
    for part in parts.parts:
        if part == ".":
            continue
        current = current / part
        if current.is_symlink():
            raise ToolError(f"path {rel!r} goes through a symlink, which is not allowed")
    resolved = current.resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise ToolError(f"path {rel!r} leaves the build directory")
    return current


def _files(root: Path) -> list[tuple[str, int]]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(
            d for d in dirnames if d != "__pycache__" and not (Path(dirpath) / d).is_symlink()
        )
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_symlink() or name.endswith(".pyc"):
                continue
            out.append((path.relative_to(root).as_posix(), path.stat().st_size))
    return out


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def describe_record(record: ExperimentRecord, ctx: CampaignContext) -> str:
    """An experiment's outcome as the model reads it."""
    lines = [f"build {record.build}", f"status: {record.status}"]
    if record.error:
        lines.append(f"error: {record.error}")
    v = record.verification
    if v is not None:
        lines.append(
            f"verification: passed={v.passed} tokenAgreement={_fmt(v.tokenAgreement)} "
            f"(gate >= {ctx.gates.tokenAgreement:g}) logitError={_fmt(v.logitError)} "
            f"(gate <= {ctx.gates.logitTolerance:g}) finite={v.finite}"
        )
    f = record.figures
    if f is not None:
        lines.append(
            f"figures: outputTokensPerSecond={_fmt(f.outputTokensPerSecond)} totalTokensPerSecond={_fmt(f.totalTokensPerSecond)} "
            f"ttftP50Ms={_fmt(f.ttftP50Ms)} ttftP95Ms={_fmt(f.ttftP95Ms)} itlP50Ms={_fmt(f.itlP50Ms)} itlP95Ms={_fmt(f.itlP95Ms)}"
        )
        lines.append(
            f"spread: noise={f.noise * 100:.1f}% (max-min over median), repeats={[round(x, 1) for x in f.repeats]}"
        )
        cmp = ctx.compare(record)
        if cmp is not None:
            verdict = "beyond noise" if cmp.significant else "within noise"
            lines.append(
                f"vs baseline: {cmp.speedup:.3f}x on {ctx.objective.metric} ±{cmp.noise * 100:.1f}% ({verdict})"
            )
        if not ctx.eligible(record):
            lines.append("constraints: violated, so this build cannot win")
    t = record.timings
    lines.append(f"timings: load {t.loadS:.2f}s verify {t.verifyS:.2f}s bench {t.benchS:.2f}s")
    lines.append(f"experiments left: {ctx.experiments_left()}")
    return "\n".join(lines)


def leaderboard_text(ctx: CampaignContext, limit: int = 10) -> str:
    rows = []
    for i, r in enumerate(ctx.leaderboard(limit), 1):
        cmp = ctx.compare(r)
        speed = f"{cmp.speedup:.3f}x ±{cmp.noise * 100:.0f}%" if cmp else "-"
        desc = (r.description or r.name)[:80]
        rows.append(f"{i}. {r.build[:19]} {speed} knobs={json.dumps(r.knobs, sort_keys=True)} {desc}")
    return "\n".join(rows) or "(empty)"


def system_prompt(ctx: CampaignContext, instructions: str) -> str:
    objective = ctx.objective
    direction = "maximise" if objective.maximize else "minimise"
    constraints = ", ".join(
        f"{c.metric}"
        + (f" >= {c.min:g}" if c.min is not None else "")
        + (f" <= {c.max:g}" if c.max is not None else "")
        for c in objective.constraints
    )
    workload = (
        json.dumps(ctx.workload.model_dump(mode="json")) if ctx.workload is not None else "a captured trace"
    )
    gates = ctx.gates
    text = f"""You are optimising the inference code of a large language model for one workload on one machine.
You edit a build: a directory with build.toml (name, parent, knobs and their defaults) and Python modules
whose entry point turns the loaded model into a hot path (prefill, decode, new_cache, sample, free, close).
Every experiment hot-swaps your build into a running engine, checks it against the reference build's
golden outputs, then benchmarks a replay of the workload.

Hardware: {ctx.hardware or "unknown"}
Workload profile: {workload}
Objective: {direction} {objective.metric}.{" Constraints: " + constraints + "." if constraints else ""}
Gates: token agreement >= {gates.tokenAgreement:g}, logit error <= {gates.logitTolerance:g}, and a result must be
at least {gates.minSpeedup:g}x the baseline even at the unfavourable edge of the measured noise.

Rules:
- Correctness is checked on every experiment; a build that fails verification never wins. NaN never passes.
- Never special-case the benchmark, the prompts or the workload; the code must be correct for any input.
- Keep no module-level mutable state in the build; everything lives on the hot path object.
- Make one idea per experiment, describe it in run_experiment's description, and call finish when done.
- You have a budget of {ctx.experiments_left()} experiments and a token budget; use them well."""
    if instructions.strip():
        text += f"\n\nInstructions from the campaign owner:\n{instructions.strip()}"
    return text


ELIDED = " …(elided to save context; re-read the file if you need it)"


def compact(messages: list[dict[str, Any]], keep: int = 12, limit: int = 400) -> None:
    """Shorten tool results and written file contents older than the last ``keep`` messages, in place.

    The conversation keeps its shape (every tool_use still has its tool_result), so the API
    accepts it, but a long campaign no longer resends every file it ever read or wrote.
    """
    for msg in messages[1:-keep] if len(messages) > keep + 1 else []:
        if not isinstance(msg["content"], list):
            continue
        for block in msg["content"]:
            if block.get("type") == "tool_result" and isinstance(block.get("content"), str):
                if len(block["content"]) > limit:
                    block["content"] = block["content"][:limit] + ELIDED
            elif block.get("type") == "tool_use" and isinstance(block.get("input"), dict):
                content = block["input"].get("content")
                if isinstance(content, str) and len(content) > limit:
                    block["input"] = block["input"] | {"content": content[:limit] + ELIDED}


def _block_param(block: Any) -> dict[str, Any] | None:
    """An assistant content block as a request parameter (unknown kinds are dropped)."""
    kind = getattr(block, "type", None)
    if kind == "text":
        return {"type": "text", "text": block.text}
    if kind == "tool_use":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    return None


class ClaudeAgent:
    """Claude, through the Messages API with tool use, proposing builds as source edits."""

    name = "claude"

    def __init__(
        self,
        *,
        api_key: str,
        model: str = "claude-sonnet-4-5",
        instructions: str = "",
        max_tokens: int = 2_000_000,
        max_retries: int = 4,
        timeout: float = 300.0,
        turn_max_tokens: int = 8192,
    ) -> None:
        self._api_key = api_key
        self.model = model
        self.instructions = instructions
        self.max_tokens = max_tokens
        self.max_retries = max_retries
        self.timeout = timeout
        self.turn_max_tokens = turn_max_tokens
        self.used = TokenUsage()
        self._pending = TokenUsage()
        self._snapshots = 0

    def __repr__(self) -> str:  # never show the key
        return f"ClaudeAgent(model={self.model!r})"

    # --- the loop -----------------------------------------------------------------------------

    def run(self, ctx: CampaignContext) -> str:
        import anthropic

        client = anthropic.Anthropic(
            api_key=self._api_key, max_retries=self.max_retries, timeout=self.timeout
        )
        self.used = ctx.token_usage()
        work = Path(ctx.workdir) / "claude-working-copy"
        shutil.copytree(ctx.best_dir(), work, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        system = system_prompt(ctx, self.instructions)
        messages: list[dict[str, Any]] = [{"role": "user", "content": self._intro(ctx, work)}]
        nudges = 0
        while True:
            ctx.ensure_budget()  # no experiment could run, so asking the model is pointless
            if self.used.inputTokens + self.used.outputTokens >= self.max_tokens:
                raise BudgetExhausted("tokens", f"the token budget ({self.max_tokens} tokens) is spent")
            compact(messages)
            response = self._create(client, anthropic, system, messages)
            usage = TokenUsage(
                inputTokens=response.usage.input_tokens or 0, outputTokens=response.usage.output_tokens or 0
            )
            self._add(usage)
            ctx.record_usage(usage)
            content = [p for p in (_block_param(b) for b in response.content) if p is not None]
            messages.append(
                {"role": "assistant", "content": content or [{"type": "text", "text": "(no content)"}]}
            )
            calls = [b for b in response.content if getattr(b, "type", None) == "tool_use"]
            if not calls:
                if response.stop_reason in ("max_tokens", "pause_turn") and nudges < 3:
                    nudges += 1
                    messages.append(
                        {
                            "role": "user",
                            "content": "Continue, using the tools; call finish when you are done.",
                        }
                    )
                    continue
                ctx.log(f"the model ended its turn ({response.stop_reason}) without calling finish")
                return f"the model stopped ({response.stop_reason}) without calling finish"
            nudges = 0
            results: list[dict[str, Any]] = []
            summary: str | None = None
            for call in calls:
                if summary is not None:
                    results.append(_result(call.id, "ignored: finish was already called in this turn", True))
                    continue
                try:
                    if call.name == "finish":
                        args = call.input if isinstance(call.input, dict) else {}
                        summary = str(args.get("summary", "")) or "finished"
                        results.append(_result(call.id, "campaign finished"))
                    else:
                        results.append(_result(call.id, self._tool(ctx, work, call.name, call.input)))
                except ToolError as exc:
                    results.append(_result(call.id, str(exc), True))
                except OSError as exc:  # e.g. writing "a/b" where "a" is a file
                    results.append(_result(call.id, f"{call.name} failed: {exc.strerror or exc}", True))
            messages.append({"role": "user", "content": results})
            if summary is not None:
                return f"Claude finished: {summary}"

    def _create(self, client: Any, anthropic: Any, system: str, messages: list[dict[str, Any]]) -> Any:
        try:
            return client.messages.create(
                model=self.model,
                max_tokens=self.turn_max_tokens,
                system=system,
                tools=TOOLS,
                messages=messages,
            )
        except anthropic.APIStatusError as exc:
            raise AgentError(
                f"the Anthropic API answered HTTP {exc.status_code} and still failed after {self.max_retries} retries"
            ) from None
        except anthropic.APIConnectionError:
            raise AgentError(
                f"the Anthropic API could not be reached after {self.max_retries} retries"
            ) from None

    def _add(self, usage: TokenUsage) -> None:
        self.used = TokenUsage(
            inputTokens=self.used.inputTokens + usage.inputTokens,
            outputTokens=self.used.outputTokens + usage.outputTokens,
        )
        self._pending = TokenUsage(
            inputTokens=self._pending.inputTokens + usage.inputTokens,
            outputTokens=self._pending.outputTokens + usage.outputTokens,
        )

    def _intro(self, ctx: CampaignContext, work: Path) -> str:
        parts = [
            "Leaderboard (best first):",
            leaderboard_text(ctx),
            "",
            "Your working copy is a copy of the best build so far. Its files:",
        ]
        budget = MAX_SOURCE_CHARS
        for rel, size in _files(work):
            parts.append(f"--- {rel} ({size} bytes)")
            if size <= budget:
                try:
                    text = (work / rel).read_text()
                except UnicodeDecodeError:
                    continue
                parts.append(text)
                budget -= size
            else:
                parts.append("(not shown; use read_file)")
        parts.append("Improve the objective. Use write_file, then run_experiment; call finish when done.")
        return "\n".join(parts)

    # --- tools --------------------------------------------------------------------------------

    def _tool(self, ctx: CampaignContext, work: Path, name: str, args: Any) -> str:
        args = args if isinstance(args, dict) else {}
        if name == "list_files":
            return "\n".join(f"{rel} ({size} bytes)" for rel, size in _files(work)) or "(no files)"
        if name == "read_file":
            path = safe_path(work, args.get("path"))
            if not path.is_file():
                raise ToolError(
                    f"{args.get('path')} is not a file in the working copy; list_files shows what exists"
                )
            data = path.read_bytes()
            if len(data) > MAX_FILE_BYTES:
                raise ToolError(f"{args.get('path')} is larger than {MAX_FILE_BYTES} bytes")
            try:
                return data.decode()
            except UnicodeDecodeError:
                raise ToolError(f"{args.get('path')} is not UTF-8 text") from None
        if name == "write_file":
            content = args.get("content")
            if not isinstance(content, str):
                raise ToolError("write_file needs content as a string")
            if len(content.encode()) > MAX_FILE_BYTES:
                raise ToolError(f"content is larger than {MAX_FILE_BYTES} bytes")
            path = safe_path(work, args.get("path"))
            if path.exists() and not path.is_file():
                raise ToolError(f"{args.get('path')} exists and is not a file")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
            return f"wrote {len(content)} characters to {args.get('path')}"
        if name == "run_experiment":
            description = str(args.get("description", ""))[:500]
            self._snapshots += 1
            snapshot = Path(ctx.workdir) / f"claude-{self._snapshots:04d}"
            while snapshot.exists():
                self._snapshots += 1
                snapshot = Path(ctx.workdir) / f"claude-{self._snapshots:04d}"
            shutil.copytree(
                work, snapshot, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
            usage, self._pending = self._pending, TokenUsage()
            try:
                record = ctx.run_experiment(snapshot, description=description, usage=usage)
            except StoreError as exc:  # the snapshot cannot be archived (size, odd files)
                self._pending = usage  # still owed to the next experiment's record
                raise ToolError(f"this build cannot be run: {exc}") from None
            return describe_record(record, ctx) + "\n\nLeaderboard:\n" + leaderboard_text(ctx, 5)
        known = ", ".join(t["name"] for t in TOOLS)
        raise ToolError(f"unknown tool {name!r}; the tools are {known}")


def _result(tool_use_id: str, text: str, is_error: bool = False) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id, "content": text}
    if is_error:
        block["is_error"] = True
    return block
