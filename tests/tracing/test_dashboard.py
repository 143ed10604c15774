"""The operators' dashboard: its numbers against the rows they come from, computed here in
plain Python; its range and agent filter; access; CSV; the charts' markup; a bounded number of
queries."""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus, DecisionKind
from engine.models import RunStatus
from tests.agentsite.test_csp import inline_code, policy_of
from tests.factories import (
    make_request,
    make_reviewer,
    make_run,
    make_span,
    make_trace,
    make_user,
)
from tests.plans import explain
from tracing import dashboard
from tracing.models import STATUS_OUTCOME, ModelPrice, Span, TraceOutcome
from tracing.pricing import money

pytestmark = pytest.mark.django_db

URL = "/traces/dashboard/"
RANGE = {"since": "2026-11-27", "until": "2026-11-30"}  # four days: counted per day
D1, D2 = date(2026, 11, 28), date(2026, 11, 29)
PRICED, UNPRICED = "gpt-test-a", "gpt-test-b"
PRICE_IN, PRICE_CACHED, PRICE_OUT = Decimal("1.00"), Decimal("0.50"), Decimal("4.00")


def at(day: date, hour: int, minute: int = 0, second: int = 0) -> datetime:
    return datetime(day.year, day.month, day.day, hour, minute, second, tzinfo=UTC)


@dataclass
class T:
    """A seeded trace: when, whose, how it ended, how long it worked."""

    started: datetime
    agent: str
    outcome: str  # "" : read from the status
    status: str
    active: float | None
    calls: tuple[tuple[str, int, int, int], ...] = ()  # model, input, cached, output

    @property
    def shown(self) -> str:
        return self.outcome or STATUS_OUTCOME[self.status].value


TRACES = [
    T(at(D1, 9), "support", "completed", "ok", 1.0, ((PRICED, 1000, 200, 50),)),
    T(
        at(D1, 10),
        "support",
        "completed",
        "ok",
        3.0,
        ((PRICED, 2000, 0, 100), (UNPRICED, 300, 0, 30)),
    ),
    T(at(D1, 11), "support", "rejected", "ok", 2.0, ((UNPRICED, 500, 100, 20),)),
    T(at(D1, 12), "support", "", "error", 5.0),
    T(at(D1, 13), "billing", "approved", "ok", 0.5, ((PRICED, 700, 0, 70),)),
    T(at(D1, 23, 59, 59), "billing", "", "ok", 4.0, ((UNPRICED, 100, 0, 10),)),
    T(at(D2, 0), "support", "expired", "ok", 7.0, ((PRICED, 400, 400, 40),)),
    T(at(D2, 8), "support", "guardrail", "ok", 1.5),
    T(at(D2, 9), "billing", "completed", "ok", 2.5, ((PRICED, 900, 300, 90), (PRICED, 100, 0, 10))),
    T(at(D2, 10), "billing", "completed", "ok", 0.7),
    T(at(D2, 11), "billing", "", "running", None, ((UNPRICED, 50, 0, 5),)),
    T(at(D2, 12), "billing", "withdrawn", "ok", 9.0),
    T(at(date(2026, 11, 27), 0), "support", "failed", "error", 6.0),
]
# Outside the range, on both sides: counted nowhere.
OUTSIDE = [
    T(
        at(date(2026, 11, 26), 23, 59, 59),
        "support",
        "completed",
        "ok",
        100.0,
        ((PRICED, 9, 0, 9),),
    ),
    T(at(date(2026, 12, 1), 0), "billing", "completed", "ok", 100.0, ((PRICED, 9, 0, 9),)),
]


@dataclass
class R:
    """A seeded approval request."""

    tool: str
    created: datetime
    status: str
    wait: float | None = None  # seconds to its decision
    decider: str = ""  # "rita", "bob", "policy", "expiry", "withdrawn"
    kind: str = ""
    agent: str = "support"
    run_finished: datetime | None = None


