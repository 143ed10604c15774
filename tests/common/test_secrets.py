"""The API key stays secret (`common/secrets.py` masks it wherever it could be written).

A canary key is the OPENAI_API_KEY of real turns over the local provider, for both APIs: a
tool call, an approval that pauses and resumes, and failing turns whose 401 echoes the key
(whole, and as OpenAI does, masked but for its end). Then it is looked for, whole and by its
last 8 characters, in every log line of every logger at DEBUG, every row of the database
(traces, spans, saved states, items, ...), every page of the product and of the admin, and
the log of a live site that ran a turn through daphne.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from django.apps import apps
from django.contrib.admin.sites import site as admin_site
from django.test import Client
from django.urls import include, path, reverse
from django.utils import timezone

from approvals.models import ApprovalRequest
from common.secrets import MaskApiKey, mask_key
from conversations.models import Conversation
from engine import runs
from engine.models import AgentRun, ProcessKind, RunStatus, ServerProcess
from tests.conftest import Traces
from tests.factories import PASSWORD, customer_for, make_conversation, make_reviewer, make_user
from tests.live import start_site, stop_site
from tests.live import test_database_url as current_database_url
from tests.provider import LocalProvider, fail, text, tool_call, use_local_provider
from tracing import redaction
from tracing.models import Span, Trace

CANARY = f"sk-canary-{secrets.token_hex(16)}"
TAIL = CANARY[-8:]
# What OpenAI answers for a wrong key: the key, masked but for its end.
MASKED = f"{CANARY[:7]}{'*' * 24}{TAIL}"
INCORRECT_KEY = "Incorrect API key provided: {}. You can find your API key at platform.openai.com."
APIS = ["chat_completions", "responses"]

pytestmark = pytest.mark.django_db(transaction=True)


def leaks(where: str, found: str) -> list[str]:
    return [f"{where}: {said}" for said in (CANARY, TAIL) if said in found]


def _boom(request: Any) -> Any:
    raise RuntimeError("a view failed")


urlpatterns = [path("boom/", _boom), path("", include("agentsite.urls"))]


@pytest.fixture
def every_log_line(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Every record of every logger, at DEBUG, including loggers that do not propagate
    (`.records` in the test)."""
    names = [None, *logging.root.manager.loggerDict]
    for name in names:
        caplog.set_level(logging.DEBUG, logger=name)
    isolated = [
        logger
        for logger in map(logging.getLogger, names[1:])
        if not logger.propagate and caplog.handler not in logger.handlers
    ]
    for logger in isolated:
        logger.addHandler(caplog.handler)
    yield caplog
    for logger in isolated:
        logger.removeHandler(caplog.handler)


def formatted(record: logging.LogRecord) -> str:
    """The line as any handler writes it, its traceback and its extra fields too."""
    return logging.Formatter("%(name)s %(message)s").format(record) + repr(vars(record))


def turn(conversation: Conversation, words: str) -> AgentRun:
    run = runs.start_run(conversation, words, conversation.owner)
    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()
    return run


def play_every_kind_of_turn(
    provider: LocalProvider, submitted: list
) -> tuple[Conversation, dict[str, str]]:
    """A tool call, an approval paused and resumed, and two turns refused with the key; with
    every row of the database while the run waited (its saved state is gone once resumed)."""
    alice = customer_for("order 42")
    alice.set_password(PASSWORD)
    alice.save()
    rita = make_reviewer()
    conversation = make_conversation(owner=alice, agent_name="support")

    provider.script(tool_call("lookup_order", {"order_id": 42}), text("Order 42 is on its way."))
    assert turn(conversation, "Where is order 42?").status == RunStatus.COMPLETED

    provider.script(tool_call("cancel_order", {"order_id": 42}))
    paused = turn(conversation, "Cancel order 42.")
    assert paused.status == RunStatus.WAITING, paused.error
    assert paused.state is not None  # the SDK's state, saved without include_tracing_api_key
    while_paused = every_row()
    runs.decide(paused.approval_requests.get(), rita, runs.Decision.approve())
    assert submitted[-1] == ("resume", paused.pk)
    provider.script(text("Order 42 is cancelled."))
    asyncio.run(runs.resume(paused.pk))
    paused.refresh_from_db()
    assert paused.status == RunStatus.COMPLETED, paused.error

    for echoed in (CANARY, MASKED):
        provider.script(fail(401, message=INCORRECT_KEY.format(echoed)))
        assert turn(conversation, "And order 7?").status == RunStatus.FAILED
    # The key was in play: every request carried it.
    assert {r.headers.get("authorization") for r in provider.requests} == {f"Bearer {CANARY}"}
    return conversation, while_paused


