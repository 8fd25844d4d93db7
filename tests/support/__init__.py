"""Shared test support: real-server fixtures and wire-level emulators used by several test areas.

Nothing here is part of the product. Each module starts or emulates one external system (the
Kubernetes API, Prometheus, the helm and kubectl binaries) the way the tests need it.
"""
