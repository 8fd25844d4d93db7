"""Serving a build: the OpenAI-compatible request models, the completion service (continuous
batching behind admission control), the aiohttp server, Prometheus metrics and sampled trace capture.

It sits on the runtime and knows nothing about experiments (``experiment`` is independent of it).
"""
