"""Where a campaign keeps its records in the artifact store, and how it reads them back.

Owns the store layout of one compile campaign::

    compilejobs/<ns>/<name>-<uid>/ledger-<i>.jsonl    one ExperimentRecord per line, sandbox i
    compilejobs/<ns>/<name>-<uid>/progress-<i>.json   the progress document of sandbox i
    compilejobs/<ns>/<name>-<uid>/result.json         the campaign's result (best build or none)
    compilejobs/<ns>/<name>-<uid>/report.html         the result for people (``report_html``)

and the identity of an experiment for resuming: ``(build id, workload hash)``. A ledger is
append-only; a campaign that is killed and run again reads it back and skips every
experiment already recorded. Local campaigns (``polymorph compile``) use namespace
``local``, the ``--campaign`` name and a uid that is a stable hash of their configuration.

It knows nothing about agents, engines or how experiments run.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from polymorph.contract.api import ExperimentRecord
from polymorph.contract.store import (
    Store,
    compilejob_prefix,
    ledger_key,
    progress_key,
    report_key,
    result_key,
)

__all__ = ["CampaignPaths", "Ledger", "config_uid", "experiment_key"]

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def config_uid(config: dict[str, Any]) -> str:
    """A stable 12-hex-digit uid for a campaign configuration (any JSON-serialisable dict)."""
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def experiment_key(build: str, workload_hash: str) -> tuple[str, str]:
    """What makes two experiments the same: the same build on the same workload."""
    return (build, workload_hash)


@dataclass(frozen=True)
class CampaignPaths:
    """The store keys of one campaign: ``compilejobs/<ns>/<name>-<uid>/…``."""

    namespace: str
    name: str
    uid: str

    def __post_init__(self) -> None:
        for field, value in (("namespace", self.namespace), ("name", self.name)):
            if not _NAME.match(value) or len(value) > 253:
                raise ValueError(
                    f"campaign {field} {value!r} is not allowed; use lowercase letters, digits, '-' and '.', "
                    "starting and ending with a letter or digit"
                )
        if not re.match(r"^[A-Za-z0-9-]{1,64}$", self.uid):
            raise ValueError(f"campaign uid {self.uid!r} is not allowed; use letters, digits and '-'")

    @property
    def prefix(self) -> str:
        """``compilejobs/<ns>/<name>-<uid>`` (no trailing slash)."""
        return compilejob_prefix(self.namespace, self.name, self.uid).rstrip("/")

    def ledger(self, sandbox: int) -> str:
        return ledger_key(self.namespace, self.name, self.uid, sandbox)

    def progress(self, sandbox: int) -> str:
        return progress_key(self.namespace, self.name, self.uid, sandbox)

    @property
    def result(self) -> str:
        return result_key(self.namespace, self.name, self.uid)

    @property
    def report(self) -> str:
        """``report.html``: the leaderboard and speedup plot (``report_html``)."""
        return report_key(self.namespace, self.name, self.uid)


class Ledger:
    """The append-only experiment ledger of one sandbox, cached in memory after the first read."""

    def __init__(self, store: Store, key: str) -> None:
        self.store = store
        self.key = key
        self.records: list[ExperimentRecord] = []
        if store.exists(key):
            self.records = [ExperimentRecord.model_validate(line) for line in store.read_jsonl(key)]
        self._index = {experiment_key(r.build, r.workloadHash): r for r in self.records}

    def find(self, build: str, workload_hash: str) -> ExperimentRecord | None:
        """The recorded experiment of ``build`` on this workload, if it already ran."""
        return self._index.get(experiment_key(build, workload_hash))

    def append(self, record: ExperimentRecord) -> None:
        """Write ``record`` to the store first, then remember it (so a crash never loses a recorded run)."""
        self.store.append_jsonl(self.key, [record.model_dump(mode="json")])
        self.records.append(record)
        self._index[experiment_key(record.build, record.workloadHash)] = record

    def reload(self) -> int:
        """Read the store's ledger again and return how many records it holds that memory did not.

        ``append`` writes the store first: a signal between the two leaves the store one record
        ahead, and what is reported after an interruption must count what the store holds."""
        if not self.store.exists(self.key):
            return 0
        stored = [ExperimentRecord.model_validate(line) for line in self.store.read_jsonl(self.key)]
        added = len(stored) - len(self.records)
        if added > 0:
            self.records = stored
            self._index = {experiment_key(r.build, r.workloadHash): r for r in stored}
        return max(0, added)

    def __len__(self) -> int:
        return len(self.records)
