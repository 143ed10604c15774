"""The API's OpenAPI document is valid OpenAPI, and the running site keeps to it: schemathesis
generates requests from the document (valid ones and invalid ones) against a real server,
and no answer is a server error or breaks the documented schema."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import schemathesis
from django.test import Client
from django.utils import timezone
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance
from schemathesis.specs.openapi.definitions import OPENAPI_31_VALIDATOR

from api.models import ApiToken, Scope
from tests.factories import make_conversation, make_request, make_reviewer
from tests.live import LiveSite

# Per operation and generation mode: 8 operations, two modes, under a minute in all.
EXAMPLES = 12


def document() -> dict[str, Any]:
    response = Client().get("/api/v1/openapi.json")
    assert response.status_code == 200
    return dict(json.loads(response.content))


def test_the_openapi_document_validates() -> None:
    doc = document()
    assert doc["openapi"].startswith("3.1")
    OPENAPI_31_VALIDATOR.validate(doc)
    # Each of its schemas is a valid JSON Schema (2020-12, OpenAPI 3.1's dialect).
    for name, schema in doc["components"]["schemas"].items():
        assert jsonschema.Draft202012Validator.check_schema(schema) is None, name
    # Every operation documents its errors, and names the bearer token.
    assert doc["components"]["securitySchemes"]["BearerToken"] == {
        "type": "http",
        "scheme": "bearer",
    }
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            answers = set(operation["responses"])
            assert {"401", "403", "422"} <= answers, (method, path, answers)
            assert operation["security"] == [{"BearerToken": []}]
    # Loaded by schemathesis itself: every operation parses.
    loaded = schemathesis.openapi.from_dict(doc)
    operations = [result.ok() for result in loaded.get_all_operations()]
    assert len(operations) == 8


def test_the_docs_page_uses_only_the_sites_own_files() -> None:
    page = Client().get("/api/v1/docs")
    assert page.status_code == 200
    html = page.content.decode()
    assert "/static/ninja/swagger-ui-bundle.js" in html
    assert "cdn" not in html.lower() and "https://" not in html


@pytest.mark.django_db(transaction=True)
def test_schemathesis_finds_no_server_error_and_no_answer_off_the_schema(
    live_site: LiveSite,
) -> None:
    rita = make_reviewer()
    secret = ApiToken.issue(rita, "schemathesis", Scope.DECIDE)[1]
    # Something to find: pending requests (low ids, which generated ids often hit), one
    # decided, one overdue, and a conversation of rita's.
    for _ in range(3):
        make_request()
    make_request(expires_at=timezone.now() - timedelta(minutes=1))
    make_conversation(owner=rita)
    schema = schemathesis.openapi.from_url(f"{live_site.url}/api/v1/openapi.json")
    headers = {"Authorization": f"Bearer {secret}"}
    checks = [not_a_server_error, response_schema_conformance]
    started = time.monotonic()
    logged = len(live_site.log())
    calls = 0

    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                derandomize=True,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def call(case: Any) -> None:
                nonlocal calls
                calls += 1
                case.call_and_validate(base_url=live_site.url, headers=headers, checks=checks)

            call()
    assert calls >= 8 * EXAMPLES
    assert time.monotonic() - started < 60
    # And the server logged no error of its own meanwhile.
    assert "Traceback" not in live_site.log()[logged:]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("scope", [Scope.READ, Scope.DECIDE])
def test_schemathesis_cli_with_all_checks_and_all_phases_finds_nothing(
    live_site: LiveSite, scope: str, tmp_path: Path
) -> None:
    """As a team adopting the API would run it: the schemathesis CLI, every check
    (`--checks all`: a schema-valid request refused, a schema-invalid one accepted, an
    answer off the schema, a server error, …) in every phase (examples, coverage, fuzzing,
    stateful), with a read token and with a decide token. Seeded: the same cases each run."""
    rita = make_reviewer()
    secret = ApiToken.issue(rita, "schemathesis", scope)[1]
    for _ in range(3):
        make_request()
    make_request(expires_at=timezone.now() - timedelta(minutes=1))
    make_conversation(owner=rita)
    logged = len(live_site.log())
    command = [
        str(Path(sys.executable).with_name("schemathesis")),
        "run",
        f"{live_site.url}/api/v1/openapi.json",
        "--checks",
        "all",
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--header",
        f"Authorization: Bearer {secret}",
        "--max-examples",
        "30",
        "--seed",
        "28",
        "--generation-deterministic",
        "--continue-on-failure",
        "--no-color",
        "--report-dir",
        str(tmp_path),
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    said = run.stdout + run.stderr
    assert run.returncode == 0, said[-6000:]
    assert "Selected: 8/8" in said and "Tested: 8" in said, said[-3000:]
    for phase in ("Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in said, said[-3000:]
    assert "Failures:" not in said
    assert "Traceback" not in live_site.log()[logged:]
