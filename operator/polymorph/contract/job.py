"""A sandbox pod's CompileJob input, read the same way by both of its containers.

Owns: reading the CompileJob from ``--spec FILE`` or ``$POLYMORPH_COMPILEJOB`` (JSON or YAML: a
whole object with metadata, or a bare spec), checked by ``polymorph.contract.validate`` so that problems
read as everywhere else (``spec.budget.sandboxz: unknown field ...``); the workload identity the
ledger keys experiments by; and the sandbox's index among ``spec.budget.sandboxes``.

Both the trusted agent (``polymorph.compile.sandbox_agent``) and the engine
(``polymorph_engine.sandbox.cli``) import it, so it imports neither agents nor torch.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping

from polymorph.contract.api import API_VERSION, CompileJob, CompileJobSpec, WorkloadProfile
from polymorph.contract.errors import UsageError
from polymorph.contract.inputs import read_text
from polymorph.contract.validate import validate_document
from polymorph.contract.workload import DEFAULT_WORKLOAD
from polymorph.contract.yaml_input import load_yaml

__all__ = ["SPEC_ENV", "read_compilejob", "sandbox_index", "workload_identity"]

SPEC_ENV = "POLYMORPH_COMPILEJOB"


def read_compilejob(
    path: str | None, env: Mapping[str, str] | None = None
) -> tuple[CompileJobSpec, dict[str, str]]:
    """``(spec, metadata)`` from ``path`` or ``$POLYMORPH_COMPILEJOB``; a UsageError names the field."""
    env = os.environ if env is None else env
    if path:
        text = read_text(path, "the CompileJob spec file")  # bounded, UTF-8
        where = path
    elif env.get(SPEC_ENV, "").strip():
        text, where = env[SPEC_ENV], f"${SPEC_ENV}"
    else:
        raise UsageError(f"no CompileJob given: pass --spec FILE or set {SPEC_ENV} to its JSON or YAML")
    doc = load_yaml(text, f"the CompileJob in {where}")  # duplicate keys and alias bombs are refused
    if not isinstance(doc, dict):
        raise UsageError(f"the CompileJob in {where} must be an object with spec (and metadata)")
    whole = "spec" in doc
    if whole:
        # A whole object may come from the API server with a status; the sandbox ignores it.
        obj = {"apiVersion": API_VERSION, "kind": "CompileJob"} | {
            k: v for k, v in doc.items() if k != "status"
        }
    else:
        obj = {"apiVersion": API_VERSION, "kind": "CompileJob", "metadata": {"name": "sandbox"}, "spec": doc}
    job, _, problems = validate_document(obj)
    if problems or not isinstance(job, CompileJob):
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise UsageError(f"the CompileJob in {where} is invalid: {problems[0] if problems else 'spec'}{more}")
    metadata = job.metadata.model_dump(mode="json", exclude_none=True) if whole else {}
    return job.spec, {k: str(v) for k, v in metadata.items() if isinstance(v, str)}


def workload_identity(spec: CompileJobSpec) -> tuple[WorkloadProfile | None, str]:
    """``(profile or None, workload hash)`` as the ledger keys it: the profile's digest, or the
    sha256 of ``traceUri`` for traces; the sample profile when the spec names no workload."""
    w = spec.workload
    if w is not None and w.profile is not None:
        return w.profile, w.profile.digest()
    if w is not None and w.traceUri:
        return None, "sha256:" + hashlib.sha256(w.traceUri.encode()).hexdigest()
    return DEFAULT_WORKLOAD, DEFAULT_WORKLOAD.digest()


def sandbox_index(flag: int | None, sandboxes: int, env: Mapping[str, str] | None = None) -> int:
    """This sandbox's index: ``--index``, else ``$JOB_COMPLETION_INDEX``, else 0; checked against the count."""
    env = os.environ if env is None else env
    raw = str(flag) if flag is not None else env.get("JOB_COMPLETION_INDEX", "0")
    try:
        index = int(raw)
    except ValueError:
        raise UsageError(f"JOB_COMPLETION_INDEX must be an integer; got {raw!r}") from None
    if not 0 <= index < sandboxes:
        raise UsageError(
            f"the sandbox index must be in 0..{sandboxes - 1} (spec.budget.sandboxes is {sandboxes}); got {index}"
        )
    return index
