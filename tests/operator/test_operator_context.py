"""The handlers' shared helpers: merge patches between statuses, sequence numbers against stale bodies, Events."""

from __future__ import annotations

from datetime import UTC, datetime

from polymorph.core.patch import merged, sequenced_patch, status_patch
from polymorph.handlers.bodies import object_ref, rollout_phase, sequence
from polymorph.handlers.context import Freshness, event_manifest


def test_status_patch_sends_changes_and_nulls_for_removed_keys() -> None:
    old = {"a": 1, "b": {"x": 1, "y": 2}, "c": [1], "gone": True}
    new = {"a": 1, "b": {"x": 1, "y": 3}, "c": [1, 2]}
    assert status_patch(old, new) == {"b": {"y": 3}, "c": [1, 2], "gone": None}
    assert status_patch(new, new) == {}


def test_sequenced_patch_bumps_only_on_change() -> None:
    old = {"phase": "Running", "polymorph": {"seq": 4}}
    assert sequenced_patch(old, {"phase": "Running"}, 4) == {}
    assert sequenced_patch(old, {"phase": "Succeeded"}, 4) == {"phase": "Succeeded", "polymorph": {"seq": 5}}
    assert sequence({"status": {"polymorph": {"seq": 5}}}) == 5 and sequence({}) == 0


def test_freshness_skips_bodies_older_than_the_last_write() -> None:
    fresh = Freshness(stale_after_s=60)
    key = ("ModelDeployment", "ns", "m")
    assert not fresh.is_stale(key, 0)
    fresh.wrote(key, 3)
    assert fresh.is_stale(key, 2) and not fresh.is_stale(key, 3)
    expired = Freshness(stale_after_s=0)
    expired.wrote(key, 3)
    assert not expired.is_stale(key, 2)  # a lost write does not block the object for ever


def test_event_manifest_names_the_object() -> None:
    body = {"apiVersion": "polymorph.dev/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "chat", "namespace": "ns", "uid": "u1", "resourceVersion": "7"}}  # fmt: skip
    doc = event_manifest(object_ref(body), "Promoted", "x" * 2000, "Normal", datetime(2026, 1, 1, tzinfo=UTC))
    assert doc["involvedObject"] == {"apiVersion": "polymorph.dev/v1alpha1", "kind": "ModelDeployment", "name": "chat",
                                     "namespace": "ns", "uid": "u1", "resourceVersion": "7"}  # fmt: skip
    assert doc["metadata"] == {"generateName": "chat.", "namespace": "ns"} and len(doc["message"]) == 1024
    assert doc["reason"] == "Promoted" and doc["firstTimestamp"] == "2026-01-01T00:00:00Z"


def test_merge_patch_removes_nulls_and_merges_nested() -> None:
    assert merged({"a": {"b": 1, "c": 2}, "d": 1}, {"a": {"c": None, "e": 3}, "d": None}) == {
        "a": {"b": 1, "e": 3}
    }


def test_rollout_phase_reads_status_cheaply_and_retired_phases_as_successors() -> None:
    assert (
        rollout_phase({}) == "Idle"
        and rollout_phase({"status": {"rollout": {"phase": "Paused"}}}) == "Paused"
    )
    assert rollout_phase({"status": {"rollout": {"phase": "Promoted"}}}) == "Succeeded"
    assert rollout_phase({"status": {"rollout": {"phase": ["not", "a", "phase"]}}}) == "Idle"
