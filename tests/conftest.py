"""Shared fixtures. The autouse guard makes any attempt to reach a real model fail the test."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
from agents.tracing import TracingProcessor

if TYPE_CHECKING:
    from agents.tracing.processors import BatchTraceProcessor
    from django.test import Client

    from conversations.models import Conversation
    from engine.models import AgentRun
    from tracing.exporter import DatabaseExporter


def pytest_configure(config: pytest.Config) -> None:
    # Registered here, beside the markers pyproject.toml lists, by the cluster's tests.
    config.addinivalue_line(
        "markers",
        "cluster: starts a cluster of its own (PostgreSQL, Redis, nginx, web and worker "
        "processes: tests/cluster/__init__.py), so `make test` runs it once, in the SQLite "
        "pass",
    )


# The folder of the tests that start a cluster of their own, as node ids begin.
CLUSTER_TESTS = "tests/cluster/"


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test` spreads each pass over processes (pytest-xdist, `--dist loadscope`): a
    module's tests run together on one process, so its module-scoped fixtures (a browser, a
    cluster) start once; and the modules of tests/cluster/ are one unit, run one after the
    other on one process: their clusters' release steps all run collectstatic into the one
    staticfiles/ folder, and a cluster is the heaviest thing the suite starts. (xdist's own
    `loadgroup` marks no longer reach pytest 9's node ids.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "cluster" if module.startswith(CLUSTER_TESTS) else module

    return ByModule(config, log)


class RealModelCalled(AssertionError):
    pass


# Where a test may send a model request: the local provider of `tests/provider.py`.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def _loopback_only(original: Callable[..., Any]) -> Callable[..., Any]:
    """`original` for a model whose client speaks to this machine; a refusal for any other."""

    @functools.wraps(original)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self._client.base_url.host not in LOOPBACK_HOSTS:
            raise RealModelCalled(
                "a test tried to reach a real model; use ScriptedModel, the demo model or the "
                "local provider (tests/provider.py)"
            )
        return original(self, *args, **kwargs)

    return guarded


@pytest.fixture(autouse=True)
def no_real_models(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """Agents in tests run on ScriptedModel, the offline demo model or the local provider on
    127.0.0.1, never on a network."""
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
    from agents.models.openai_responses import OpenAIResponsesModel

    for cls in (OpenAIResponsesModel, OpenAIChatCompletionsModel):
        monkeypatch.setattr(cls, "get_response", _loopback_only(cls.get_response))
        monkeypatch.setattr(cls, "stream_response", _loopback_only(cls.stream_response))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    settings.OPENAI_API_KEY = ""
    settings.OPENAI_BASE_URL = ""
    # The SDK's default exporter would try to upload traces to OpenAI.
    from agents import set_tracing_export_api_key

    set_tracing_export_api_key("")


@pytest.fixture(autouse=True, scope="session")
def no_trace_upload() -> None:
    """Tests trace nothing by default: nothing is uploaded to OpenAI's trace dashboard, and the
    database processor `TracingConfig.ready()` installed is removed, so no background thread
    writes traces into another test's database. A test that wants traces asks for `traces`."""
    from agents import set_trace_processors

    set_trace_processors([])


class SpanRecorder(TracingProcessor):
    """A second processor beside ours: what the SDK itself emitted, as exported dicts."""

    def __init__(self) -> None:
        self.traces: list[dict[str, Any]] = []
        self.spans: list[dict[str, Any]] = []

    def on_trace_start(self, trace: Any) -> None:
        self.traces.append(trace.export())

    def on_span_end(self, span: Any) -> None:
        self.spans.append(span.export())

    def on_trace_end(self, trace: Any) -> None: ...
    def on_span_start(self, span: Any) -> None: ...
    def shutdown(self) -> None: ...
    def force_flush(self) -> None: ...


@dataclass
class Traces:
    processor: BatchTraceProcessor
    exporter: DatabaseExporter
    sdk: SpanRecorder

    def flush(self) -> None:
        """Store everything queued so far, now, on this thread."""
        self.processor.force_flush()


