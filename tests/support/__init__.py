"""Shared test support: real-server fixtures and stand-ins used by several test areas.

Nothing here is part of the product. Each module starts one external system the way the tests
need it (the Kubernetes control plane and a node agent for its kubelet, Prometheus, the helm and
kubectl binaries, the operator process) or stands in for one (a pod's ``/metrics`` endpoint).
"""