REQUESTS = [
    R("refund_order", at(D1, 10), ApprovalStatus.APPROVED, 60, "rita", DecisionKind.APPROVED),
    R("refund_order", at(D1, 11), ApprovalStatus.REJECTED, 120, "rita", DecisionKind.REJECTED),
    R("refund_order", at(D1, 12), ApprovalStatus.APPROVED, 1, "policy", DecisionKind.APPROVED),
    R("cancel_order", at(D1, 13), ApprovalStatus.EXPIRED, 3600, "expiry", DecisionKind.EXPIRED),
    R("cancel_order", at(D2, 9), ApprovalStatus.APPROVED, 300, "bob", DecisionKind.APPROVED),
    R("cancel_order", at(D2, 10), ApprovalStatus.PENDING),
    R(
        "refund_order",
        at(D2, 11),
        ApprovalStatus.WITHDRAWN,
        30,
        "withdrawn",
        DecisionKind.WITHDRAWN,
    ),
    R(
        "cancel_order",
        at(D2, 12),
        ApprovalStatus.CANCELLED,
        run_finished=at(D2, 12, 30),
    ),
    # Nobody decided in time and the expiry policy approved it: an expiry, by no reviewer.
    R(
        "wire_money",
        at(D2, 13),
        ApprovalStatus.APPROVED,
        90000,
        "expiry",
        DecisionKind.EXPIRY_APPROVED,
        agent="billing",
    ),
    R(
        "refund_order",
        at(D2, 14),
        ApprovalStatus.REJECTED,
        45,
        "rita",
        DecisionKind.REJECTED,
        agent="billing",
    ),
]
# Before the range and still pending: in the backlog at every point, in no per-tool count.
OLD_PENDING = R("refund_order", at(date(2026, 11, 25), 8), ApprovalStatus.PENDING)


def seed_traces(traces: list[T]) -> None:
    spans: list[Span] = []
    for t in traces:
        trace = make_trace(
            started_at=t.started,
            ended_at=t.started + timedelta(seconds=(t.active or 0) + 10),
            workflow_name=f"agentsite: {t.agent.title()} desk",
            metadata={"agent": t.agent, "run_id": "0"},
            outcome=t.outcome,
            status=t.status,
            active_seconds=t.active,
        )
        root = make_span(trace, "task", "task", start=0, end=1)
        spans.append(root)
        spans.append(make_span(trace, "function", "lookup_order", parent=root, start=0.1, end=0.2))
        for i, (model, tokens_in, cached, tokens_out) in enumerate(t.calls):
            spans.append(
                make_span(
                    trace,
                    "generation",
                    model,
                    parent=root,
                    start=0.01 * i,
                    end=0.01 * i + 0.005,
                    model=model,
                    # As the exporter copies it from the trace (`rows.trace_agent`).
                    agent=t.agent,
                    input_tokens=tokens_in,
                    cached_tokens=cached,
                    output_tokens=tokens_out,
                    total_tokens=tokens_in + tokens_out,
                )
            )
    Span.objects.bulk_create(spans)


def seed_requests(requests: list[R]) -> None:
    people = {"rita": make_reviewer("rita"), "bob": make_reviewer("bob")}
    for r in requests:
        run = make_run(
            agent_name=r.agent,
            status=RunStatus.FAILED if r.run_finished else RunStatus.COMPLETED,
            finished=r.run_finished,
        )
        decided = r.created + timedelta(seconds=r.wait) if r.wait is not None else None
        request = make_request(
            run=run,
            tool_name=r.tool,
            status=r.status,
            created=r.created,
            expires_at=r.created + timedelta(hours=1),
        )
        ApprovalRequest.objects.filter(pk=request.pk).update(decided_at=decided)
        if decided is None:
            continue
        reviewer = people.get(r.decider)
        if r.decider == "withdrawn":
            reviewer = run.requested_by
        decision = ApprovalDecision.objects.create(
            request=request,
            reviewer=reviewer,
            approved=r.status == ApprovalStatus.APPROVED,
            kind=r.kind,
            withdrawn=r.decider == "withdrawn",
            policy_name="auto-refunds" if r.decider == "policy" else "",
            arguments_hash=request.arguments_hash,
        )
        ApprovalDecision.objects.filter(pk=decision.pk).update(created=decided)


def seed_price() -> None:
    ModelPrice.objects.create(
        model=PRICED,
        input_per_million=PRICE_IN,
        cached_input_per_million=PRICE_CACHED,
        output_per_million=PRICE_OUT,
        currency="USD",
        valid_from=date(2026, 1, 1),
    )


@pytest.fixture
def seeded() -> None:
    seed_price()
    seed_traces(TRACES + OUTSIDE)
    seed_requests([*REQUESTS, OLD_PENDING])


