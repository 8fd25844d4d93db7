"""Experiments on builds: verification against golden outputs, the workload benchmark, one
experiment's protocol, and the supervised worker process that contains crashing builds.

It sits on the runtime and knows nothing about HTTP serving (``serving`` is independent of it).
"""
