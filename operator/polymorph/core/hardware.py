"""Accelerator profiles: what a pod needs to land on, and use, one kind of accelerator.

Owns: per-accelerator extended resource names, default node selectors and tolerations, and
merging them with a ``HardwareSpec``'s own (the spec wins on conflicts). The resource name
table itself lives in the API (``DEFAULT_RESOURCE_NAMES``); this module adds scheduling.
It knows nothing about Deployments or Jobs; ``resources`` puts the result into pod specs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from polymorph.contract.api import HardwareSpec
from polymorph.contract.api.modeldeployment import DEFAULT_RESOURCE_NAMES

__all__ = ["PROFILES", "HardwareProfile", "PodPlacement", "placement"]


@dataclass(frozen=True)
class HardwareProfile:
    """Scheduling defaults of one accelerator kind."""

    accelerator: str
    resource_name: str | None
    """Extended resource requested ``count`` times (None: CPU only)."""
    node_selector: dict[str, str] = field(default_factory=dict)
    """Labels the device plugins or node feature discovery put on such nodes."""
    tolerations: tuple[dict[str, Any], ...] = ()
    """Taints that clusters commonly put on accelerator nodes."""
    device: str = "cpu"
    """The engine's ``--device`` on such nodes (ROCm builds of torch also call the GPU ``cuda``)."""


def _taint(key: str) -> dict[str, Any]:
    return {"key": key, "operator": "Exists", "effect": "NoSchedule"}


PROFILES: dict[str, HardwareProfile] = {
    "cpu": HardwareProfile("cpu", DEFAULT_RESOURCE_NAMES["cpu"]),
    **{
        name: HardwareProfile(
            name,
            DEFAULT_RESOURCE_NAMES[name],
            {"nvidia.com/gpu.product": product},
            (_taint("nvidia.com/gpu"),),
            "cuda",
        )
        for name, product in (
            ("nvidia-h100", "NVIDIA-H100-80GB-HBM3"),
            ("nvidia-h200", "NVIDIA-H200"),
            ("nvidia-b200", "NVIDIA-B200"),
        )
    },
    **{
        name: HardwareProfile(
            name,
            DEFAULT_RESOURCE_NAMES[name],
            {"amd.com/gpu.product-name": product},
            (_taint("amd.com/gpu"),),
            "cuda",
        )
        for name, product in (("amd-mi300x", "AMD_Instinct_MI300X"), ("amd-mi355x", "AMD_Instinct_MI355X"))
    },
    "aws-trainium2": HardwareProfile(
        "aws-trainium2",
        DEFAULT_RESOURCE_NAMES["aws-trainium2"],
        {"node.kubernetes.io/instance-type": "trn2.48xlarge"},
        (_taint("aws.amazon.com/neuron"),),
        "xla",
    ),
}


@dataclass(frozen=True)
class PodPlacement:
    """What goes into a pod spec and its engine container for one hardware spec."""

    node_selector: dict[str, str]
    tolerations: list[dict[str, Any]]
    resources: dict[str, dict[str, str]]
    """``{"limits": {...}, "requests": {...}}`` for the accelerator only (empty for CPU)."""
    device: str


def placement(hw: HardwareSpec) -> PodPlacement:
    """The profile's defaults merged with the spec: spec node labels override, tolerations add up."""
    profile = PROFILES[hw.accelerator]
    selector = {**profile.node_selector, **hw.nodeSelector}
    tolerations = [dict(t) for t in profile.tolerations]
    for tol in hw.tolerations:
        entry = tol.model_dump(exclude_none=True)
        if entry not in tolerations:
            tolerations.append(entry)
    resource = hw.resource_name()
    resources: dict[str, dict[str, str]] = {}
    if resource is not None:
        resources = {"limits": {resource: str(hw.count)}, "requests": {resource: str(hw.count)}}
    return PodPlacement(selector, tolerations, resources, profile.device)