@pytest.fixture
def traces(settings: Any) -> Iterator[Traces]:
    """Runs in this test are stored by the database processor, as in production (flush with
    `traces.flush()`), and recorded as the SDK emitted them (`traces.sdk`). Needs the
    database, with `transaction=True` when agents run (their tools use other threads)."""
    from agents import set_trace_processors

    from tracing.exporter import DatabaseExporter, make_processor

    settings.AGENTSITE_TRACE_BATCH_DELAY = 3600.0  # stored when the test flushes, not before
    exporter = DatabaseExporter()
    processor = make_processor(exporter)
    recorder = SpanRecorder()
    set_trace_processors([processor, recorder])
    yield Traces(processor=processor, exporter=exporter, sdk=recorder)
    set_trace_processors([])
    processor.shutdown()  # stores what is left while this test's database still exists


@pytest.fixture(autouse=True)
def no_cached_rules() -> Iterator[None]:
    """The approval rules a process caches for its gates (`engine.policies`) are a test's own:
    a test's rules go with its database, whose rollback sends no signal that clears them."""
    from engine import policies

    policies.forget_rules()
    yield
    policies.forget_rules()


@pytest.fixture(autouse=True)
def no_cached_email_optins() -> Iterator[None]:
    """Whether anybody wants email (`notifications.outbox.anyone_opted_in`) is a test's own:
    its preferences go with its database, whose rollback sends no signal."""
    from notifications import outbox

    outbox.forget_opted_in()
    yield
    outbox.forget_opted_in()


@pytest.fixture(autouse=True)
def no_job_left_running() -> Iterator[None]:
    """A run job a test set going on the in-process executor (a decision resumes its run, a
    message starts one) ends before the test's database is emptied: one still writing then
    deadlocked PostgreSQL's TRUNCATE at the teardown of a test that decided six requests.
    (pytest-django's database fixtures come first, so this teardown runs before theirs.)"""
    yield
    from engine import executor

    executor.inprocess().wait_idle(timeout=JOB_WAIT_SECONDS)


# How long a test's teardown waits for the jobs it left running (a test that holds a job on
# purpose releases it before it ends).
JOB_WAIT_SECONDS = 10.0


@pytest.fixture(autouse=True)
def no_outage_left_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with the channel layer taken as answering: an outage a test before it
    provoked (engine/events.py drops events for up to RETRY_MOST_SECONDS after a failed
    publish) would drop this test's events, on whichever process runs them next."""
    from engine import events

    monkeypatch.setattr(events, "_outage", events._Outage())


@pytest.fixture(autouse=True)
def plain_static_storage(settings: Any) -> None:
    """Pages render without `collectstatic` having built a manifest."""
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }


from tests.live import (  # noqa: E402,F401  (fixtures)
    browser,
    csp_problems,
    live_site,
    live_site_traces_flushed,
    module_chromium,
    page,
    screenshots,
)
from tests.provider import local_provider, local_provider_server  # noqa: E402,F401  (fixtures)
from tests.services import redis_server  # noqa: E402,F401  (fixture)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: Any, django_db_blocker: Any) -> Any:
    """On PostgreSQL, end the worker threads' connections so the test database can drop."""
    yield
    from django.db import connection

    with django_db_blocker.unblock():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )


@pytest.fixture
def submitted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Jobs handed to the executor, recorded instead of run, so each test drives them."""
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr("engine.executor.submit", lambda job, run_id: calls.append((job, run_id)))
    return calls


# --- people and situations -------------------------------------------------------------------
# Named once, made by tests/factories.py (the one place people and rows are made). A module
# that needs someone else defines a fixture of its own name, or overrides one of these saying
# how its person differs.


@pytest.fixture
def alice() -> Any:
    """alice, an end user. With the `orders` fixture set up before her (a module's
    `usefixtures("orders")` is), she is the demo customer who owns orders 42, 44 and 46."""
    from tests.factories import make_user

    return make_user(username="alice")


@pytest.fixture
def client_for_alice(alice: Any) -> Client:
    """A test client signed in as alice."""
    from tests.factories import client_of

    return client_of(alice)


@pytest.fixture
def conversation(alice: Any) -> Conversation:
    """alice's conversation with the demo's support desk, nothing said yet."""
    from tests.factories import make_conversation

    return make_conversation(owner=alice, agent_name="support")


@pytest.fixture
def rita(client: Client) -> Any:
    """rita, a reviewer (she may decide tool calls), signed in on the test's `client`."""
    from tests.factories import make_reviewer

    reviewer = make_reviewer()
    client.force_login(reviewer)
    return reviewer


