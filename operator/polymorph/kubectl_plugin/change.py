"""``kubectl polymorph``'s commands that change something: ``approve``, ``abort``, ``retry``, ``pin``
and ``unpin``. Each is the annotation or spec change the operator already honours, printed
before it is applied (``--dry-run``: printed only).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text

from polymorph.clients.kube import COMPILEJOBS, MODELDEPLOYMENTS
from polymorph.contract.api.common import API_VERSION, BUILD_ID_PATTERN
from polymorph.core.resources import ANNOTATION_ABORT, ANNOTATION_APPROVE
from polymorph.kubectl_plugin.read import Session, print_json
from polymorph.kubectl_plugin.view import JSON, Refused, short_id

# --------------------------------------------------------------------------------------------
# Actions: each one the operator already honours, printed before it is applied.


@dataclass(frozen=True)
class Change:
    """One API write: a merge patch of a ModelDeployment, or a new CompileJob."""

    what: str
    kubectl: str
    apply: Callable[[], Any]
    patch: JSON | None = None


def _annotate(s: Session, name: str, values: Mapping[str, str | None], why: str) -> Change:
    patch: JSON = {"metadata": {"annotations": dict(values)}}
    parts = [f"{k}={v}" if v is not None else f"{k}-" for k, v in values.items()]
    overwrite = " --overwrite" if any(v is not None for v in values.values()) else ""
    return Change(
        why,
        f"kubectl -n {s.namespace} annotate modeldeployment {name} {' '.join(parts)}{overwrite}",
        lambda: s.kube.patch(MODELDEPLOYMENTS, s.namespace, name, patch),
        patch,
    )


def _spec_patch(s: Session, name: str, patch: JSON, why: str) -> Change:
    text = json.dumps(patch, separators=(",", ":"))
    return Change(
        why,
        f"kubectl -n {s.namespace} patch modeldeployment {name} --type merge -p '{text}'",
        lambda: s.kube.patch(MODELDEPLOYMENTS, s.namespace, name, patch),
        patch,
    )


def _apply(s: Session, args: argparse.Namespace, changes: Sequence[Change], then: Callable[[], None] | None = None) -> int:  # fmt: skip
    """Print every change, then (unless --dry-run) apply each in turn."""
    for change in changes:
        if s.output == "json":
            print_json(s.console, {"action": change.what, "kubectl": change.kubectl, "patch": change.patch, "dryRun": args.dry_run})  # fmt: skip
        else:
            s.console.print(Text(change.what, style="bold"))
            s.console.print(Text(f"  $ {change.kubectl}", style="cyan"), soft_wrap=True)
    if args.dry_run:
        if s.output != "json":
            s.console.print(Text("(dry run: nothing applied)", style="dim"))
        return 0
    for i, change in enumerate(changes):
        change.apply()
        if then is not None and i == 0 and len(changes) > 1:
            then()
    if s.output != "json":
        s.console.print(Text("applied", style="green"))
    return 0


def check_build(flag: str, build: str) -> str:
    if not re.match(BUILD_ID_PATTERN, build):
        raise Refused(f"{flag}: {build!r} is not a build id; use reference or sha256:<64 hex digits>.")
    return build


def _wait_for(s: Session, name: str, what: str, done: Callable[[JSON], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done(s.md(name)):
            return
        time.sleep(0.5)
    raise Refused(f"the operator did not {what} within --timeout {timeout:g}s; is it running?")


def _approve_changes(s: Session, args: argparse.Namespace, md: JSON, build: str) -> tuple[list[Change], Callable[[], None] | None]:  # fmt: skip
    name = md["metadata"]["name"]
    annotations = md["metadata"].get("annotations") or {}
    ro = (md.get("status") or {}).get("rollout") or {}
    values: dict[str, str | None] = {ANNOTATION_APPROVE: build}
    if annotations.get(ANNOTATION_ABORT, "").lower() == "true":
        values[ANNOTATION_ABORT] = None  # a left-over abort would abort the approved rollout at once
    paused = ro.get("phase") == "Paused" and ro.get("build") == build
    if paused and (ro.get("approvalAtPause") or annotations.get(ANNOTATION_APPROVE) == build):
        # The operator resumes only on an approval given after the pause: remove it, let the
        # operator see it gone (approvalAtPause turns false), then set it again.
        remove = _annotate(
            s, name, {ANNOTATION_APPROVE: None}, f"remove the approval given before {name} paused"
        )
        again = _annotate(
            s, name, values, f"approve {build} again: resume {name} at step {(ro.get('step') or 0) + 1}"
        )

        def seen() -> None:
            _wait_for(s, name, "see the approval removed", lambda m: not ((m.get("status") or {}).get("rollout") or {}).get("approvalAtPause"), args.timeout)  # fmt: skip

        return [remove, again], seen
    why = f"resume {name} at step {(ro.get('step') or 0) + 1} with {build}" if paused else f"approve {build} for {name}: start its canary rollout"  # fmt: skip
    return [_annotate(s, name, values, why)], None


def cmd_approve(s: Session, args: argparse.Namespace) -> int:
    md = s.md(args.name)
    status = md.get("status") or {}
    ro = status.get("rollout") or {}
    build = args.build
    if build is None:
        build = (
            ro.get("build") if ro.get("phase") == "Paused" else (status.get("candidateBuild") or {}).get("id")
        )
    if not build:
        raise Refused(
            f"{args.name} has no candidate build to approve (status.candidateBuild is empty); pass --build."
        )
    check_build("--build", build)
    paused = ro.get("phase") == "Paused" and ro.get("build") == build
    if not paused:
        active = (status.get("activeBuild") or {}).get("id")
        candidate = (status.get("candidateBuild") or {}).get("id")
        if build == active:
            raise Refused(f"{args.name} already serves {build}; there is nothing to approve.")
        if build != candidate:
            raise Refused(
                f"--build: {build} is not {args.name}'s candidate ({candidate or 'none'}); "
                "the operator rolls out only status.candidateBuild."
            )
        if ro.get("build") == build and ro.get("phase") not in (None, "Idle"):
            raise Refused(
                f"{args.name}'s rollout of {short_id(build)} already ran ({ro.get('phase')}); "
                "the operator does not roll the same build out twice."
            )
    changes, then = _approve_changes(s, args, md, build)
    return _apply(s, args, changes, then)


def cmd_abort(s: Session, args: argparse.Namespace) -> int:
    md = s.md(args.name)
    ro = (md.get("status") or {}).get("rollout") or {}
    if ro.get("phase") not in ("Progressing", "Paused") and not args.force:
        raise Refused(
            f"{args.name} has no rollout to abort (rollout phase {ro.get('phase') or 'Idle'}); "
            "--force sets the annotation anyway, so the next rollout is aborted at once."
        )
    why = f"abort the rollout of {short_id(ro.get('build'))} on {args.name}: back to {short_id(ro.get('fromBuild'))} on all replicas"  # fmt: skip
    return _apply(s, args, [_annotate(s, args.name, {ANNOTATION_ABORT: "true"}, why)])


def _retry_name(s: Session, base: str) -> str:
    taken = {j["metadata"]["name"] for j in s.kube.list(COMPILEJOBS, s.namespace)}
    stem = re.sub(r"-retry-[0-9]+$", "", base)[:52].rstrip("-")
    n = 1
    while f"{stem}-retry-{n}" in taken:
        n += 1
    return f"{stem}-retry-{n}"


def cmd_retry(s: Session, args: argparse.Namespace) -> int:
    md = s.md(args.name)
    name = md["metadata"]["name"]
    status = md.get("status") or {}
    ro = status.get("rollout") or {}
    annotations = md["metadata"].get("annotations") or {}
    if ro.get("phase") == "Paused" and ro.get("build"):
        changes, then = _approve_changes(s, args, md, ro["build"])
        return _apply(s, args, changes, then)
    if annotations.get(ANNOTATION_ABORT, "").lower() == "true":
        why = f"clear the abort of {name}, so its next candidate rolls out"
        return _apply(s, args, [_annotate(s, name, {ANNOTATION_ABORT: None}, why)])
    cj = s.last_compilejob(md)
    phase = ((cj or {}).get("status") or {}).get("phase")
    if cj is not None and phase in ("Failed", "Cancelled"):
        new_name = _retry_name(s, cj["metadata"]["name"])
        meta = cj["metadata"]
        body: JSON = {
            "apiVersion": cj.get("apiVersion", API_VERSION),
            "kind": "CompileJob",
            "metadata": {
                "name": new_name,
                "namespace": s.namespace,
                "labels": dict(meta.get("labels") or {}),
                "annotations": {"polymorph.dev/retry-of": meta["name"]},
                "ownerReferences": [
                    {"apiVersion": md.get("apiVersion", API_VERSION), "kind": "ModelDeployment",
                     "name": name, "uid": md["metadata"]["uid"], "controller": True}
                ],
            },
            "spec": cj["spec"],
        }  # fmt: skip
        what = f"run CompileJob {meta['name']} ({phase}) again as {new_name} with the same spec"
        manifest = json.dumps(body, indent=2)
        change = Change(
            what + f"; its best build becomes {name}'s candidate",
            f"kubectl -n {s.namespace} create -f - <<'EOF'\n{manifest}\nEOF",
            lambda: s.kube.create(COMPILEJOBS, s.namespace, body),
            body,
        )
        return _apply(s, args, [change])
    if ro.get("phase") == "RolledBack":
        raise Refused(
            f"{name}'s rollout of {short_id(ro.get('build'))} was rolled back by analysis, and the operator does not "
            "roll the same build out twice; a new candidate comes from the next CompileJob (drift, after the cooldown)."
        )
    raise Refused(
        f"{name} has nothing to retry: no paused rollout, no abort annotation and no failed CompileJob "
        f"(rollout {ro.get('phase') or 'Idle'}, last CompileJob {phase or 'none'})."
    )


def cmd_pin(s: Session, args: argparse.Namespace) -> int:
    md = s.md(args.name)
    status = md.get("status") or {}
    build = args.build or (status.get("activeBuild") or {}).get("id")
    if not build:
        raise Refused(f"{args.name} has no active build yet; pass --build.")
    check_build("--build", build)
    current = ((md.get("spec") or {}).get("build") or {}).get("pinned")
    if current == build:
        raise Refused(f"{args.name} is already pinned to {build}.")
    why = f"pin {args.name} to {build}: serve it, end any rollout, open no CompileJob"
    s.err.print(Text("note: spec is owned by git; commit spec.build.pinned too, or a GitOps sync undoes it", style="yellow"))  # fmt: skip
    return _apply(s, args, [_spec_patch(s, args.name, {"spec": {"build": {"pinned": build}}}, why)])


def cmd_unpin(s: Session, args: argparse.Namespace) -> int:
    md = s.md(args.name)
    current = ((md.get("spec") or {}).get("build") or {}).get("pinned")
    if not current:
        raise Refused(f"{args.name} is not pinned (spec.build.pinned is empty).")
    why = f"unpin {args.name} (was {current}): candidates roll out and drift recompiles again"
    s.err.print(Text("note: spec is owned by git; remove spec.build.pinned there too, or a GitOps sync undoes it", style="yellow"))  # fmt: skip
    return _apply(s, args, [_spec_patch(s, args.name, {"spec": {"build": {"pinned": None}}}, why)])