def every_row() -> dict[str, str]:
    """Every row of every table the project's models own, every field, by table and field."""
    found = {}
    for model in apps.get_models():
        if model._meta.app_label not in ("engine", "approvals", "conversations", "tracing", "demo"):
            continue
        for row in model._default_manager.values():
            for name, value in row.items():
                found[f"{model._meta.label}.{name} (pk {row['id']})"] = json.dumps(
                    value, default=str
                )
    return found


def pages_of(conversation: Conversation) -> dict[str, str]:
    """Every page of the product that shows these turns, as the people who see them see it."""
    alice, rita = conversation.owner, make_reviewer()
    ServerProcess.objects.create(
        identity="web:here:1:t",
        kind=ProcessKind.WEB,
        host="here",
        pid=1,
        started=timezone.now(),
        beat=timezone.now(),
    )
    as_alice, as_rita, as_admin = Client(), Client(), Client()
    as_alice.force_login(alice)
    as_rita.force_login(rita)
    as_admin.force_login(make_user(username="admin", is_staff=True, is_superuser=True))
    chat = f"/chats/{conversation.session_id}/"
    urls: list[tuple[Client, str]] = [
        (Client(), "/"),  # a visitor's home page, with its provider line
        (as_alice, "/chats/"),
        (as_alice, chat),
        (as_alice, chat + "history/"),
        (as_alice, "/inbox/"),  # 403
        (as_alice, "/no/such/page/"),  # 404
        (as_rita, "/inbox/"),
        (as_rita, "/inbox/history/"),
        *(
            (as_rita, f"/inbox/{pk}/")
            for pk in ApprovalRequest.objects.values_list("pk", flat=True)
        ),
        (as_admin, "/traces/"),
    ]
    for trace in Trace.objects.all():
        urls += [
            (as_admin, f"/traces/{trace.trace_id}/"),
            (as_admin, f"/traces/{trace.trace_id}/tree/"),
            (as_admin, f"/traces/{trace.trace_id}.json"),
        ]
        urls += [
            (as_admin, f"/traces/{trace.trace_id}/spans/{span_id}/")
            for span_id in Span.objects.filter(trace=trace).values_list("span_id", flat=True)
        ]
    for model in admin_site._registry:
        if model._meta.app_label not in ("engine", "approvals", "conversations", "tracing"):
            continue
        info = model._meta.app_label, model._meta.model_name
        urls.append((as_admin, reverse("admin:{}_{}_changelist".format(*info))))
        urls += [
            (as_admin, reverse("admin:{}_{}_change".format(*info), args=[pk]))
            for pk in model._default_manager.values_list("pk", flat=True)
        ]
    seen = {}
    for client, url in urls:
        response = client.get(url)
        assert response.status_code in (200, 403, 404), (url, response.status_code)
        seen[url] = response.content.decode()
    return seen


@pytest.mark.parametrize("api", APIS)
def test_the_key_appears_in_no_log_row_or_page(
    api: str,
    settings: Any,
    local_provider: LocalProvider,
    submitted: list,
    orders: None,
    traces: Traces,
    every_log_line: pytest.LogCaptureFixture,
) -> None:
    use_local_provider(settings, local_provider, api, retries=0)
    settings.OPENAI_API_KEY = CANARY

    conversation, while_paused = play_every_kind_of_turn(local_provider, submitted)
    traces.flush()
    pages = pages_of(conversation)

    logged = every_log_line.records
    found = [leak for record in logged for leak in leaks(record.name, formatted(record))]
    found += [leak for field, value in while_paused.items() for leak in leaks(field, value)]
    found += [leak for field, value in every_row().items() for leak in leaks(field, value)]
    found += [leak for url, html in pages.items() for leak in leaks(url, html)]
    assert found == [], "\n".join(found)
    # What was looked through holds what it should: it would have shown a leak.
    assert any(r.levelno == logging.DEBUG for r in logged)
    assert Span.objects.filter(span_type__in=("generation", "response")).count() >= 5
    functions = Span.objects.filter(span_type="function").values_list("name", flat=True)
    assert set(functions) == {"lookup_order", "cancel_order"}
    states = [v for field, v in while_paused.items() if field.startswith("engine.AgentRun.state ")]
    assert any(len(state) > 1000 for state in states)  # the paused run's RunState
    assert "Order 42 is cancelled." in pages[f"/chats/{conversation.session_id}/"]
    assert "Served by an OpenAI-compatible server at" in pages["/"]
    assert len([url for url in pages if url.startswith("/admin/")]) > 20


@pytest.mark.urls("tests.common.test_secrets")
def test_the_key_is_not_on_the_debug_error_page(settings: Any) -> None:
    settings.OPENAI_API_KEY = CANARY
    settings.DEBUG = True
    response = Client(raise_request_exception=False).get("/boom/")
    html = response.content.decode()
    assert response.status_code == 500 and "OPENAI_API_KEY" in html  # Django's technical page
    assert leaks("technical 500", html) == []


