"""Status conditions and the deployment phase they imply.

Owns: replacing one condition in a list (``lastTransitionTime`` moves only when the status
flips, so a condition written every cycle stays stable), reading one back, the
ModelDeployment's one-word ``phase`` for ``kubectl get md``, and the two kstatus conditions
(``Reconciling``, ``Stalled``) that Flux, ``kstatus`` and Argo CD read:

- ``deployment_progress`` decides them for a ModelDeployment: Stalled when progress needs a
  person or a fix (an invalid spec, the analysis failure limit reached, a serving Deployment
  past its progress deadline), else Reconciling while a rollout, an approval wait, a
  CompileJob or unready replicas are in progress;
- ``compilejob_progress`` decides them for a CompileJob: Reconciling while Pending or
  Running, Stalled when Failed;
- ``set_progress`` writes both, at most one of them True, with ``observedGeneration``.

The people-facing types (Ready, Compiling, RollingOut, Degraded; Succeeded, Running on a
CompileJob) stay as they were. Pure: the time is passed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from polymorph.contract.api import Condition

__all__ = [
    "CONDITION_TYPES",
    "Progress",
    "compilejob_progress",
    "deployment_phase",
    "deployment_progress",
    "find",
    "is_true",
    "set_condition",
    "set_progress",
]

CONDITION_TYPES = (
    "Ready",
    "Reconciling",
    "Stalled",
    "Compiling",
    "RollingOut",
    "Degraded",
    "Succeeded",
    "Running",
)
Status = Literal["True", "False", "Unknown"]
ROLLING = frozenset({"Progressing", "Promoting", "RollingBack"})
"""Rollout phases that are work in progress (Paused waits for a person; the rest are finished)."""


@dataclass(frozen=True)
class Progress:
    """What the kstatus conditions say: the reason and message of the True one (None: neither is True)."""

    reconciling: tuple[str, str] | None = None
    stalled: tuple[str, str] | None = None


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


def set_progress(
    conditions: Sequence[Condition], progress: Progress, now: datetime, generation: int | None
) -> list[Condition]:
    """``conditions`` with Reconciling and Stalled set from ``progress`` (Stalled wins; never both True)."""
    out = list(conditions)
    if progress.stalled is not None:
        reason, message = progress.stalled
        out = set_condition(out, "Stalled", "True", reason, message, now, generation)
        out = set_condition(
            out, "Reconciling", "False", reason, "stalled: see the Stalled condition", now, generation
        )
        return out
    out = set_condition(out, "Stalled", "False", "AsExpected", "nothing needs a person", now, generation)
    if progress.reconciling is not None:
        reason, message = progress.reconciling
        return set_condition(out, "Reconciling", "True", reason, message, now, generation)
    return set_condition(out, "Reconciling", "False", "Current", "nothing in progress", now, generation)


def deployment_progress(
    *,
    rollout_phase: str,
    rollout_build: str | None,
    rollout_message: str | None,
    rollout_reason: str | None,
    step: str | None,
    candidate: str | None,
    active: str,
    policy: str,
    approved: str | None,
    compiling: str | None,
    ready: int,
    want: int,
    stuck: str | None = None,
) -> Progress:
    """Reconciling and Stalled of a ModelDeployment, first match wins.

    Stalled: the rollout is Paused (the analysis failure limit was reached, ``onFailure:
    Pause``), the last rollout of the current candidate was RolledBack by analysis and no
    CompileJob runs, or a serving Deployment is past its progress deadline (``stuck``: a
    missing Secret, image or capacity). Reconciling: a rollout in progress (``step`` describes
    its step), the candidate waiting for ``polymorph.dev/approve``, a CompileJob (``compiling``
    names it), or fewer ready replicas than wanted.
    """
    if rollout_phase == "Paused":
        return Progress(stalled=("AnalysisFailed", rollout_message or f"rollout of {rollout_build} paused"))
    if stuck is not None:
        return Progress(stalled=("ProgressDeadlineExceeded", stuck))
    if rollout_phase in ROLLING:
        message = step if rollout_phase == "Progressing" and step else rollout_message or rollout_phase
        return Progress(reconciling=("RollingOut", message))
    fresh = (
        candidate is not None
        and candidate != active
        and not (rollout_build == candidate and rollout_phase != "Idle")
    )
    if fresh and policy == "Manual" and approved != candidate:
        return Progress(
            reconciling=(
                "WaitingForApproval",
                f"build {candidate} waits for approval: annotate polymorph.dev/approve={candidate}",
            )
        )
    if compiling is not None:
        return Progress(reconciling=("Compiling", compiling))
    if rollout_phase == "RolledBack" and rollout_build is not None and rollout_build == candidate:
        return Progress(
            stalled=("RolledBack", f"{rollout_build} was rolled back: {rollout_reason or ''}".rstrip(": "))
        )
    if ready < want:
        return Progress(reconciling=("ReplicasNotReady", f"{ready}/{want} replicas ready"))
    return Progress()


def compilejob_progress(phase: str | None, reason: str | None, message: str | None) -> Progress:
    """Reconciling while the campaign is Pending or Running; Stalled when it Failed (its reason and message)."""
    if phase in (None, "Pending", "Running"):
        return Progress(reconciling=(phase or "Pending", message or f"CompileJob is {phase or 'Pending'}"))
    if phase == "Failed":
        return Progress(stalled=(reason or "Failed", message or "the CompileJob failed"))
    return Progress()
