"""Every CEL rule of the CRDs, checked by the real kube-apiserver, gives ``polymorph validate``'s sentence.

The manifests are those of ``tests/api/test_api_cel.py`` (where a CEL interpreter plays the
server): each valid one is accepted, and each broken one, which breaks exactly one rule, is
refused with one cause, at the path ``validate`` names, with ``validate``'s sentence. Requests
are server-side dry runs (``dryRun=All``, strict field validation, as kubectl sends): the
server validates everything and stores nothing.
"""

from __future__ import annotations

import copy
import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from api.test_api_cel import BROKEN, CJ, VALID, validate_lines, with_
from support.control_plane import ControlPlane

PLURALS = {"ModelDeployment": "modeldeployments", "CompileJob": "compilejobs"}
_INVALID = re.compile(r'Invalid value: (?:"[a-z]+": )?(?P<sentence>.+)')  # 1.36 gives no type


@pytest.fixture(scope="module")
def api(control_plane: ControlPlane, crds: None) -> Iterator[tuple[httpx.Client, str]]:
    namespace = f"cel-{uuid.uuid4().hex[:8]}"
    with control_plane.api() as client:
        created = client.post("/api/v1/namespaces", json={"metadata": {"name": namespace}})
        assert created.status_code == 201, created.text
        yield client, namespace
        client.delete(f"/api/v1/namespaces/{namespace}")


def dry_run(api: tuple[httpx.Client, str], doc: dict[str, Any]) -> httpx.Response:
    client, namespace = api
    body = copy.deepcopy(doc)
    body["metadata"]["namespace"] = namespace
    return client.post(
        f"/apis/polymorph.dev/v1alpha1/namespaces/{namespace}/{PLURALS[doc['kind']]}",
        params={"dryRun": "All", "fieldValidation": "Strict"},
        json=body,
    )


@pytest.mark.parametrize(("case", "doc"), VALID, ids=[c[0] for c in VALID])
def test_the_server_accepts_every_valid_manifest(
    api: tuple[httpx.Client, str], case: str, doc: dict[str, Any]
) -> None:
    response = dry_run(api, doc)
    assert response.status_code == 201, response.json().get("message")


@pytest.mark.parametrize(("case", "doc", "path"), BROKEN, ids=[c[0] for c in BROKEN])
def test_the_server_refuses_with_validates_sentence(
    api: tuple[httpx.Client, str], case: str, doc: dict[str, Any], path: str
) -> None:
    response = dry_run(api, doc)
    assert response.status_code == 422, response.text
    status = response.json()
    assert status["reason"] == "Invalid"
    causes = status["details"]["causes"]
    assert len(causes) == 1, causes
    (cause,) = causes
    sentence = _INVALID.fullmatch(cause["message"])
    assert sentence is not None, cause
    assert [f"{cause['field']}: {sentence['sentence']}"] == validate_lines(doc)


def test_an_explicit_null_is_absent_for_the_server_as_for_validate(api: tuple[httpx.Client, str]) -> None:
    doc = with_(CJ, "spec.workload.traceUri", None)
    assert validate_lines(doc) == []
    response = dry_run(api, doc)
    assert response.status_code == 201, response.json().get("message")