def csv_rows(client: Client, chart: str, **query: str) -> list[list[str]]:
    response = client.get(URL, {**RANGE, **query, "format": "csv", "chart": chart})
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/csv")
    return list(csv.reader(io.StringIO(response.content.decode())))


# --- the expected numbers, from the seeds ---------------------------------------------------


def rank(values: list[float], p: int) -> float:
    """Nearest-rank percentile, written the textbook way."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1]


def in_range(traces: list[T], agent: str = "") -> list[T]:
    return [t for t in traces if not agent or t.agent == agent]


def call_cost(tokens_in: int, cached: int, tokens_out: int) -> Decimal:
    return (
        (tokens_in - cached) * PRICE_IN + cached * PRICE_CACHED + tokens_out * PRICE_OUT
    ) / Decimal(1_000_000)


def cost_text(calls: list[tuple[str, int, int, int]]) -> str:
    """What a cost cell's CSV holds: the priced money, then each model without a price."""
    priced = [c for c in calls if c[0] == PRICED]
    unpriced = sorted({c[0] for c in calls if c[0] != PRICED})
    parts = [money(sum((call_cost(*c[1:]) for c in priced), Decimal(0)))] if priced else []
    parts += [f"no price for {model}" for model in unpriced]
    return "; ".join(parts) if parts else "—"


def test_it_counts_runs_per_day_by_outcome_as_the_rows_say(
    seeded: None, client: Client, olga: Any
) -> None:
    rows = csv_rows(client, "runs")
    present = [o for o in TraceOutcome.values if any(t.shown == o for t in TRACES)]
    assert rows[0] == ["Day (UTC)", *(str(TraceOutcome(o).label) for o in present), "All runs"]
    expected = []
    for day in sorted({t.started.date() for t in TRACES}):
        of_day = [t for t in TRACES if t.started.date() == day]
        counts = [sum(1 for t in of_day if t.shown == o) for o in present]
        expected.append([f"{day.isoformat()}T00:00:00+00:00", *map(str, counts), str(len(of_day))])
    assert rows[1:] == expected
    # A trace without a stored outcome takes its status's: error → failed, ok → completed.
    assert "Failed" in rows[0] and "Running" in rows[0]


def test_it_counts_a_short_range_per_hour(seeded: None, client: Client, olga: Any) -> None:
    rows = csv_rows(client, "runs", since=D1.isoformat(), until=D1.isoformat())
    of_day = [t for t in TRACES if t.started.date() == D1]
    expected_hours = sorted({t.started.replace(minute=0, second=0) for t in of_day})
    assert [row[0] for row in rows[1:]] == [hour.isoformat() for hour in expected_hours]
    assert sum(int(row[-1]) for row in rows[1:]) == len(of_day)
    assert rows[0][0] == "Hour (UTC)"


def test_it_gives_nearest_rank_percentiles_of_active_time_per_day(
    seeded: None, client: Client, olga: Any
) -> None:
    rows = csv_rows(client, "latency")
    assert rows[0] == ["Day (UTC)", "Runs", "p50", "p95", "p99"]
    expected = []
    for day in sorted({t.started.date() for t in TRACES}):
        values = [t.active for t in TRACES if t.started.date() == day and t.active is not None]
        expected.append(
            [
                day.isoformat(),
                str(len(values)),
                *(str(round(rank(values, p), 3)) for p in (50, 95, 99)),
            ]
        )
    assert rows[1:] == expected


def test_nearest_rank_is_an_actual_value_at_rank_ceil_p_n() -> None:
    values = [float(v) for v in range(1, 11)]  # 1 … 10
    assert dashboard.nearest_rank(values, 50) == 5.0
    assert dashboard.nearest_rank(values, 95) == 10.0
    assert dashboard.nearest_rank(values, 99) == 10.0
    assert dashboard.nearest_rank([3.0], 50) == 3.0
    assert dashboard.nearest_rank(values[:4], 50) == 2.0  # ceil(2.0) = 2
    assert dashboard.nearest_rank(values[:3], 50) == 2.0  # ceil(1.5) = 2


