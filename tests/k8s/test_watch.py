"""Watch streams: resume from a resourceVersion, initial ADDED events, timeouts, selectors, content type."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx

from support.k8s_emulator import EmulatorThread

CMS = "/api/v1/namespaces/default/configmaps"


def watch(api: httpx.Client, url: str, **params: str) -> tuple[str, list[dict[str, Any]]]:
    """Read a whole watch stream (it ends on timeoutSeconds); the content type and the events."""
    with api.stream("GET", url, params={"watch": "true"} | params) as response:
        return response.headers["Content-Type"], [json.loads(line) for line in response.iter_lines() if line]


def test_a_watch_without_resource_version_starts_with_added_events(api: httpx.Client) -> None:
    api.post(CMS, json={"metadata": {"name": "a"}})
    api.post(CMS, json={"metadata": {"name": "b"}})
    started = time.monotonic()
    content_type, events = watch(api, CMS, timeoutSeconds="1")
    assert 0.9 < time.monotonic() - started < 3
    assert content_type.startswith("application/json")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "a"), ("ADDED", "b")]


def test_a_watch_from_a_resource_version_sends_only_later_events(api: httpx.Client) -> None:
    api.post(CMS, json={"metadata": {"name": "a"}})
    version = api.post(CMS, json={"metadata": {"name": "b"}}).json()["metadata"]["resourceVersion"]
    api.patch(f"{CMS}/a", json={"data": {"x": "1"}}, headers={"Content-Type": "application/merge-patch+json"})
    api.delete(f"{CMS}/b")
    _, events = watch(api, CMS, resourceVersion=version, timeoutSeconds="1")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("MODIFIED", "a"),
        ("DELETED", "b"),
    ]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and versions[0] > int(version)


def test_live_events_arrive_while_watching(api: httpx.Client, k8s_emulator: Any) -> None:
    version = api.get(CMS).json()["metadata"]["resourceVersion"]

    def write() -> None:
        time.sleep(0.3)
        with httpx.Client(base_url=k8s_emulator.url) as other:
            other.post(CMS, json={"metadata": {"name": "live"}})

    writer = threading.Thread(target=write)
    writer.start()
    _, events = watch(api, CMS, resourceVersion=version, timeoutSeconds="2")
    writer.join()
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "live")]


def test_leaving_a_selector_is_a_deletion_for_that_watch(api: httpx.Client) -> None:
    version = api.post(CMS, json={"metadata": {"name": "a", "labels": {"app": "x"}}}).json()["metadata"][
        "resourceVersion"
    ]
    merge = {"Content-Type": "application/merge-patch+json"}
    api.patch(f"{CMS}/a", json={"metadata": {"labels": {"app": "y"}}}, headers=merge)
    api.patch(f"{CMS}/a", json={"metadata": {"labels": {"app": "x"}}}, headers=merge)
    api.post(CMS, json={"metadata": {"name": "other"}})
    _, events = watch(api, CMS, resourceVersion=version, timeoutSeconds="1", labelSelector="app=x")
    assert [e["type"] for e in events] == ["DELETED", "ADDED"]


def test_a_watch_on_one_object_by_field_selector(api: httpx.Client) -> None:
    api.post(CMS, json={"metadata": {"name": "a"}})
    api.post(CMS, json={"metadata": {"name": "b"}})
    _, events = watch(api, CMS, fieldSelector="metadata.name=b", timeoutSeconds="1")
    assert [e["object"]["metadata"]["name"] for e in events] == ["b"]


def test_a_version_older_than_the_kept_history_is_gone() -> None:
    with EmulatorThread(watch_history=3) as small, httpx.Client(base_url=small.url) as api:
        first = api.post(CMS, json={"metadata": {"name": "a"}}).json()["metadata"]["resourceVersion"]
        for name in "bcde":
            api.post(CMS, json={"metadata": {"name": name}})
        _, events = watch(api, CMS, resourceVersion=first, timeoutSeconds="1")
        assert [(e["type"], e["object"]["code"]) for e in events] == [("ERROR", 410)]
        _, recent = watch(api, CMS, resourceVersion=str(int(first) + 2), timeoutSeconds="1")
        assert [e["object"]["metadata"]["name"] for e in recent] == ["d", "e"]
