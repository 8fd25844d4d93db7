"""Status conditions (Ready, Compiling, RollingOut, Degraded) and the deployment phase they imply.

Owns: replacing one condition in a list (``lastTransitionTime`` moves only when the status
flips, so a condition written every cycle stays stable), reading one back, and the
ModelDeployment's one-word ``phase`` for ``kubectl get md``. Pure: the time is passed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from polymorph.api import Condition

__all__ = ["CONDITION_TYPES", "deployment_phase", "find", "is_true", "set_condition"]

CONDITION_TYPES = ("Ready", "Compiling", "RollingOut", "Degraded")
Status = Literal["True", "False", "Unknown"]


def find(conditions: Sequence[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def is_true(conditions: Sequence[Condition], type_: str) -> bool:
    found = find(conditions, type_)
    return found is not None and found.status == "True"


def set_condition(
    conditions: Sequence[Condition],
    type_: str,
    status: Status,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None = None,
) -> list[Condition]:
    """``conditions`` with ``type_`` replaced (or added); the transition time kept if status is unchanged."""
    old = find(conditions, type_)
    since = old.lastTransitionTime if old is not None and old.status == status else now
    new = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        lastTransitionTime=since,
        observedGeneration=generation,
    )
    out = [c for c in conditions if c.type != type_] + [new]
    return sorted(out, key=lambda c: ((*CONDITION_TYPES, c.type)).index(c.type))


def deployment_phase(
    conditions: Sequence[Condition],
) -> Literal["Pending", "Serving", "Compiling", "RollingOut", "Degraded"]:
    """One word for the printer column: Degraded, RollingOut, Compiling, Serving or Pending, first match wins."""
    if is_true(conditions, "Degraded"):
        return "Degraded"
    if is_true(conditions, "RollingOut"):
        return "RollingOut"
    if is_true(conditions, "Compiling"):
        return "Compiling"
    return "Serving" if is_true(conditions, "Ready") else "Pending"
