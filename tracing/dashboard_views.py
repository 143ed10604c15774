"""The operators' dashboard page: charts of `tracing.dashboard`'s numbers, each with the same
numbers as a table under it and as CSV (`?format=csv&chart=<name>`, the page's filters kept).

For operators only (`trace_viewer_required`, as the trace list). Model, agent, tool and
reviewer names are data: the template escapes them, and a CSV cell that a spreadsheet would
read as a formula is prefixed with a quote.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from functools import cached_property
from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.http import content_disposition_header, urlencode
from django.views.decorators.http import require_GET

from common import formatting
from engine import registry
from tracing import charts, dashboard
from tracing.access import trace_viewer_required
from tracing.dashboard import Window
from tracing.models import TraceOutcome
from tracing.pricing import Cost, PriceBook, add_price_url, money

DEFAULT_DAYS = 7


def agent_choices() -> list[str]:
    """Suggestions for the agent filter: the registered agents (a trace's agent is the name
    its run was started under; a foreign trace's, its workflow name)."""
    return list(registry.agent_names())


class DashboardForm(forms.Form):
    """The range (UTC days, both included; by default the last 7) and the agent."""

    since = forms.DateField(required=False)
    until = forms.DateField(required=False)
    agent = forms.CharField(required=False, max_length=255)
    format = forms.ChoiceField(required=False, choices=[("", "page"), ("csv", "CSV")])
    chart = forms.CharField(required=False, max_length=40)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        today = timezone.now().astimezone(UTC).date()
        since, until = data.get("since"), data.get("until")
        if until is None:
            until = since + timedelta(days=DEFAULT_DAYS - 1) if since else today
        if since is None:
            since = until - timedelta(days=DEFAULT_DAYS - 1)
        if until < since:
            raise ValidationError(
                "The range ends before it starts: pick a To date on or after From."
            )
        if (until - since).days + 1 > dashboard.MAX_DAYS:
            raise ValidationError(
                f"The range is {(until - since).days + 1} days long: pick at most "
                f"{dashboard.MAX_DAYS} days."
            )
        try:
            window = Window(since, until, (data.get("agent") or "").strip())
            window.end  # noqa: B018  (a last day of 9999 has no end)
        except OverflowError:
            raise ValidationError("This date is out of range.") from None
        data["window"] = window
        return data

    def filter_values(self) -> dict[str, str]:
        window: Window = self.cleaned_data["window"]
        values = {"since": window.since.isoformat(), "until": window.until.isoformat()}
        if window.agent:
            values["agent"] = window.agent
        return values


# --- tables -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Missing:
    model: str
    url: str  # the admin's form to add its price, or "" for who may not


@dataclass
class Cell:
    text: str
    value: Any  # what the CSV holds
    numeric: bool = False
    missing: list[Missing] = field(default_factory=list)


@dataclass
class Table:
    caption: str
    columns: list[str]
    rows: list[list[Cell]]  # each row's first cell is its header
    text_columns: int = 1  # how many columns, from the left, hold text (the others numbers)


def count_cell(value: int) -> Cell:
    return Cell(f"{value:,}", value, numeric=True)


def seconds_cell(value: float | None) -> Cell:
    if value is None:
        return Cell("—", "", numeric=True)
    return Cell(formatting.duration(value), round(value, 3), numeric=True)


def rate_cell(value: float | None) -> Cell:
    if value is None:
        return Cell("—", "", numeric=True)
    return Cell(f"{value:.0%}", round(value, 4), numeric=True)


class CostCells:
    """Cost cells: the money, and each model without a price named, with a link to add its
    price for those who may (never a cost of 0 for it)."""

    def __init__(self, may_add_prices: bool) -> None:
        self.may_add_prices = may_add_prices

    def url(self, model: str) -> str:
        if not self.may_add_prices:
            return ""
        try:
            return add_price_url(model)
        except NoReverseMatch:  # no price admin on this site
            return ""

    def cell(self, cost: Cost) -> Cell:
        missing = [Missing(model, self.url(model)) for model in cost.missing]
        text = cost.money() or ("" if missing else "—")
        return Cell(text, str(cost), numeric=True, missing=missing)


# --- the sections -----------------------------------------------------------------------------


@dataclass
class Panel:
    """One chart (or a table alone), its table, its CSV."""

    name: str
    chart: charts.Chart | None
    table: Table
    csv_url: str = ""
    notes: list[Missing] = field(default_factory=list)  # models without a price it leaves out


def _label(at: datetime, hourly: bool) -> str:
    return at.strftime("%b %d %H:00") if hourly else at.strftime("%b %d")


def _day(value: date) -> str:
    return value.strftime("%b %d")


def runs_panel(window: Window) -> Panel:
    counts = dashboard.runs_by_outcome(window)
    labels = [_label(bucket, window.hourly) for bucket in counts.buckets]
    series = [
        charts.Series(
            str(TraceOutcome(outcome).label),
            [counts.count(bucket, outcome) for bucket in counts.buckets],
            css=f"outcome-{outcome}",
        )
        for outcome in counts.outcomes
    ]
    per = "hour" if window.hourly else "day"
    chart = charts.bar_chart(
        "runs",
        f"Runs per {per} by outcome",
        f"Stacked bars: the runs (traces) that started each {per}, by how they ended.",
        labels,
        series,
        x_label=f"{per.capitalize()} (UTC)",
        y_label="Runs",
    )
    rows = [
        [
            Cell(label, bucket.isoformat()),
            *(count_cell(counts.count(bucket, outcome)) for outcome in counts.outcomes),
            count_cell(counts.total(bucket)),
        ]
        for label, bucket in zip(labels, counts.buckets, strict=True)
        if counts.total(bucket)
    ]
    columns = [f"{per.capitalize()} (UTC)"]
    columns += [str(TraceOutcome(o).label) for o in counts.outcomes] + ["All runs"]
    return Panel("runs", chart, Table(f"Runs per {per} by outcome", columns, rows))


def latency_panel(window: Window) -> Panel:
    found = {row.day: row for row in dashboard.latency(window)}
    days = [window.since + timedelta(days=i) for i in range(window.days)]
    series = [
        charts.Series(
            f"p{p}",
            [found[day].percentiles.get(p) if day in found else None for day in days],
            css=f"series-p{p}",
        )
        for p in dashboard.LATENCY_PERCENTILES
    ]
    chart = charts.line_chart(
        "latency",
        "Latency of active time per day: p50, p95, p99",
        "Lines: per day, the active time (the run working, not waiting for a person) that "
        "half, 95 % and 99 % of the runs stayed within (nearest-rank percentiles).",
        [_day(day) for day in days],
        series,
        x_label="Day (UTC)",
        y_label="Active time",
        text=formatting.duration,
        integer=False,
        seconds=True,
    )
    rows = [
        [
            Cell(_day(row.day), row.day.isoformat()),
            count_cell(row.runs),
            *(seconds_cell(row.percentiles.get(p)) for p in dashboard.LATENCY_PERCENTILES),
        ]
        for row in found.values()
    ]
    columns = ["Day (UTC)", "Runs", *(f"p{p}" for p in dashboard.LATENCY_PERCENTILES)]
    return Panel(
        "latency", chart, Table("Active time per day (nearest-rank percentiles)", columns, rows)
    )


class Sums:
    """Tokens and cost per day and name (a model, an agent)."""

    def __init__(self) -> None:
        self.by: dict[tuple[date, str], tuple[int, Cost]] = {}

    def add(self, day: date, name: str, tokens: int, cost: Cost) -> None:
        so_far, spent = self.by.get((day, name), (0, Cost()))
        self.by[(day, name)] = (so_far + tokens, Cost().add(spent).add(cost))

    def tokens(self, day: date, name: str) -> int:
        return self.by.get((day, name), (0, Cost()))[0]

    def cost(self, day: date, name: str) -> Cost:
        return self.by.get((day, name), (0, Cost()))[1]

    def __contains__(self, key: tuple[date, str]) -> bool:
        return key in self.by


@dataclass
class Usage:
    """The range's usage rows (per day, model and agent), summed per day and model and per
    day and agent."""

    rows: list[dashboard.UsageRow]
    days: list[date]  # every day of the range
    by_model: Sums = field(default_factory=Sums)
    by_agent: Sums = field(default_factory=Sums)

    @classmethod
    def of(cls, window: Window) -> Usage:
        rows = dashboard.usage(window, PriceBook.load())
        usage = cls(rows, [window.since + timedelta(days=i) for i in range(window.days)])
        for row in rows:
            usage.by_model.add(row.day, row.model, row.total_tokens, row.cost)
            usage.by_agent.add(row.day, row.agent, row.total_tokens, row.cost)
        return usage

    @cached_property
    def used(self) -> list[date]:
        """The days with usage, the tables' rows."""
        return sorted({row.day for row in self.rows})

    @cached_property
    def models(self) -> list[str]:
        return sorted({row.model for row in self.rows})

    @cached_property
    def agents(self) -> list[str]:
        return sorted({row.agent for row in self.rows})

    @property
    def labels(self) -> list[str]:
        return [_day(day) for day in self.days]


def usage_panels(window: Window, costs: CostCells) -> list[Panel]:
    usage = Usage.of(window)
    return [
        tokens_panel(usage),
        cost_panel(usage, costs),
        agents_panel(usage, costs),
        Panel("usage", None, usage_table(usage, costs)),
    ]


def tokens_panel(usage: Usage) -> Panel:
    sums, models = usage.by_model, usage.models
    chart = charts.bar_chart(
        "tokens",
        "Tokens per day by model",
        "Stacked bars: the tokens (input and output) of the model calls of each day, by model.",
        usage.labels,
        [charts.Series(model, [sums.tokens(day, model) for day in usage.days]) for model in models],
        x_label="Day (UTC)",
        y_label="Tokens",
    )
    table = Table(
        "Tokens per day by model",
        ["Day (UTC)", *models, "All models"],
        [
            [
                Cell(_day(day), day.isoformat()),
                *(count_cell(sums.tokens(day, model)) for model in models),
                count_cell(sum(sums.tokens(day, model) for model in models)),
            ]
            for day in usage.used
        ],
    )
    return Panel("tokens", chart, table)


def cost_panel(usage: Usage, costs: CostCells) -> Panel:
    """The cost chart draws the currency most calls were priced in; the table has them all,
    and the models without a price are named under the chart, not drawn as free."""
    sums, models = usage.by_model, usage.models
    currencies: dict[str, int] = {}
    unpriced: set[str] = set()
    for row in usage.rows:
        for priced_in in row.cost.amounts:
            currencies[priced_in] = currencies.get(priced_in, 0) + 1
        unpriced.update(row.cost.missing)
    currency = max(currencies, key=lambda c: (currencies[c], c == "USD"), default="USD")
    priced_models = [
        m
        for m in models
        if m not in unpriced or any(sums.cost(day, m).amounts for day in usage.days)
    ]
    chart = charts.bar_chart(
        "cost",
        f"Cost per day by model ({currency})",
        f"Stacked bars: what the model calls of each day cost in {currency}, by model. Models "
        "without a price are listed under the chart, not drawn as free.",
        usage.labels,
        [
            charts.Series(
                model, [float(sums.cost(day, model).amount(currency)) for day in usage.days]
            )
            for model in priced_models
        ],
        x_label="Day (UTC)",
        y_label=f"Cost ({currency})",
        text=lambda value: money_text(value, currency),
        integer=False,
    )
    table = Table(
        "Cost per day by model",
        ["Day (UTC)", *models, "All models"],
        [
            [
                Cell(_day(day), day.isoformat()),
                *(costs.cell(sums.cost(day, model)) for model in models),
                costs.cell(_sum_costs(sums.cost(day, model) for model in models)),
            ]
            for day in usage.used
        ],
    )
    notes = [Missing(model, costs.url(model)) for model in sorted(unpriced)]
    return Panel("cost", chart, table, notes=notes)


def agents_panel(usage: Usage, costs: CostCells) -> Panel:
    sums, agents = usage.by_agent, usage.agents
    chart = charts.bar_chart(
        "agents",
        "Tokens per day by agent",
        "Stacked bars: the tokens of the model calls of each day, by the agent that ran them.",
        usage.labels,
        [charts.Series(agent, [sums.tokens(day, agent) for day in usage.days]) for agent in agents],
        x_label="Day (UTC)",
        y_label="Tokens",
    )
    table = Table(
        "Tokens and cost per day by agent",
        ["Day (UTC)", "Agent", "Tokens", "Cost"],
        [
            [
                Cell(_day(day), day.isoformat()),
                Cell(agent, agent),
                count_cell(sums.tokens(day, agent)),
                costs.cell(sums.cost(day, agent)),
            ]
            for day in usage.used
            for agent in agents
            if (day, agent) in sums
        ],
        text_columns=2,
    )
    return Panel("agents", chart, table)


def usage_table(usage: Usage, costs: CostCells) -> Table:
    """Every usage row: tokens and cost per day, model and agent (a table alone)."""
    return Table(
        "Tokens and cost per day, model and agent",
        [
            "Day (UTC)",
            "Model",
            "Agent",
            "Input tokens",
            "Cached input",
            "Output tokens",
            "Total",
            "Cost",
        ],
        [
            [
                Cell(_day(row.day), row.day.isoformat()),
                Cell(row.model, row.model),
                Cell(row.agent, row.agent),
                count_cell(row.input_tokens),
                count_cell(row.cached_tokens),
                count_cell(row.output_tokens),
                count_cell(row.total_tokens),
                costs.cell(row.cost),
            ]
            for row in usage.rows
        ],
        text_columns=3,
    )


def money_text(value: float, currency: str) -> str:
    """An amount on a cost axis or bar: as `pricing.money`, without trailing zeros."""
    text = money(Decimal(str(round(value, 6))), currency)
    if "." in text and not text[-1].isalpha():
        text = text.rstrip("0").rstrip(".")
    return text


def _sum_costs(costs: Iterable[Cost]) -> Cost:
    total = Cost()
    for cost in costs:
        total.add(cost)
    return total


ENDING_LABELS = {
    "approved": "Approved",
    "rejected": "Rejected",
    "expired": "Expired",
    "other": "Withdrawn or answered",
    "pending": "Pending",
    "cancelled": "Cancelled",
}


def approval_panels(window: Window, now: datetime | None = None) -> list[Panel]:
    requests = requests_panel(window)
    times = dashboard.decision_times(window)
    return [
        requests,
        wait_panel("wait-tools", times.by_tool, "Tool", "Time to decision per tool"),
        wait_panel(
            "wait-deciders", times.by_decider, "Decided by", "Time to decision per reviewer"
        ),
        backlog_panel(window, now),
    ]


def requests_panel(window: Window) -> Panel:
    tools = dashboard.approvals_by_tool(window)
    endings = [name for name in dashboard.ENDINGS if any(t.counts.get(name) for t in tools)]
    chart = charts.bar_chart(
        "requests",
        "Approval requests per tool",
        "Stacked bars: the approval requests of each tool made in the range, by how they ended.",
        [tool.tool for tool in tools],
        [
            charts.Series(
                ENDING_LABELS[name],
                [tool.counts.get(name, 0) for tool in tools],
                css=f"ending-{name}",
            )
            for name in endings
        ],
        x_label="Tool",
        y_label="Requests",
    )
    table = Table(
        "Approval requests per tool (rates: of the decided ones)",
        [
            "Tool",
            "Requests",
            *(ENDING_LABELS[name] for name in dashboard.ENDINGS),
            "Approval rate",
            "Rejection rate",
            "Expiry rate",
        ],
        [
            [
                Cell(tool.tool, tool.tool),
                count_cell(tool.requests),
                *(count_cell(tool.counts.get(name, 0)) for name in dashboard.ENDINGS),
                rate_cell(tool.rate("approved")),
                rate_cell(tool.rate("rejected")),
                rate_cell(tool.rate("expired")),
            ]
            for tool in tools
        ],
    )
    return Panel("requests", chart, table)


def wait_panel(name: str, rows: list[dashboard.WaitRow], who: str, title: str) -> Panel:
    """Time to decision, p50 and p95, per `who` (a tool, a reviewer)."""
    chart = charts.bar_chart(
        name,
        f"{title}: p50 and p95",
        f"Bars side by side: for the requests made in the range, the time from the request "
        f"to its decision that half and 95 % of them stayed within, per {who.lower()} "
        "(policies grouped as policy; expiry: nobody decided in time).",
        [row.key for row in rows],
        [
            charts.Series(f"p{p}", [row.percentiles[p] for row in rows], css=f"series-p{p}")
            for p in dashboard.DECISION_PERCENTILES
        ],
        x_label=who,
        y_label="Time to decision",
        stacked=False,
        text=formatting.duration,
        integer=False,
        seconds=True,
    )
    table = Table(
        title,
        [who, "Decisions", *(f"p{p}" for p in dashboard.DECISION_PERCENTILES)],
        [
            [
                Cell(row.key, row.key),
                count_cell(row.decisions),
                *(seconds_cell(row.percentiles[p]) for p in dashboard.DECISION_PERCENTILES),
            ]
            for row in rows
        ],
    )
    return Panel(name, chart, table)


def backlog_panel(window: Window, now: datetime | None = None) -> Panel:
    points = dashboard.backlog(window, now)
    hourly = window.hourly
    chart = charts.line_chart(
        "backlog",
        "Pending approval requests over time",
        "A line: how many requests were waiting for a decision at each "
        f"{'hour' if hourly else 'day'} boundary of the range (the last point: now, for a "
        "range that has not ended).",
        [_label(point.at, hourly) for point in points],
        [charts.Series("Pending", [point.pending for point in points], css="series-backlog")],
        x_label="Time (UTC)",
        y_label="Pending requests",
    )
    table = Table(
        "Pending approval requests over time",
        ["Time (UTC)", "Pending"],
        [
            [
                Cell(point.at.strftime("%Y-%m-%d %H:%M"), point.at.isoformat()),
                count_cell(point.pending),
            ]
            for point in points
        ],
    )
    return Panel("backlog", chart, table)


def may_add_prices(user: Any) -> bool:
    return bool(user.is_staff and user.has_perm("tracing.add_modelprice"))


def panels(window: Window, costs: CostCells, now: datetime | None = None) -> list[Panel]:
    """Every chart of the dashboard, in the page's order."""
    return [
        runs_panel(window),
        latency_panel(window),
        *usage_panels(window, costs),
        *approval_panels(window, now),
    ]


PANEL_BUILDERS: dict[str, Callable[[Window, CostCells], list[Panel]]] = {
    "runs": lambda window, costs: [runs_panel(window)],
    "latency": lambda window, costs: [latency_panel(window)],
    "tokens": usage_panels,
    "cost": usage_panels,
    "agents": usage_panels,
    "usage": usage_panels,
    "requests": lambda window, costs: approval_panels(window),
    "wait-tools": lambda window, costs: approval_panels(window),
    "wait-deciders": lambda window, costs: approval_panels(window),
    "backlog": lambda window, costs: approval_panels(window),
}
CHARTS = tuple(PANEL_BUILDERS)


# --- the view ---------------------------------------------------------------------------------


@require_GET
@login_required
@trace_viewer_required
def trace_dashboard(request: HttpRequest) -> HttpResponse:
    """Runs, latency, tokens and cost, approvals, for a range of days and an agent; each
    chart also as a table and as CSV."""
    form = DashboardForm(request.GET)
    if not form.is_valid():
        context = {"form": form, "agent_choices": agent_choices(), "panels": []}
        return render(request, "tracing/dashboard.html", context, status=400)
    window: Window = form.cleaned_data["window"]
    costs = CostCells(may_add_prices(request.user))
    if form.cleaned_data.get("format") == "csv":
        name = form.cleaned_data.get("chart") or ""
        if name not in PANEL_BUILDERS:
            return HttpResponse(
                f"Unknown chart {name!r}: one of {', '.join(CHARTS)}.",
                status=400,
                content_type="text/plain; charset=utf-8",
            )
        panel = next(p for p in PANEL_BUILDERS[name](window, costs) if p.name == name)
        return csv_response(panel.table, csv_filename(name, window))
    filters = form.filter_values()
    shown = panels(window, costs)
    for panel in shown:
        panel.csv_url = (
            reverse("trace_dashboard")
            + "?"
            + urlencode({**filters, "format": "csv", "chart": panel.name})
        )
    context = {
        "form": form,
        "window": window,
        "panels": shown,
        "agent_choices": agent_choices(),
        "traces_url": reverse("trace_list") + "?" + urlencode(filters),
        "per": "hour" if window.hourly else "day",
    }
    return render(request, "tracing/dashboard.html", context)


def csv_filename(name: str, window: Window) -> str:
    agent = f"-{_slug(window.agent)}" if window.agent else ""
    return f"dashboard-{name}-{window.since.isoformat()}-to-{window.until.isoformat()}{agent}.csv"


def _slug(text: str) -> str:
    kept = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in text)
    return kept.strip("-")[:40] or "agent"


# A spreadsheet reads a cell starting with these as a formula.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_value(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def csv_response(table: Table, filename: str) -> HttpResponse:
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = (
        content_disposition_header(as_attachment=True, filename=filename)
        or f'attachment; filename="{filename}"'
    )
    writer = csv.writer(response)
    writer.writerow([csv_value(column) for column in table.columns])
    for row in table.rows:
        writer.writerow([csv_value(cell.value) for cell in row])
    return response