def test_it_sums_tokens_and_cost_per_day_model_and_agent(
    seeded: None, client: Client, olga: Any
) -> None:
    detail = csv_rows(client, "usage")
    assert detail[0] == [
        "Day (UTC)",
        "Model",
        "Agent",
        "Input tokens",
        "Cached input",
        "Output tokens",
        "Total",
        "Cost",
    ]
    groups: dict[tuple[str, str, str], list[tuple[str, int, int, int]]] = {}
    for t in TRACES:
        for call in t.calls:
            groups.setdefault((t.started.date().isoformat(), call[0], t.agent), []).append(call)
    expected = [
        [
            day,
            model,
            agent,
            str(sum(c[1] for c in calls)),
            str(sum(c[2] for c in calls)),
            str(sum(c[3] for c in calls)),
            str(sum(c[1] + c[3] for c in calls)),
            cost_text(calls),
        ]
        for (day, model, agent), calls in sorted(groups.items())
    ]
    assert detail[1:] == expected
    # An unpriced model is named, never counted as free.
    assert all(row[7] == f"no price for {UNPRICED}" for row in detail[1:] if row[1] == UNPRICED)

    tokens = csv_rows(client, "tokens")
    assert tokens[0] == ["Day (UTC)", PRICED, UNPRICED, "All models"]
    for row in tokens[1:]:
        day = row[0]
        per_model = [
            sum(
                c[1] + c[3]
                for t in TRACES
                for c in t.calls
                if c[0] == m and t.started.date().isoformat() == day
            )
            for m in (PRICED, UNPRICED)
        ]
        assert row[1:] == [*map(str, per_model), str(sum(per_model))]

    cost = csv_rows(client, "cost")
    for row in cost[1:]:
        day = row[0]
        calls = [c for t in TRACES for c in t.calls if t.started.date().isoformat() == day]
        assert row[1] == cost_text([c for c in calls if c[0] == PRICED])
        assert row[2] == cost_text([c for c in calls if c[0] == UNPRICED])
        assert row[3] == cost_text(calls)

    agents = csv_rows(client, "agents")
    expected_agents = []
    for when in sorted({t.started.date() for t in TRACES if t.calls}):
        for agent in ("billing", "support"):
            calls = [
                c for t in TRACES for c in t.calls if t.started.date() == when and t.agent == agent
            ]
            if calls:
                expected_agents.append(
                    [
                        when.isoformat(),
                        agent,
                        str(sum(c[1] + c[3] for c in calls)),
                        cost_text(calls),
                    ]
                )
    assert agents[1:] == expected_agents


def ending(r: R) -> str:
    if r.kind in (DecisionKind.EXPIRED, DecisionKind.EXPIRY_APPROVED):
        return "expired"
    endings: dict[str, str] = {
        ApprovalStatus.APPROVED: "approved",
        ApprovalStatus.REJECTED: "rejected",
        ApprovalStatus.PENDING: "pending",
        ApprovalStatus.CANCELLED: "cancelled",
    }
    return endings.get(r.status, "other")


def test_it_counts_requests_per_tool_with_their_rates(
    seeded: None, client: Client, olga: Any
) -> None:
    rows = csv_rows(client, "requests")
    names = ["approved", "rejected", "expired", "other", "pending", "cancelled"]
    expected = []
    for tool in sorted({r.tool for r in REQUESTS}):
        mine = [r for r in REQUESTS if r.tool == tool]
        counts = {name: sum(1 for r in mine if ending(r) == name) for name in names}
        decided = sum(counts[name] for name in names[:4])

        def rate(name: str, counts: dict[str, int] = counts, decided: int = decided) -> str:
            return str(round(counts[name] / decided, 4)) if decided else ""

        expected.append(
            [
                tool,
                str(len(mine)),
                *(str(counts[n]) for n in names),
                rate("approved"),
                rate("rejected"),
                rate("expired"),
            ]
        )
    assert rows[1:] == expected
    assert rows[0][:2] == ["Tool", "Requests"] and rows[0][-3:] == [
        "Approval rate",
        "Rejection rate",
        "Expiry rate",
    ]


