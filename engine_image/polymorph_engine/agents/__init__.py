"""Agents that propose builds in a compile campaign: ``SearchAgent`` (offline) and ``ClaudeAgent``.

Both speak only to a ``CampaignContext`` (see ``base``) and write the same experiment
records through it. Importing this package imports neither torch nor the Anthropic SDK.
"""

from polymorph_engine.agents.base import Agent, AgentError, BudgetExhausted, CampaignContext, Comparison
from polymorph_engine.agents.search import SearchAgent

__all__ = ["Agent", "AgentError", "BudgetExhausted", "CampaignContext", "Comparison", "SearchAgent"]
