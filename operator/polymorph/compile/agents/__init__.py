"""Agents that propose builds in a compile campaign: ``SearchAgent`` (offline) and ``ClaudeAgent``.

Both are handed the ``campaign.Campaign`` (what an agent may use of it is in ``campaign``'s
docstring) and write the same experiment records through its ``run_experiment``. ``make_agent`` is the one factory that ``polymorph compile`` and ``polymorph sandbox
agent`` use. Importing this package imports neither torch nor the Anthropic SDK (``claude``
imports the SDK only when its agent runs, since it is the optional ``agent`` extra).
"""

from __future__ import annotations

from polymorph.compile.agents.claude import ClaudeAgent, resolve_api_key
from polymorph.compile.agents.search import SearchAgent
from polymorph.compile.campaign import Agent

__all__ = ["ClaudeAgent", "SearchAgent", "make_agent"]


def make_agent(
    kind: str,
    *,
    api_key_file: str | None = None,
    model: str = "claude-sonnet-4-5",
    instructions: str = "",
    max_tokens: int = 2_000_000,
) -> Agent:
    """The agent ``kind`` names (``search`` or ``claude``, any case). A Claude agent's key is resolved
    now (``--api-key-file``, else the environment), so a missing key is a UsageError before any work."""
    if kind.lower() == "claude":
        return ClaudeAgent(
            api_key=resolve_api_key(api_key_file),
            model=model,
            instructions=instructions,
            max_tokens=max_tokens,
        )
    return SearchAgent()