def test_the_key_appears_in_no_line_of_a_live_sites_log(
    tmp_path: Path, settings: Any, local_provider: LocalProvider, orders: None
) -> None:
    env = use_local_provider(settings, local_provider, "chat_completions", retries=0)
    alice = customer_for("order 42")
    alice.set_password(PASSWORD)
    alice.save()
    site = start_site(
        current_database_url(),
        tmp_path / "daphne.log",
        extra_env={**env, "OPENAI_API_KEY": CANARY, "LOG_LEVEL": "DEBUG"},
    )
    try:
        with httpx2.Client(base_url=site.url, follow_redirects=True, timeout=10) as http:
            login = http.get("/accounts/login/")
            http.post(
                "/accounts/login/",
                data={
                    "username": alice.username,
                    "password": PASSWORD,
                    "csrfmiddlewaretoken": http.cookies["csrftoken"],
                },
                headers={"Referer": str(login.url)},
            )
            created = http.post(
                "/chats/new/",
                data={"csrfmiddlewaretoken": http.cookies["csrftoken"]},
                headers={"Referer": site.url + "/chats/"},
            )
            chat = created.url.path
            for words, script in (
                ("Where is order 42?", [tool_call("lookup_order", {"order_id": 42}), text("Ok.")]),
                ("And now?", [fail(401, message=INCORRECT_KEY.format(CANARY))]),
            ):
                local_provider.script(*script)
                http.post(
                    chat + "messages/",
                    data={"text": words, "csrfmiddlewaretoken": http.cookies["csrftoken"]},
                    headers={"Referer": site.url + chat},
                )
                wait_for_the_run_to_end(words)
            page = http.get(chat).text
    finally:
        stop_site(site)
    log = site.log()

    assert leaks("the live site's log", log) + leaks("the chat page", page) == []
    assert " DEBUG " in log and "Ok." in page
    assert {r.headers.get("authorization") for r in local_provider.requests} == {f"Bearer {CANARY}"}
    assert len(local_provider.requests) == 3


def wait_for_the_run_to_end(words: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = AgentRun.objects.filter(input=words).first()
        if run is not None and run.status in (RunStatus.COMPLETED, RunStatus.FAILED):
            return
        time.sleep(0.1)
    raise AssertionError(f"the run of {words!r} did not end within {timeout} s")


# --- the masking itself ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "said",
    [
        f"Incorrect API key provided: {CANARY}.",
        f"Incorrect API key provided: {CANARY[:8]}{'*' * 30}{CANARY[-4:]}.",  # OpenAI's echo
        f"Incorrect API key provided: ****{CANARY[-6:]}.",
        f"the key ending in {TAIL} was refused",
    ],
    # Named, not by the random canary: every process of a run (pytest-xdist) collects the same.
    ids=["the key", "openai's echo", "its last six", "its last eight"],
)
def test_it_masks_the_key_an_echo_of_it_and_its_end(said: str) -> None:
    masked = mask_key(said, CANARY)
    assert CANARY[-4:] not in masked and CANARY not in masked
    assert "[API key]" in masked


def test_it_leaves_what_is_not_the_key() -> None:
    for said in ("The user wrote **bold** here", "sk-proj-****abcd", "needed", "order 42"):
        assert mask_key(said, CANARY) == said
    # A short key masks itself only: its end could be a word.
    assert mask_key("not needed, not-needed", "not-needed") == "not needed, [API key]"


@pytest.mark.django_db(transaction=False)
def test_a_trace_masks_a_key_of_any_shape_even_with_redaction_off(settings: Any) -> None:
    settings.OPENAI_API_KEY = key = f"local-{secrets.token_hex(12)}"  # a vLLM --api-key
    settings.AGENTSITE_TRACE_REDACTION = False
    cleaned = redaction.clean({"error": {"message": f"bad key {key}", "data": [key[-8:]]}})
    assert json.dumps(cleaned).count("[API key]") == 2 and key[-8:] not in json.dumps(cleaned)


def test_the_log_handlers_mask_the_key_in_a_line_and_its_traceback(settings: Any) -> None:
    settings.OPENAI_API_KEY = CANARY
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "refused %s", (CANARY,), None)
    try:
        raise RuntimeError(f"Incorrect API key provided: {MASKED}")
    except RuntimeError:
        record.exc_info = sys.exc_info()

    assert MaskApiKey().filter(record)
    line = logging.Formatter().format(record)
    assert "refused [API key]" in line and "RuntimeError: Incorrect API key provided" in line
    assert leaks("the line", line) == []