@pytest.fixture
def olga(client: Client) -> Any:
    """olga, an operator who may read traces and is not staff, signed in on the test's
    `client`."""
    from tests.factories import make_viewer

    operator = make_viewer()
    client.force_login(operator)
    return operator


@pytest.fixture
def admin() -> Any:
    """admin, a superuser."""
    from tests.factories import make_user

    return make_user(username="admin", is_staff=True, is_superuser=True)


@pytest.fixture
def admin_client(admin: Any) -> Client:
    """A test client of its own signed in as admin (in place of pytest-django's, whose admin
    the factories did not make)."""
    from tests.factories import client_of

    return client_of(admin)


@pytest.fixture
def paused_run(orders: None, submitted: list[tuple[str, int]]) -> AgentRun:
    """A paused call: alice asked the demo's support desk to "cancel order 42", and her run,
    executed here, waits for a reviewer with its one pending request; jobs handed to the
    executor are recorded, not run (`submitted`). Needs `django_db(transaction=True)`: the
    demo's tools run in threads of their own."""
    from tests.factories import pause_run

    return pause_run("cancel order 42")


@pytest.fixture
def approved_run(orders: None, submitted: list[tuple[str, int]]) -> AgentRun:
    """A decided request: that paused call, approved by rita through the engine; the run is
    claimed for resume, its "resume" job recorded in `submitted`, not run. Needs what
    `paused_run` needs."""
    from tests.factories import pause_and_approve

    return pause_and_approve("cancel order 42")


@pytest.fixture
def encryption_key(settings: Any) -> str:
    """Sessions are encrypted at rest, with this new key (`AGENTSITE_SESSION_ENCRYPTION_KEY`),
    and their items never expire."""
    from cryptography.fernet import Fernet

    settings.AGENTSITE_SESSION_ENCRYPTION_KEY = Fernet.generate_key().decode()
    settings.AGENTSITE_SESSION_TTL = 0
    return str(settings.AGENTSITE_SESSION_ENCRYPTION_KEY)


@pytest.fixture
def orders() -> None:
    """The demo's orders (7, 42, ...), which the demo agents' tools look up and change."""
    from demo.seed import seed_orders

    seed_orders()


@pytest.fixture
def fresh_registry() -> Iterator[None]:
    """Agents are imported anew, before and after the test (which may change
    AGENTSITE_AGENTS), and the record of what the scripted tools executed starts empty."""
    from engine import registry
    from tests import scripted

    registry.reset()
    scripted.EXECUTED.clear()
    yield
    registry.reset()


@pytest.fixture
def demo(orders: None, fresh_registry: None, submitted: list[tuple[str, int]]) -> None:
    """The demo shop and its agents, imported anew; runs execute when the test says so (jobs
    handed to the executor are recorded, not run)."""


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Events the engine published, recorded (and published as before)."""
    from engine import events

    seen: list[Any] = []
    publish = events.publish

    async def record(batch: list[Any]) -> None:
        seen.extend(batch)
        await publish(batch)

    monkeypatch.setattr("engine.events.publish", record)
    return seen


@pytest.fixture
def quiet_server(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that runs the ASGI application: it binds the in-process executor to the test's
    loop and starts the sweep there; neither outlives the test."""
    from engine import serverloop

    settings.AGENTSITE_SWEEP_SECONDS = 0
    monkeypatch.setattr(serverloop, "_loop", None)


@pytest.fixture
def own_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The factories number traces and spans from one counter, and each new trace starts a
    minute further back per number drawn: a test that makes thousands of spans would push
    every later test's traces weeks back (the trace list's date filters count on them being
    near T0). Such a test draws from a counter of its own, and leaves the shared one as it
    was."""
    import itertools

    from tests import factories

    start = next(factories._numbers)
    monkeypatch.setattr(factories, "_numbers", itertools.count(start + 1))


@pytest.fixture
async def fresh_layer() -> None:
    """Groups of the in-memory channel layer outlive a test; start it with none."""
    from channels.layers import get_channel_layer

    await get_channel_layer().flush()
