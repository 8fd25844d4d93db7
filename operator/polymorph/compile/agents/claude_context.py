"""What the Claude agent shows and guards: tool definitions, the system prompt, record and
leaderboard text, the working-copy path check, and conversation compaction.

Pure functions over a ``campaign.Campaign`` and plain messages; they never call the API. The
agent loop that uses them is ``claude.ClaudeAgent``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath
from typing import Any

from polymorph.compile.campaign import Campaign
from polymorph.contract.api import ExperimentRecord

__all__ = [
    "ELIDED",
    "MAX_FILE_BYTES",
    "MAX_SOURCE_CHARS",
    "TOOLS",
    "ToolError",
    "compact",
    "describe_record",
    "files_of",
    "leaderboard_text",
    "safe_path",
    "system_prompt",
]

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
            "reference outputs and benchmark it on the workload, interleaved pass for pass with the baseline. "
            "Returns status, verification, figures and the paired comparison with the baseline."
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
        "description": "End the campaign. The best build whose paired interval clears the speedup gate is the result.",
        "input_schema": {
            "type": "object",
            "properties": {"summary": {"type": "string"}},
            "required": ["summary"],
        },
    },
]


class ToolError(Exception):
    """A tool call the agent cannot carry out; the message goes back to the model as is_error."""


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


def files_of(root: Path) -> list[tuple[str, int]]:
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


def describe_record(record: ExperimentRecord, campaign: Campaign) -> str:
    """An experiment's outcome as the model reads it."""
    lines = [f"build {record.build}", f"status: {record.status}"]
    if record.error:
        lines.append(f"error: {record.error}")
    v = record.verification
    if v is not None:
        lines.append(
            f"verification: passed={v.passed} tokenAgreement={_fmt(v.tokenAgreement)} "
            f"(gate >= {campaign.settings.gates.tokenAgreement:g}) logitError={_fmt(v.logitError)} "
            f"(gate <= {campaign.settings.gates.logitTolerance:g}) finite={v.finite}"
        )
    f = record.figures
    if f is not None:
        lines.append(
            f"figures: outputTokensPerSecond={_fmt(f.outputTokensPerSecond)} totalTokensPerSecond={_fmt(f.totalTokensPerSecond)} "
            f"ttftP50Ms={_fmt(f.ttftP50Ms)} ttftP95Ms={_fmt(f.ttftP95Ms)} itlP50Ms={_fmt(f.itlP50Ms)} itlP95Ms={_fmt(f.itlP95Ms)}"
        )
        lines.append(
            f"spread: noise=±{f.noise * 100:.1f}% (half-width of the 95% interval of the median tok/s), "
            f"repeats={[round(x, 1) for x in f.repeats]}"
        )
        paired = record.comparison
        if paired is not None:
            lines.append(
                f"paired with {paired.against[:19]}: outputTokensPerSecond ratio {paired.ratio:.3f}x, "
                f"{paired.confidence:.0%} interval [{paired.lo:.3f}, {paired.hi:.3f}] over {paired.pairs} pairs "
                f"({paired.order}, {paired.clock} clock)"
            )
        scored = campaign.standings.compare(record)
        if scored is not None:
            verdict = (
                "significant: paired, and the interval's lower bound is above 1x"
                if scored.wins
                else "not significant: unpaired, or the interval reaches 1x"
            )
            lines.append(
                f"vs baseline: {scored.estimate.value:.3f}x on {campaign.settings.objective.metric} "
                f"±{scored.estimate.half_width * 100:.1f}% ({verdict})"
            )
        if not campaign.standings.eligible(record):
            lines.append("constraints: violated, so this build cannot win")
    if record.inertKnobs:
        lines.append(f"knobs that change nothing for this model: {', '.join(record.inertKnobs)}")
    t = record.timings
    lines.append(f"timings: load {t.loadS:.2f}s verify {t.verifyS:.2f}s bench {t.benchS:.2f}s")
    lines.append(f"experiments left: {campaign.budget.experiments_left()}")
    return "\n".join(lines)


def leaderboard_text(campaign: Campaign, limit: int = 10) -> str:
    rows = []
    for i, r in enumerate(campaign.standings.leaderboard(limit), 1):
        scored = campaign.standings.compare(r)
        speed = f"{scored.estimate.value:.3f}x ±{scored.estimate.half_width * 100:.0f}%" if scored else "-"
        desc = (r.description or r.name)[:80]
        rows.append(f"{i}. {r.build[:19]} {speed} knobs={json.dumps(r.knobs, sort_keys=True)} {desc}")
    return "\n".join(rows) or "(empty)"


def system_prompt(campaign: Campaign, instructions: str) -> str:
    objective = campaign.settings.objective
    direction = "maximise" if objective.maximize else "minimise"
    constraints = ", ".join(
        f"{c.metric}"
        + (f" >= {c.min:g}" if c.min is not None else "")
        + (f" <= {c.max:g}" if c.max is not None else "")
        for c in objective.constraints
    )
    workload = (
        json.dumps(campaign.settings.workload.model_dump(mode="json"))
        if campaign.settings.workload is not None
        else "a captured trace"
    )
    gates = campaign.settings.gates
    text = f"""You are optimising the inference code of a large language model for one workload on one machine.
You edit a build: a directory with build.toml (name, parent, knobs and their defaults) and Python modules
whose entry point turns the loaded model into a hot path (prefill, decode, new_cache, sample, free, close).
Every experiment hot-swaps your build into a running engine, checks it against the reference build's
golden outputs, then benchmarks a replay of the workload.

Hardware: {campaign.settings.hardware or "unknown"}
Workload profile: {workload}
Objective: {direction} {objective.metric}.{" Constraints: " + constraints + "." if constraints else ""}
Gates: token agreement >= {gates.tokenAgreement:g}, logit error <= {gates.logitTolerance:g}, and a result must beat
the baseline by more than {gates.minSpeedup:g}x in a paired comparison: both builds replay the workload interleaved
in one engine (ABBA), and the lower bound of the 95% interval of the per-pair speedup must exceed {gates.minSpeedup:g}x.

Rules:
- Correctness is checked on every experiment; a build that fails verification never wins. NaN never passes.
- Never special-case the benchmark, the prompts or the workload; the code must be correct for any input.
- Keep no module-level mutable state in the build; everything lives on the hot path object.
- Make one idea per experiment, describe it in run_experiment's description, and call finish when done.
- You have a budget of {campaign.budget.experiments_left()} experiments and a token budget; use them well."""
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
