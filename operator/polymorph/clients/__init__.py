"""The operator's seams to the outside: Prometheus (``prometheus``) and the Kubernetes API (``kube``).

Each seam is one protocol with one real implementation; tests inject a plain function or a
small class behind the same protocol, or run the real thing against a real server. Nothing here
decides anything: ``polymorph.core`` does, and ``polymorph.handlers`` wires the two together.
"""
