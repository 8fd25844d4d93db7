"""Fixtures of the e2e folder: the real control plane (``support.control_plane``), one per session."""

from __future__ import annotations

from support.control_plane import control_plane

__all__ = ["control_plane"]