def test_it_times_decisions_per_tool_and_per_decider(
    seeded: None, client: Client, olga: Any
) -> None:
    decided = [r for r in REQUESTS if r.wait is not None]
    group = {"policy": "policy", "expiry": "expiry", "withdrawn": "withdrawn by the user"}

    def expected(key: Any) -> list[list[str]]:
        keys = sorted({key(r) for r in decided})
        rows = []
        for k in keys:
            waits = [float(r.wait or 0) for r in decided if key(r) == k]
            rows.append([k, str(len(waits)), *(str(round(rank(waits, p), 3)) for p in (50, 95))])
        return rows

    assert csv_rows(client, "wait-tools")[1:] == expected(lambda r: r.tool)
    by_decider = expected(lambda r: group.get(r.decider, r.decider))
    assert csv_rows(client, "wait-deciders")[1:] == by_decider
    assert {row[0] for row in by_decider} >= {"rita", "bob", "policy", "expiry"}


def test_it_counts_the_pending_backlog_at_each_boundary(
    seeded: None, client: Client, olga: Any
) -> None:
    rows = csv_rows(client, "backlog")
    start = at(date(2026, 11, 27), 0)
    points = [start + timedelta(days=i) for i in range(5)]  # each day's start, and the end

    def pending(r: R, t: datetime) -> bool:
        end = r.created + timedelta(seconds=r.wait) if r.wait is not None else r.run_finished
        return r.created < t and (end is None or end >= t)

    everything = [*REQUESTS, OLD_PENDING]
    expected = [[t.isoformat(), str(sum(pending(r, t) for r in everything))] for t in points]
    assert rows[1:] == expected
    # The old one throughout; on Nov 30 also one still pending and one decided 25 h after.
    assert [row[1] for row in rows[1:]] == ["1", "1", "1", "3", "2"]


def test_the_agent_filter_keeps_only_that_agents_runs_and_requests(
    seeded: None, client: Client, olga: Any
) -> None:
    runs = csv_rows(client, "runs", agent="billing")
    assert sum(int(row[-1]) for row in runs[1:]) == len(in_range(TRACES, "billing"))
    usage = csv_rows(client, "usage", agent="billing")
    assert {row[2] for row in usage[1:]} == {"billing"}
    requests = csv_rows(client, "requests", agent="billing")
    assert [row[0] for row in requests[1:]] == ["refund_order", "wire_money"]
    backlog = csv_rows(client, "backlog", agent="billing")
    assert [row[1] for row in backlog[1:]] == ["0", "0", "0", "1", "0"]


def test_the_page_shows_each_chart_with_its_table_and_csv_link(
    seeded: None, client: Client, olga: Any
) -> None:
    response = client.get(URL, {**RANGE, "agent": "support"})
    assert response.status_code == 200
    html = response.content.decode()
    for name in (
        "runs",
        "latency",
        "tokens",
        "cost",
        "agents",
        "requests",
        "wait-tools",
        "wait-deciders",
        "backlog",
    ):
        section = re.search(
            rf'<section class="dash-panel" id="chart-{name}".*?</section>', html, re.S
        )
        assert section, name
        text = section.group(0)
        assert re.search(r'<svg class="chart"[^>]*role="img"[^>]*aria-label="[^"]+"', text), name
        assert "<title id=" in text and "<desc id=" in text and 'class="legend"' in text, name
        assert 'class="axis-label"' in text and "<caption>" in text and 'scope="col"' in text, name
        # The CSV link keeps the filters.
        link = re.search(r'href="([^"]*format=csv[^"]*)"', text)
        assert link, name
        assert "since=2026-11-27" in link.group(1) and "until=2026-11-30" in link.group(1)
        assert "agent=support" in link.group(1) and f"chart={name}" in link.group(1)
    assert f"no price for {UNPRICED}" in html
    assert not re.search(r"\$0\.0+(?!\d*[1-9])", html)  # no cost of 0 anywhere
    assert not inline_code(html)
    assert policy_of(response)["style-src"] == "'self'"


def test_a_model_without_a_price_links_to_its_price_for_who_may_add_one(
    seeded: None, client: Client, olga: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        "tracing.dashboard_views.add_price_url", lambda model: f"/admin/price/add/?model={model}"
    )
    assert "/admin/price/add/" not in client.get(URL, RANGE).content.decode()
    staff = Client()
    staff.force_login(make_user(["tracing.add_modelprice"], username="pat", is_staff=True))
    html = staff.get(URL, RANGE).content.decode()
    assert f'href="/admin/price/add/?model={UNPRICED}"' in html


