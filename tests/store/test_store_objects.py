"""Byte objects, JSON documents and JSONL ledgers: one suite, run against LocalStore and S3Store."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from polymorph.contract.api import ExperimentRecord
from polymorph.contract.errors import StoreError
from polymorph.contract.store import KeyNotFound, Store, ledger_key, progress_key, result_key, workload_prefix


def test_bytes_round_trip_and_overwrite(store: Store) -> None:
    store.put_bytes("a/b/c.bin", b"\x00\x01payload")
    assert store.get_bytes("a/b/c.bin") == b"\x00\x01payload"
    store.put_bytes("a/b/c.bin", b"second")
    assert store.get_bytes("a/b/c.bin") == b"second"
    store.put_bytes("empty", b"")
    assert store.get_bytes("empty") == b""
    assert store.exists("empty")


def test_missing_key_names_key_and_store(store: Store) -> None:
    with pytest.raises(KeyNotFound) as info:
        store.get_bytes("no/such/thing.json")
    message = str(info.value)
    assert "no/such/thing.json" in message and store.uri in message
    assert isinstance(info.value, StoreError)
    with pytest.raises(KeyNotFound, match=r"nothing\.json"):
        store.get_json("nothing.json")
    assert not store.exists("no/such/thing.json")


def test_list_by_prefix_is_recursive_sorted_and_exact(store: Store) -> None:
    keys = ["b/2.json", "a/x/1.json", "a/1.json", "a/10.json", "ab.json", "c"]
    for key in keys:
        store.put_bytes(key, b"{}")
    assert store.list("") == sorted(keys)
    assert store.list() == sorted(keys)
    assert store.list("a/") == ["a/1.json", "a/10.json", "a/x/1.json"]
    assert store.list("a") == ["a/1.json", "a/10.json", "a/x/1.json", "ab.json"]
    assert store.list("a/1") == ["a/1.json", "a/10.json"]
    assert store.list("zzz/") == []
    assert store.list("a/x/1.json") == ["a/x/1.json"]


def test_delete_is_idempotent(store: Store) -> None:
    store.put_bytes("k", b"v")
    store.delete("k")
    assert not store.exists("k")
    store.delete("k")
    assert store.list("") == []


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "a/../b", "../x", "./x", "a/", "a\\b"])
def test_bad_keys_are_refused(store: Store, key: str) -> None:
    with pytest.raises(StoreError, match="store key"):
        store.put_bytes(key, b"x")


@pytest.mark.parametrize("prefix", ["/abs", "a/../", "a//"])
def test_bad_prefixes_are_refused(store: Store, prefix: str) -> None:
    with pytest.raises(StoreError, match="store prefix"):
        store.list(prefix)


def test_json_documents_round_trip_models_and_plain_values(store: Store) -> None:
    doc = {"phase": "Running", "counts": {"passed": 3}, "values": [1.5, None, True], "name": "caf\u00e9"}
    store.put_json("compilejobs/ns/job-1/progress-0.json", doc)
    assert store.get_json("compilejobs/ns/job-1/progress-0.json") == doc
    record = ExperimentRecord(
        build="sha256:" + "a" * 64, status="passed", startedAt=datetime(2026, 1, 2, tzinfo=UTC)
    )
    store.put_json("record.json", record)
    assert ExperimentRecord.model_validate(store.get_json("record.json")) == record


def test_json_errors_are_sentences(store: Store) -> None:
    store.put_bytes("broken.json", b"{not json")
    with pytest.raises(StoreError, match=r"broken\.json is not valid JSON"):
        store.get_json("broken.json")
    with pytest.raises(StoreError, match="cannot be written as JSON"):
        store.put_json("x.json", {"f": object()})
    with pytest.raises(StoreError, match="cannot be written as JSON"):
        store.put_json("x.json", {"f": float("nan")})
    assert not store.exists("x.json")


def test_jsonl_append_and_read(store: Store) -> None:
    key = ledger_key("inference", "llama-7f3a", "1234", 0)
    assert store.read_jsonl(key) == []
    store.append_jsonl(key, [{"i": 0}, {"i": 1, "note": "line\nbreak"}])
    store.append_jsonl(key, [])
    store.append_jsonl(key, [{"i": 2}])
    assert store.read_jsonl(key) == [{"i": 0}, {"i": 1, "note": "line\nbreak"}, {"i": 2}]
    assert store.get_bytes(key).count(b"\n") == 3


def test_jsonl_accepts_experiment_records(store: Store) -> None:
    records = [
        ExperimentRecord(build="sha256:" + "b" * 64, status="crashed", error="segfault", sandbox=1),
        ExperimentRecord(build="sha256:" + "c" * 64, status="passed", knobs={"tile": 64}),
    ]
    store.append_jsonl("ledger.jsonl", records)
    back = [ExperimentRecord.model_validate(r) for r in store.read_jsonl("ledger.jsonl")]
    assert back == records


def test_jsonl_skips_a_torn_final_line_and_the_next_append_drops_it(store: Store) -> None:
    store.put_bytes("l.jsonl", b'{"i":0}\n{"i":1}\n{"i":2, "trunc')
    assert store.read_jsonl("l.jsonl") == [{"i": 0}, {"i": 1}]
    store.append_jsonl("l.jsonl", [{"i": 3}])
    assert store.read_jsonl("l.jsonl") == [{"i": 0}, {"i": 1}, {"i": 3}]
    assert store.get_bytes("l.jsonl") == b'{"i":0}\n{"i":1}\n{"i":3}\n'


def test_jsonl_corruption_in_the_middle_is_an_error(store: Store) -> None:
    store.put_bytes("l.jsonl", b'{"i":0}\ngarbage\n{"i":2}\n')
    with pytest.raises(StoreError, match=r"line 2 of .*l\.jsonl is not valid JSON"):
        store.read_jsonl("l.jsonl")
    store.put_bytes("m.jsonl", b"[1, 2]\n")
    with pytest.raises(StoreError, match="not a JSON object"):
        store.read_jsonl("m.jsonl")


def test_jsonl_refuses_non_objects_and_writes_nothing(store: Store) -> None:
    with pytest.raises(StoreError, match=r"record 1 for l\.jsonl is a list"):
        store.append_jsonl("l.jsonl", [{"ok": 1}, [1, 2]])
    with pytest.raises(StoreError, match=r"record 0 for l\.jsonl cannot be written as JSON"):
        store.append_jsonl("l.jsonl", [{"bad": {1, 2}}])
    assert store.read_jsonl("l.jsonl") == []


def test_uri_for_points_into_the_store(store: Store) -> None:
    key = result_key("ns", "job", "uid")
    assert store.uri_for(key).startswith(store.uri)
    assert store.uri_for(key).endswith("compilejobs/ns/job-uid/result.json")


def test_layout_keys() -> None:
    assert ledger_key("ns", "job", "u1", 3) == "compilejobs/ns/job-u1/ledger-3.jsonl"
    assert progress_key("ns", "job", "u1", 0) == "compilejobs/ns/job-u1/progress-0.json"
    assert result_key("ns", "job", "u1") == "compilejobs/ns/job-u1/result.json"
    assert workload_prefix("inference", "llama") == "workloads/inference/llama/"
    with pytest.raises(StoreError, match="namespace"):
        ledger_key("a/b", "job", "u", 0)
    with pytest.raises(StoreError, match="name"):
        result_key("ns", "..", "u")


def test_stored_json_is_readable_text(store: Store) -> None:
    store.put_json("doc.json", {"b": 1, "a": [1, 2]})
    text = store.get_bytes("doc.json").decode()
    assert text.endswith("\n") and json.loads(text) == {"b": 1, "a": [1, 2]}
