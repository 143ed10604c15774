"""A body beyond the upload limit gets the API's JSON 413 with the limit, on every operation
and method (`api/limits.py`), and nothing is stored: no decision, no run. Three variants of a
10 MB body: a huge field of valid JSON, JSON that is not the operation's, and no JSON at all;
and without the middleware, the API's own handler of Django's refusal."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from api.endpoints import api
from api.models import Scope
from approvals.models import ApprovalDecision
from engine.models import AgentRun
from tests.api.test_endpoints import API, bearer, token_for
from tests.factories import make_conversation, make_request, make_reviewer
from tests.live import LiveSite

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("submitted")]

TEN_MB = 10 * 1024 * 1024


def _bodies() -> Iterator[tuple[str, bytes]]:
    yield "a huge field", json.dumps({"action": "reject", "message": "x" * TEN_MB}).encode()
    yield "other JSON", json.dumps({"padding": ["y" * 1024] * (TEN_MB // 1024)}).encode()
    yield "not JSON", b"\x00" * TEN_MB


def _operations() -> Iterator[tuple[str, str]]:
    """Every operation of the API's schema, with its path's parameters filled in."""
    schema = api.get_openapi_schema()
    for path, methods in schema["paths"].items():
        for method in methods:
            yield method.upper(), path


def _filled(path: str, ids: dict[str, str]) -> str:
    for name, value in ids.items():
        path = path.replace("{" + name + "}", value)
    assert "{" not in path, path
    return path.removeprefix("/api/v1")


@pytest.mark.parametrize(("variant", "body"), list(_bodies()), ids=lambda v: str(v)[:12])
def test_every_operation_answers_a_10_mb_body_with_a_json_413(
    client: Client, variant: str, body: bytes
) -> None:
    reviewer = make_reviewer()
    request = make_request()
    conversation = make_conversation(owner=reviewer)
    secret = token_for(reviewer, Scope.DECIDE)
    ids = {
        "request_id": str(request.pk),
        "decision_id": "1",
        "run_id": str(request.run_id),
        "session_id": conversation.session_id,
    }
    operations = list(_operations())
    assert ("POST", "/api/v1/requests/{request_id}/decide") in operations
    assert ("POST", "/api/v1/conversations/{session_id}/runs") in operations
    runs_before = AgentRun.objects.count()
    for method, path in operations:
        answer = client.generic(
            method,
            API + _filled(path, ids),
            body,
            content_type="application/json",
            headers=bearer(secret),
        )
        assert answer.status_code == 413, (method, path, answer.status_code)
        assert answer["Content-Type"] == "application/json"
        said: dict[str, Any] = answer.json()
        assert said["code"] == "too_large"
        assert said["limit"] == 2_621_440
        assert f"is {len(body):,} bytes" in said["detail"]
    assert ApprovalDecision.objects.count() == 0
    assert AgentRun.objects.count() == runs_before


def test_without_the_middleware_the_api_itself_answers_413_not_500(
    client: Client, settings: Any
) -> None:
    """A deployment whose MIDDLEWARE lacks `api.limits.body_limit` still gets the 413:
    reading the body raises Django's RequestDataTooBig, which the API turns into it."""
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != "api.limits.body_limit"]
    reviewer = make_reviewer()
    request = make_request()
    secret = token_for(reviewer, Scope.DECIDE)
    body = json.dumps({"action": "reject", "message": "x" * TEN_MB}).encode()
    answer = client.generic(
        "POST",
        f"{API}/requests/{request.pk}/decide",
        body,
        content_type="application/json",
        headers=bearer(secret),
    )
    assert answer.status_code == 413
    assert answer.json() == {
        "detail": "The request body is too large: the API takes at most 2,621,440 bytes.",
        "code": "too_large",
        "limit": 2_621_440,
    }
    assert ApprovalDecision.objects.count() == 0


def test_the_schema_promises_the_413(client: Client) -> None:
    schema = client.get(f"{API}/openapi.json").json()
    decide = schema["paths"]["/api/v1/requests/{request_id}/decide"]["post"]
    assert "413" in decide["responses"]


@pytest.mark.django_db(transaction=True)
def test_through_the_real_server_a_10_mb_decision_is_a_413(live_site: LiveSite) -> None:
    """The outside suite's finding, through daphne as deployed: a 500 before."""
    reviewer = make_reviewer()
    request = make_request()
    secret = token_for(reviewer, Scope.DECIDE)
    body = json.dumps({"action": "reject", "message": "x" * TEN_MB}).encode()
    sent = urllib.request.Request(
        f"{live_site.url}{API}/requests/{request.pk}/decide",
        data=body,
        headers={"Content-Type": "application/json", **bearer(secret)},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(sent, timeout=30)
    assert refused.value.code == 413
    said = json.loads(refused.value.read())
    assert said["code"] == "too_large" and said["limit"] == 2_621_440
    assert ApprovalDecision.objects.count() == 0
