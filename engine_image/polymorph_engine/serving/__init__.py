"""Serving a build: the OpenAI-compatible request format, the completion service, the HTTP server,
Prometheus metrics and sampled trace capture.

It sits on the runtime and knows nothing about experiments (``experiment`` is independent of it).
"""
