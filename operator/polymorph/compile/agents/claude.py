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

The tools, prompts and compaction are in ``claude_context``. The system prompt gives the hardware, the workload profile, the objective, its constraints,
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

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from polymorph.compile.agents.claude_context import (
    MAX_FILE_BYTES,
    MAX_SOURCE_CHARS,
    TOOLS,
    ToolError,
    compact,
    describe_record,
    files_of,
    leaderboard_text,
    safe_path,
    system_prompt,
)
from polymorph.compile.campaign import AgentError, Campaign
from polymorph.compile.judgement import BudgetExhausted
from polymorph.contract import timeouts
from polymorph.contract.api.build import TokenUsage
from polymorph.contract.errors import StoreError, UsageError

__all__ = ["TOOLS", "ClaudeAgent", "ToolError", "compact", "resolve_api_key", "safe_path"]

KEY_FILE_ENV = "POLYMORPH_ANTHROPIC_KEY_FILE"


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
        limits: timeouts.Limits = timeouts.ANTHROPIC,
        turn_max_tokens: int = 8192,
    ) -> None:
        self._api_key = api_key
        self.model = model
        self.instructions = instructions
        self.max_tokens = max_tokens
        self.limits = limits
        self.turn_max_tokens = turn_max_tokens
        self.used = TokenUsage()
        self._pending = TokenUsage()
        self._snapshots = 0

    def __repr__(self) -> str:  # never show the key
        return f"ClaudeAgent(model={self.model!r})"

    def client(self) -> Any:
        """The SDK's client: each call bounded by ``self.limits`` (``polymorph.contract.timeouts``)."""
        import anthropic  # lazy: the optional `agent` extra; only a Claude campaign needs the SDK

        return anthropic.Anthropic(
            api_key=self._api_key,
            max_retries=self.limits.retries,
            timeout=anthropic.Timeout(self.limits.read_s, connect=self.limits.connect_s),
        )

    # --- the loop -----------------------------------------------------------------------------

    def run(self, campaign: Campaign) -> str:
        import anthropic  # lazy: the optional `agent` extra; only a Claude campaign needs the SDK

        client = self.client()
        self.used = campaign.budget.tokens
        work = Path(campaign.workdir) / "claude-working-copy"
        shutil.copytree(
            campaign.dir_of(campaign.standings.best().build),
            work,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
        system = system_prompt(campaign, self.instructions)
        messages: list[dict[str, Any]] = [{"role": "user", "content": self._intro(campaign, work)}]
        nudges = 0
        while True:
            campaign.budget.ensure()  # no experiment could run, so asking the model is pointless
            if self.used.inputTokens + self.used.outputTokens >= self.max_tokens:
                raise BudgetExhausted("tokens", f"the token budget ({self.max_tokens} tokens) is spent")
            compact(messages)
            response = self._create(client, anthropic, system, messages)
            usage = TokenUsage(
                inputTokens=response.usage.input_tokens or 0, outputTokens=response.usage.output_tokens or 0
            )
            self._add(usage)
            campaign.budget.record_usage(usage)
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
                campaign.log(f"the model ended its turn ({response.stop_reason}) without calling finish")
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
                        results.append(_result(call.id, self._tool(campaign, work, call.name, call.input)))
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
                f"the Anthropic API answered HTTP {exc.status_code} and still failed after {self.limits.retries} retries"
            ) from None
        except anthropic.APIConnectionError:
            raise AgentError(
                f"the Anthropic API could not be reached after {self.limits.retries} retries"
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

    def _intro(self, campaign: Campaign, work: Path) -> str:
        parts = [
            "Leaderboard (best first):",
            leaderboard_text(campaign),
            "",
            "Your working copy is a copy of the best build so far. Its files:",
        ]
        budget = MAX_SOURCE_CHARS
        for rel, size in files_of(work):
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

    def _tool(self, campaign: Campaign, work: Path, name: str, args: Any) -> str:
        args = args if isinstance(args, dict) else {}
        if name == "list_files":
            return "\n".join(f"{rel} ({size} bytes)" for rel, size in files_of(work)) or "(no files)"
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
            snapshot = Path(campaign.workdir) / f"claude-{self._snapshots:04d}"
            while snapshot.exists():
                self._snapshots += 1
                snapshot = Path(campaign.workdir) / f"claude-{self._snapshots:04d}"
            shutil.copytree(
                work, snapshot, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
            usage, self._pending = self._pending, TokenUsage()
            try:
                record = campaign.run_experiment(snapshot, description=description, usage=usage)
            except StoreError as exc:  # the snapshot cannot be archived (size, odd files)
                self._pending = usage  # still owed to the next experiment's record
                raise ToolError(f"this build cannot be run: {exc}") from None
            return describe_record(record, campaign) + "\n\nLeaderboard:\n" + leaderboard_text(campaign, 5)
        known = ", ".join(t["name"] for t in TOOLS)
        raise ToolError(f"unknown tool {name!r}; the tools are {known}")


def _result(tool_use_id: str, text: str, is_error: bool = False) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id, "content": text}
    if is_error:
        block["is_error"] = True
    return block
