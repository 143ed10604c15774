"""The operators' dashboard, as numbers: runs by outcome, latency, tokens and cost, approvals.

Each function takes a `Window` (a range of UTC days and an optional agent) and returns plain
rows of numbers; `tracing.charts` draws them and `dashboard_views` shows them as tables and
CSV. Every function is one query (the usage one two, with the price table), whatever the
number of traces: sums and counts are grouped in SQL through the range's index
(`trace_dashboard` and `span_usage`, which cover the queries, migration 0006;
`request_status_created`), and only
percentiles that SQL cannot give portably are ranked in SQL and picked here.

Days and hours are UTC, as the prices' `valid_from` and `pricing.usage_rows` count them.
A trace's agent is the registry name its run was started under (`metadata["agent"]`, which
the engine writes on every run's trace, = `AgentRun.agent_name`), or, for a trace that no run
of this site made, its workflow name.

Percentiles are nearest-rank: of n values sorted, the p-th percentile is the k-th smallest,
k = ceil(p × n / 100) (at least 1), an actual value, never an interpolation.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.db.models import (
    CharField,
    Count,
    F,
    Func,
    IntegerField,
    Q,
    QuerySet,
    Value,
)
from django.db.models import (
    Window as Over,
)
from django.db.models.expressions import Expression, ExpressionWrapper
from django.db.models.functions import Coalesce, NullIf, RowNumber
from django.utils import timezone

from agentsite.db.functions import UTCPeriod, period_start
from approvals.models import (
    ApprovalDecision,
    ApprovalRequest,
    ApprovalStatus,
    DecisionKind,
)
from tracing.models import STATUS_OUTCOME, Span, Trace, TraceOutcome
from tracing.pricing import Cost, PriceBook, usage_rows

MAX_DAYS = 366
# A range of up to this many days is counted per hour, a longer one per day.
HOURLY_DAYS = 3
LATENCY_PERCENTILES = (50, 95, 99)
DECISION_PERCENTILES = (50, 95)

# The agent of a trace with neither an agent in its metadata nor a workflow name.
NO_AGENT = "(no agent)"

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


@dataclass(frozen=True)
class Window:
    """The dashboard's filter: the UTC days `since` to `until` (both included), one agent or
    every one."""

    since: date
    until: date
    agent: str = ""

    @classmethod
    def last_days(cls, days: int = 7, agent: str = "", today: date | None = None) -> Window:
        today = today or timezone.now().astimezone(UTC).date()
        return cls(today - timedelta(days=days - 1), today, agent)

    @property
    def days(self) -> int:
        return (self.until - self.since).days + 1

    @property
    def start(self) -> datetime:
        return datetime.combine(self.since, time.min, tzinfo=UTC)

    @property
    def end(self) -> datetime:
        """The first moment after the range."""
        return datetime.combine(self.until, time.min, tzinfo=UTC) + DAY

    @property
    def hourly(self) -> bool:
        return self.days <= HOURLY_DAYS

    @property
    def step(self) -> timedelta:
        return HOUR if self.hourly else DAY

    def buckets(self) -> list[datetime]:
        """The start of each hour (a short range) or day of the range."""
        count = int((self.end - self.start) / self.step)
        return [self.start + i * self.step for i in range(count)]


# --- SQL pieces -------------------------------------------------------------------------------


class MetadataAgent(Func):
    """A trace's `metadata["agent"]` as text, read with one JSON operator (Django's key
    transform reads the JSON twice a row on SQLite: its type, then its value)."""

    output_field = CharField()

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(compiler, connection, template="(%(expressions)s ->> '$.agent')")

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(compiler, connection, template="(%(expressions)s ->> 'agent')")


def agent_of(prefix: str = "") -> Expression:
    """A trace's agent (see the module's docstring); `prefix` reaches the trace from a span
    ("trace__")."""
    return Coalesce(
        NullIf(MetadataAgent(F(f"{prefix}metadata")), Value("")),
        F(f"{prefix}workflow_name"),
        output_field=CharField(),
    )


def window_traces(window: Window) -> QuerySet[Trace]:
    """The traces that started in the range, of its agent: through the `trace_started` index."""
    traces = Trace.objects.filter(started_at__gte=window.start, started_at__lt=window.end)
    if window.agent:
        traces = traces.alias(agent=agent_of()).filter(agent=window.agent)
    return traces.order_by()


def window_requests(window: Window) -> QuerySet[ApprovalRequest]:
    """The approval requests made in the range, by runs of its agent."""
    # Every status, named: the `(status, -created)` index then bounds the range (one seek per
    # status), as no index starts with `created`.
    requests = ApprovalRequest.objects.filter(
        status__in=ApprovalStatus.values, created__gte=window.start, created__lt=window.end
    )
    if window.agent:
        requests = requests.filter(run__agent_name=window.agent)
    return requests.order_by()


def nearest_rank(ordered: Sequence[float], p: int) -> float:
    """The p-th percentile (nearest-rank) of values sorted ascending."""
    if not ordered:
        raise ValueError("no values")
    rank = max(1, -(-p * len(ordered) // 100))  # ceil(p × n / 100), in integers
    return ordered[rank - 1]


# --- 1. runs by outcome -----------------------------------------------------------------------


@dataclass
class RunCounts:
    buckets: list[datetime]
    outcomes: list[str]  # the outcomes that occur, in `TraceOutcome`'s order
    counts: dict[tuple[datetime, str], int]

    def count(self, bucket: datetime, outcome: str) -> int:
        return self.counts.get((bucket, outcome), 0)

    def total(self, bucket: datetime) -> int:
        return sum(self.count(bucket, outcome) for outcome in self.outcomes)


def runs_by_outcome(window: Window) -> RunCounts:
    """Traces per hour or day by outcome: the stored outcome, else the status's
    (`Trace.shown_outcome`)."""
    rows = (
        window_traces(window)
        .annotate(period=UTCPeriod("started_at", window.hourly))
        .values("period", "outcome", "status")
        .annotate(runs=Count("pk"))
    )
    counts: dict[tuple[datetime, str], int] = defaultdict(int)
    for row in rows:
        outcome = row["outcome"] or STATUS_OUTCOME.get(row["status"], TraceOutcome.RUNNING).value
        counts[(period_start(row["period"]), outcome)] += row["runs"]
    seen = {outcome for _, outcome in counts}
    outcomes = [outcome for outcome in TraceOutcome.values if outcome in seen]
    return RunCounts(window.buckets(), outcomes, dict(counts))


# --- 2. latency -------------------------------------------------------------------------------


@dataclass
class LatencyRow:
    day: date
    runs: int  # traces with an active time
    percentiles: dict[int, float]  # p -> seconds


def latency(window: Window) -> list[LatencyRow]:
    """p50 / p95 / p99 of the traces' active time (`Trace.active_seconds`: the run working,
    not waiting for people), per day, for the days that have any.

    In one query: each trace's rank by active time within its day and the day's count (window
    functions, which SQLite and PostgreSQL both have; SQLite has no percentile_cont), and only
    the rows at the nearest ranks come back: a few per day, however many traces.
    """
    day = UTCPeriod("started_at", False)
    ranked = (
        window_traces(window)
        .filter(active_seconds__isnull=False)
        .annotate(
            day=day,
            rank=Over(RowNumber(), partition_by=[day], order_by=[F("active_seconds"), F("pk")]),
            runs=Over(Count("pk"), partition_by=[day]),
        )
    )
    wanted = Q()
    for p in LATENCY_PERCENTILES:
        # ceil(p × n / 100) in integer arithmetic, the same in both databases.
        at = ExpressionWrapper((F("runs") * p + 99) / 100, output_field=IntegerField())
        wanted |= Q(rank=at)
    found: dict[date, LatencyRow] = {}
    for row in ranked.filter(wanted).values("day", "rank", "runs", "active_seconds"):
        at_day = period_start(row["day"]).date()
        entry = found.setdefault(at_day, LatencyRow(at_day, row["runs"], {}))
        for p in LATENCY_PERCENTILES:
            if max(1, -(-p * row["runs"] // 100)) == row["rank"]:
                entry.percentiles[p] = float(row["active_seconds"] or 0.0)
    return [found[key] for key in sorted(found)]


# --- 3. tokens and cost -----------------------------------------------------------------------


@dataclass
class UsageRow:
    day: date
    model: str
    agent: str
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    total_tokens: int
    cost: Cost


def usage(window: Window, book: PriceBook | None = None) -> list[UsageRow]:
    """Token sums and their cost per day, model and agent (`pricing.usage_rows`, priced by
    `PriceBook.row_cost`: a model without a price is named in the cost, never 0)."""
    book = book or PriceBook.load()
    spans = Span.objects.filter(started_at__gte=window.start, started_at__lt=window.end)
    # A model call's agent is on its span (the exporter copies it from its trace, by the
    # same rule as `agent_of`): the sums read the `span_usage` index alone.
    if window.agent:
        spans = spans.filter(agent=window.agent)
    rows = [
        UsageRow(
            day=row["day"],
            model=row["model"],
            agent=row["agent"] or NO_AGENT,
            input_tokens=int(row["input_tokens"] or 0),
            cached_tokens=int(row["cached_tokens"] or 0),
            output_tokens=int(row["output_tokens"] or 0),
            total_tokens=int(row["total_tokens"] or 0),
            cost=book.row_cost(row),
        )
        for row in usage_rows(spans, "agent")
    ]
    rows.sort(key=lambda row: (row.day, row.model, row.agent))
    return rows


def totals_by(rows: Iterable[UsageRow], key: str) -> dict[str, tuple[int, Cost]]:
    """Tokens and cost summed per `key` ("model", "agent" or "day")."""
    sums: dict[str, tuple[int, Cost]] = {}
    for row in rows:
        name = str(getattr(row, key))
        tokens, cost = sums.get(name, (0, Cost()))
        sums[name] = (tokens + row.total_tokens, cost.add(row.cost))
    return sums


# --- 4. approvals -----------------------------------------------------------------------------

# How a request ended, for its rates: what its decision did (a request the expiry policy
# approved expired as much as one it rejected: nobody decided in time).
ENDINGS = ("approved", "rejected", "expired", "other", "pending", "cancelled")
DECIDED_ENDINGS = ("approved", "rejected", "expired", "other")


def ending(status: str, kind: str | None) -> str:
    if kind in (DecisionKind.EXPIRED, DecisionKind.EXPIRY_APPROVED) or (
        status == ApprovalStatus.EXPIRED
    ):
        return "expired"
    if status == ApprovalStatus.APPROVED:
        return "approved"
    if status == ApprovalStatus.REJECTED:
        return "rejected"
    if status == ApprovalStatus.PENDING:
        return "pending"
    if status == ApprovalStatus.CANCELLED:
        return "cancelled"
    return "other"  # withdrawn by the user, answered by a reviewer as the tool


@dataclass
class ToolRow:
    tool: str
    counts: dict[str, int] = field(default_factory=dict)  # ending -> requests

    @property
    def requests(self) -> int:
        return sum(self.counts.values())

    @property
    def decided(self) -> int:
        return sum(self.counts.get(name, 0) for name in DECIDED_ENDINGS)

    def rate(self, name: str) -> float | None:
        """The share of its decided requests that ended as `name`; None if none is decided."""
        return self.counts.get(name, 0) / self.decided if self.decided else None


def approvals_by_tool(window: Window) -> list[ToolRow]:
    """Requests per tool, by how they ended; rates are shares of the decided ones."""
    rows = (
        window_requests(window)
        .values("tool_name", "status", "decisions__kind")
        .annotate(requests=Count("pk"))
    )
    tools: dict[str, ToolRow] = {}
    for row in rows:
        tool = tools.setdefault(row["tool_name"], ToolRow(row["tool_name"]))
        name = ending(row["status"], row["decisions__kind"])
        tool.counts[name] = tool.counts.get(name, 0) + row["requests"]
    return [tools[name] for name in sorted(tools)]


POLICY = "policy"
EXPIRY = "expiry"
WITHDRAWN = "withdrawn by the user"


@dataclass
class WaitRow:
    key: str  # a tool, or who decided
    decisions: int
    percentiles: dict[int, float]  # p -> seconds


@dataclass
class DecisionTimes:
    by_tool: list[WaitRow]
    by_decider: list[WaitRow]


def decider(reviewer: str | None, policy_name: str, withdrawn: bool, kind: str) -> str:
    """Who decided, as the dashboard groups them: the reviewer, "policy" for any approval
    policy, "expiry" when nobody decided in time, the user who withdrew."""
    if withdrawn:
        return WITHDRAWN
    if reviewer:
        return reviewer
    if policy_name:
        return POLICY
    return EXPIRY


def decision_times(window: Window) -> DecisionTimes:
    """Time to decision (the decision's time − the request's) of the requests made in the
    range, p50 / p95 per tool and per decider. Every decision counts for its tool: the
    call waited that long, whoever ended the wait."""
    rows = ApprovalDecision.objects.filter(request__in=window_requests(window)).values_list(
        "request__tool_name",
        "reviewer__username",
        "policy_name",
        "withdrawn",
        "kind",
        "created",
        "request__created",
    )
    by_tool: dict[str, list[float]] = defaultdict(list)
    by_decider: dict[str, list[float]] = defaultdict(list)
    for tool, reviewer, policy_name, withdrawn, kind, decided, asked in rows.order_by():
        seconds = max(0.0, (decided - asked).total_seconds())
        by_tool[tool].append(seconds)
        by_decider[decider(reviewer, policy_name, withdrawn, kind)].append(seconds)
    return DecisionTimes(_waits(by_tool), _waits(by_decider))


def _waits(groups: dict[str, list[float]]) -> list[WaitRow]:
    rows = []
    for key in sorted(groups):
        ordered = sorted(groups[key])
        rows.append(
            WaitRow(key, len(ordered), {p: nearest_rank(ordered, p) for p in DECISION_PERCENTILES})
        )
    return rows


@dataclass
class BacklogPoint:
    at: datetime
    pending: int


def backlog(window: Window, now: datetime | None = None) -> list[BacklogPoint]:
    """Requests pending at each hour or day boundary of the range (its start to its end, or
    to now for a range that has not ended: the last point is now): those made before t and
    not decided before t. A request cancelled with its run (the run failed while it waited)
    stopped pending when its run ended."""
    now = now or timezone.now()
    points = [at for at in (*window.buckets(), window.end) if at <= now]
    if window.end > now >= window.start:
        points.append(now)
    if not points:
        return []
    first, last = points[0], points[-1]
    requests = ApprovalRequest.objects.filter(status__in=ApprovalStatus.values, created__lt=last)
    if window.agent:
        requests = requests.filter(run__agent_name=window.agent)
    # Only those still pending somewhere in the range: made before its end, and not decided
    # (nor cancelled) before its start.
    ended_late = Q(decided_at__gte=first) | Q(
        status=ApprovalStatus.CANCELLED, decided_at__isnull=True, run__finished__gte=first
    )
    never_ended = Q(decided_at__isnull=True) & ~Q(status=ApprovalStatus.CANCELLED)
    rows = requests.filter(ended_late | never_ended).order_by()
    made: list[datetime] = []
    ended: list[datetime] = []
    for created, decided_at, status, finished in rows.values_list(
        "created", "decided_at", "status", "run__finished"
    ):
        made.append(created)
        end = decided_at or (finished if status == ApprovalStatus.CANCELLED else None)
        if end is not None:
            ended.append(end)
    made.sort()
    ended.sort()
    # Pending at t: made before t, less those ended before t (an end is never before its
    # request was made).
    return [
        BacklogPoint(at, bisect.bisect_left(made, at) - bisect.bisect_left(ended, at))
        for at in points
    ]
