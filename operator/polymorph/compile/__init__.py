"""The compile loop, trusted: campaigns, result selection, ledgers, reports, agents, the runner seam
and the sandbox's agent side.

It holds the Anthropic key and store credentials and never imports torch or ``polymorph_engine``;
it drives an engine only through ``runner.Runner``. The one exception is ``cli`` (``polymorph
compile``), which wires a local supervised engine worker in.
"""
