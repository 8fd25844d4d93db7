"""Serving a build: the OpenAI-compatible request models, the completion service (continuous
batching behind admission control), the aiohttp server, Prometheus metrics, sampled trace capture
and the signals that stop a serving process.

It sits on the runtime and knows nothing about experiments (``experiment`` is independent of it).
"""
