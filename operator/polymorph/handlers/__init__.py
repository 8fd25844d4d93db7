"""The operator's shell: kopf handlers, their wiring, settings, and the ``polymorph operator`` process.

Handlers only gather inputs (object bodies, kopf indexes, Prometheus, the store), call
``polymorph.core`` and apply what it returns (children, status, Events). ``process`` is the
command; ``registry`` connects handlers to kopf; ``settings`` holds the flags;
``modeldeployments``, ``compilejobs`` and ``fleet`` are the handlers; ``context`` and
``observability`` are what they share.
"""
