"""What the model calls cost, for operators: per day, model, agent and user over a range of
days, and the models that have no price yet (each linked to the form that adds one).

Sums are read per (model, day[, key]) through the spans' `span_usage` index and priced in
Python by `tracing.pricing` (one query for the price table): a model without a price is never
counted as free; its tokens are listed under "Models without a price".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.decorators import login_required
from django.db.models import CharField, Count, F, QuerySet, Value
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from tracing import pricing
from tracing.access import trace_viewer_required
from tracing.forms import CostRangeForm
from tracing.models import Span
from tracing.pricing import Cost, PriceBook

TOP_USERS = 20


@dataclass
class CostLine:
    """A row of one of the page's tables: what its calls cost and how many tokens they used."""

    key: Any
    cost: Cost = field(default_factory=Cost)
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    shown: pricing.Shown | None = None

    def add(self, row: dict[str, Any], book: PriceBook) -> None:
        self.cost.add(book.row_cost(row))
        self.input_tokens += int(row["input_tokens"] or 0)
        self.cached_tokens += int(row["cached_tokens"] or 0)
        self.output_tokens += int(row["output_tokens"] or 0)
        self.total_tokens += int(row["total_tokens"] or 0)

    @property
    def rank(self) -> tuple[Any, int]:
        """Dearest first (all currencies' amounts together: a rough order), then tokens."""
        return (sum(self.cost.amounts.values()), self.total_tokens)


def spans_of_range(form: CostRangeForm) -> QuerySet[Span]:
    """The spans started in the form's days, with each one's user."""
    start, end = form.bounds
    # A model call's agent is on its span (`rows.trace_agent`: the run's agent, else the
    # trace's workflow name).
    return Span.objects.filter(started_at__gte=start, started_at__lt=end).annotate(
        user=Coalesce(
            F("trace__run__requested_by__username"),
            F("trace__run__conversation__owner__username"),
            Value(""),
            output_field=CharField(),
        ),
    )


def cost_lines(spans: QuerySet[Span], key: str, book: PriceBook, may_price: bool) -> list[CostLine]:
    """One line per value of `key` ("day", "model", or an annotation of `spans`)."""
    lines: dict[Any, CostLine] = {}
    keys = () if key in ("day", "model") else (key,)
    for row in pricing.usage_rows(spans, *keys):
        lines.setdefault(row[key], CostLine(row[key])).add(row, book)
    for line in lines.values():
        line.shown = pricing.shown(line.cost, links=may_price)
    return list(lines.values())


@require_GET
@login_required
@trace_viewer_required
def trace_costs(request: HttpRequest) -> HttpResponse:
    """Cost and tokens per day, model, agent and user over a range of days."""
    form = CostRangeForm(request.GET)
    if not form.is_valid():
        context = {
            "form": form,
            "since_value": request.GET.get("since", ""),
            "until_value": request.GET.get("until", ""),
        }
        return render(request, "tracing/costs.html", context, status=400)
    may_price = pricing.may_add_prices(request.user)
    book = PriceBook.load()
    spans = spans_of_range(form)
    # One query for day and model: both come from the (model, day) sums.
    by_model_day = pricing.usage_rows(spans)
    days: dict[Any, CostLine] = {}
    models: dict[str, CostLine] = {}
    total = CostLine("total")
    for row in by_model_day:
        days.setdefault(row["day"], CostLine(row["day"])).add(row, book)
        models.setdefault(row["model"], CostLine(row["model"])).add(row, book)
        total.add(row, book)
    agents = sorted(cost_lines(spans, "agent", book, may_price), key=lambda x: x.rank, reverse=True)
    users = cost_lines(spans, "user", book, may_price)
    users = sorted(users, key=lambda line: line.rank, reverse=True)[:TOP_USERS]
    for line in [*days.values(), *models.values(), total]:
        line.shown = pricing.shown(line.cost, links=may_price)

    unpriced = []
    missing = total.cost.missing
    if missing:
        calls = dict(
            pricing.model_calls(spans)
            .filter(model__in=missing)
            .order_by()
            .values("model")
            .annotate(calls=Count("pk"))
            .values_list("model", "calls")
        )
        for model in missing:
            line = models[model]
            unpriced.append(
                {
                    "model": model,
                    "calls": calls.get(model, 0),
                    "tokens": line.total_tokens,
                    "add_url": pricing.add_price_url(model) if may_price else "",
                }
            )
    context = {
        "form": form,
        "since": form.cleaned_data["since"],
        "until": form.cleaned_data["until"],
        "since_value": form.cleaned_data["since"].isoformat(),
        "until_value": form.cleaned_data["until"].isoformat(),
        "total": total,
        "days": [days[day] for day in sorted(days)],
        "models": sorted(models.values(), key=lambda line: line.rank, reverse=True),
        "agents": agents,
        "users": users,
        "top_users": TOP_USERS,
        "unpriced": unpriced,
        "may_price": may_price,
    }
    return render(request, "tracing/costs.html", context)