def test_it_escapes_names_from_the_data(client: Client, olga: Any) -> None:
    seed_traces(
        [T(at(D1, 9), "<script>x</script>", "completed", "ok", 1.0, (("<b>m</b>", 10, 0, 1),))]
    )
    html = client.get(URL, RANGE).content.decode()
    assert "<script>x</script>" not in html and "<b>m</b>" not in html
    assert "&lt;script&gt;x&lt;/script&gt;" in html


def test_a_csv_cell_is_never_read_as_a_formula(client: Client, olga: Any) -> None:
    seed_traces([T(at(D1, 9), "=HYPERLINK(1)", "completed", "ok", 1.0, ((PRICED, 10, 0, 1),))])
    rows = csv_rows(client, "usage")
    assert rows[1][2] == "'=HYPERLINK(1)"


def test_the_csv_is_named_after_its_chart_and_range(client: Client, olga: Any) -> None:
    response = client.get(URL, {**RANGE, "agent": "support", "format": "csv", "chart": "latency"})
    assert response["Content-Disposition"] == (
        'attachment; filename="dashboard-latency-2026-11-27-to-2026-11-30-support.csv"'
    )


@pytest.mark.parametrize(
    "query, says",
    [
        ({"since": "2026-11-30", "until": "2026-11-27"}, "ends before it starts"),
        ({"since": "2025-01-01", "until": "2026-01-02"}, "at most 366 days"),
        ({"since": "yesterday"}, "Enter a valid date"),
        ({**RANGE, "format": "csv", "chart": "nope"}, "Unknown chart"),
    ],
)
def test_it_refuses_a_range_it_cannot_show(
    client: Client, olga: Any, query: dict[str, str], says: str
) -> None:
    response = client.get(URL, query)
    assert response.status_code == 400
    assert says in response.content.decode()


def test_the_default_range_is_the_last_seven_days(client: Client, olga: Any) -> None:
    response = client.get(URL)
    assert response.status_code == 200
    window = response.context["window"]
    assert window.days == 7 and window.until == datetime.now(UTC).date()
    # 366 days is allowed.
    assert client.get(URL, {"since": "2025-01-01", "until": "2026-01-01"}).status_code == 200


@pytest.mark.parametrize("query", [{}, {"format": "csv", "chart": "runs"}])
def test_only_operators_see_it(query: dict[str, str]) -> None:
    anonymous = Client().get(URL, query)
    assert anonymous.status_code == 302
    assert anonymous["Location"].startswith("/accounts/login/?next=")
    plain = Client()
    plain.force_login(make_user(username="alice"))
    assert plain.get(URL, query).status_code == 403
    staff = Client()
    staff.force_login(make_user(username="sam", is_staff=True))
    assert staff.get(URL, query).status_code == 200


def test_its_queries_do_not_grow_with_the_traces(client: Client, olga: Any) -> None:
    def count() -> int:
        client.get(URL, RANGE)  # sessions, permissions cached alike
        with CaptureQueriesContext(connection) as queries:
            assert client.get(URL, RANGE).status_code == 200
        return len(queries)

    seed_traces(TRACES[:3])
    seed_requests(REQUESTS[:2])
    few = count()
    ModelPrice.objects.create(
        model=PRICED, input_per_million=1, output_per_million=1, valid_from=date(2026, 1, 1)
    )
    seed_traces(TRACES * 3)
    seed_requests(REQUESTS)
    assert count() == few
    assert few <= 14


# SQLite plans a table of a few rows as it plans a large one; PostgreSQL rightly scans it.
@pytest.mark.sqlite
def test_its_queries_read_the_range_through_indexes(
    seeded: None, client: Client, olga: Any
) -> None:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(URL, RANGE).status_code == 200
    tables = ("tracing_trace", "tracing_span", "approvals_approvalrequest")
    read = [q["sql"] for q in queries if any(f'FROM "{t}"' in q["sql"] for t in tables)]
    assert len(read) >= 6
    plans = [explain(sql) for sql in read]
    for sql, plan in zip(read, plans, strict=True):
        assert not re.search(
            r"\bSCAN (tracing_trace|tracing_span|approvals_approvalrequest)\b", plan
        ), (
            sql,
            plan,
        )
    joined = " | ".join(plans)
    for index in ("trace_dashboard", "span_usage", "request_status_created"):
        assert index in joined, (index, joined)
