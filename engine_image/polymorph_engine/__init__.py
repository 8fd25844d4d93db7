"""Polymorph data plane: runs untrusted, agent-written builds and never holds a secret.

Subpackages, lowest layer first: ``runtime`` (model, tokenizer, hot-path contract, build loader,
hot reload, scheduler), ``experiment`` (verify, bench, one experiment, the supervised worker) and
``serving`` (OpenAI API, service, HTTP server, metrics, trace capture), which are independent of
each other, then ``sandbox`` (the engine side of a sandbox pod). ``builds/`` holds the builds that
ship in the image as package data. It never imports anthropic, kopf or kubernetes.
"""
