"""The engine side of a sandbox pod: the admin API on loopback and ``polymorph sandbox engine``.

It runs untrusted, agent-written builds through ``experiment`` and holds no secret; the trusted
agent side is ``polymorph.compile.sandbox_agent``.
"""
