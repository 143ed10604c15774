"""What model calls cost: the price table (`ModelPrice`, kept in admin) applied to the usage the
exporter stored on each generation and response span (`Span.model`, `input_tokens`,
`cached_tokens`, `output_tokens`).

Costs are computed when they are read, never stored: a price added or corrected today applies to
yesterday's calls too, and a model with no price is named ("no price for <model>") rather than
counted as free. Sums go by (model, day) in SQL (the `span_usage` index), prices apply in Python:
a site has a handful of models, so a month of a busy site is a few hundred rows here.

A call's cost: (input - cached) × input price + cached × cached-input price (the input price
when blank) + output × output price, per million tokens, in the price's currency. Amounts in
different currencies are kept apart, never added.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.db.models import QuerySet, Sum
from django.urls import reverse

from agentsite.db.functions import UTCPeriod
from tracing.models import ModelPrice, Span

MILLION = Decimal(1_000_000)
SYMBOLS = {"USD": "$", "EUR": "€", "GBP": "£", "JPY": "¥"}


@dataclass
class Cost:
    """Money by currency, and the models whose calls could not be priced (with their tokens,
    so that "no price for X" can say how much is unpriced)."""

    amounts: dict[str, Decimal] = field(default_factory=dict)
    unpriced: dict[str, int] = field(default_factory=dict)  # model -> its calls' tokens
    calls: int = 0  # usage rows priced or not (0: nothing to price)

    def add(self, other: Cost) -> Cost:
        for currency, amount in other.amounts.items():
            self.amounts[currency] = self.amounts.get(currency, Decimal(0)) + amount
        for model, tokens in other.unpriced.items():
            self.unpriced[model] = self.unpriced.get(model, 0) + tokens
        self.calls += other.calls
        return self

    @property
    def complete(self) -> bool:
        """Every call it covers had a price."""
        return not self.unpriced

    @property
    def missing(self) -> list[str]:
        return sorted(self.unpriced)

    def amount(self, currency: str = "USD") -> Decimal:
        return self.amounts.get(currency, Decimal(0))

    def money(self) -> str:
        """The priced part, e.g. "$0.0123" or "$1.20 + €0.50"; "" if nothing was priced."""
        return " + ".join(
            money(amount, currency) for currency, amount in sorted(self.amounts.items())
        )

    def __str__(self) -> str:
        """For text (CSV, logs): the money, and the models without a price."""
        parts = [self.money()] if self.amounts else []
        parts += [f"no price for {model}" for model in self.missing]
        return "; ".join(parts) if parts else "—"


def money(amount: Decimal, currency: str = "USD") -> str:
    """An amount for people: cents for a dollar or more, more digits for small amounts (a call
    costs fractions of a cent), exactly 0 as 0.00."""
    magnitude = abs(amount)
    if magnitude == 0 or magnitude >= 1:
        text = f"{amount:,.2f}"
    elif magnitude >= Decimal("0.01"):
        text = f"{amount:.4f}"
    else:
        text = f"{amount:.6f}"
    symbol = SYMBOLS.get(currency)
    return f"{symbol}{text}" if symbol else f"{text} {currency}"


def add_price_url(model: str) -> str:
    """The admin's form for a new price, with the model's name filled in."""
    return reverse("admin:tracing_modelprice_add") + "?" + urlencode({"model": model})


ADD_PRICE_PERMISSION = "tracing.add_modelprice"


def may_add_prices(user: Any) -> bool:
    """Who sees "no price for X" as a link to add the price: staff allowed to add one."""
    return bool(user.is_staff and user.has_perm(ADD_PRICE_PERMISSION))


@dataclass
class Shown:
    """A cost as every page shows it (`tracing/_cost.html`): the money of the priced calls,
    then "no price for <model>" for each model without a price, linked to the form that adds
    it for people who may; never a cost of 0 for calls nobody priced."""

    money: str
    missing: list[tuple[str, str]]  # (model, the add form's URL, or "")
    calls: int

    @property
    def empty(self) -> bool:
        """No model call at all: nothing to price."""
        return not self.calls

    def __str__(self) -> str:
        parts = [self.money] if self.money else []
        parts += [f"no price for {model}" for model, _ in self.missing]
        return "; ".join(parts) if parts else "—"


def shown(cost: Cost | None, *, links: bool) -> Shown:
    """`cost` for people; `links` (see `may_add_prices`): link each unpriced model to the
    admin's form for its price."""
    if cost is None:
        return Shown("", [], 0)
    missing = [(model, add_price_url(model) if links else "") for model in cost.missing]
    return Shown(cost.money(), missing, cost.calls)


class PriceBook:
    """The price table, read once (one query) and applied to many calls."""

    def __init__(self, prices: Iterable[ModelPrice]) -> None:
        exact: dict[str, list[ModelPrice]] = {}
        patterns: list[tuple[str, list[ModelPrice]]] = []
        by_pattern: dict[str, list[ModelPrice]] = {}
        for price in prices:
            name = price.model.strip()
            target = by_pattern if "*" in name or "?" in name else exact
            target.setdefault(name, []).append(price)
        for book in (exact, by_pattern):
            for rows in book.values():
                rows.sort(key=lambda row: row.valid_from, reverse=True)
        # The longer pattern is the more specific one.
        patterns = sorted(by_pattern.items(), key=lambda item: (-len(item[0]), item[0]))
        self._exact = exact
        self._patterns = patterns
        self._cache: dict[tuple[str, date], ModelPrice | None] = {}

    @classmethod
    def load(cls) -> PriceBook:
        return cls(ModelPrice.objects.all())

    def price_for(self, model: str, day: date) -> ModelPrice | None:
        """The price of `model` on `day`: the exact name's, else the longest matching
        pattern's, the latest valid on that day; None if there is none."""
        key = (model, day)
        if key not in self._cache:
            self._cache[key] = self._find(model, day)
        return self._cache[key]

    def _find(self, model: str, day: date) -> ModelPrice | None:
        candidates = [self._exact.get(model, [])]
        candidates += [
            rows for pattern, rows in self._patterns if fnmatch.fnmatchcase(model, pattern)
        ]
        for rows in candidates:
            for row in rows:
                if row.valid_from <= day:
                    return row
        return None

    def cost(
        self, model: str, day: date, input_tokens: int, cached_tokens: int, output_tokens: int
    ) -> Cost:
        """What one call (or a sum of calls of one model on one day) cost."""
        cost = Cost(calls=1)
        price = self.price_for(model, day)
        if price is None:
            cost.unpriced[model or "an unnamed model"] = input_tokens + output_tokens
            return cost
        cached = min(max(cached_tokens, 0), input_tokens)
        cached_price = (
            price.cached_input_per_million
            if price.cached_input_per_million is not None
            else price.input_per_million
        )
        amount = (
            Decimal(input_tokens - cached) * price.input_per_million
            + Decimal(cached) * cached_price
            + Decimal(output_tokens) * price.output_per_million
        ) / MILLION
        cost.amounts[price.currency] = amount
        return cost

    def row_cost(self, row: Mapping[str, Any]) -> Cost:
        """The cost of a row of `usage_rows`."""
        return self.cost(
            row["model"],
            _as_date(row["day"]),
            int(row["input_tokens"] or 0),
            int(row["cached_tokens"] or 0),
            int(row["output_tokens"] or 0),
        )

    def span_cost(self, span: Span) -> Cost | None:
        """One span's cost; None for a span that is no model call."""
        if not span.model or span.started_at is None:
            return None
        return self.cost(
            span.model,
            span.started_at.date(),
            span.input_tokens,
            span.cached_tokens,
            span.output_tokens,
        )


def model_calls(spans: QuerySet[Span] | None = None) -> QuerySet[Span]:
    """The spans that are model calls (a model named), through the `span_usage` index."""
    spans = Span.objects.all() if spans is None else spans
    return spans.exclude(model="")


def usage_rows(spans: QuerySet[Span], *keys: str) -> list[dict[str, Any]]:
    """Token sums of the model calls among `spans`, grouped by model, day (UTC) and `keys`
    (e.g. "trace_id", "trace__run__agent_name"): rows for `PriceBook.row_cost`, each
    row's "day" a date. (The day is read as text from the UTC timestamp, `UTCPeriod`:
    Django's TruncDate is a Python function called per row on SQLite.)"""
    rows = list(
        model_calls(spans)
        .order_by()
        .annotate(day=UTCPeriod("started_at", hourly=False))
        .values("model", "day", *keys)
        .annotate(
            input_tokens=Sum("input_tokens"),
            cached_tokens=Sum("cached_tokens"),
            output_tokens=Sum("output_tokens"),
            total_tokens=Sum("total_tokens"),
        )
    )
    for row in rows:
        row["day"] = _as_date(row["day"])
    return rows


def costs_by(spans: QuerySet[Span], key: str, book: PriceBook | None = None) -> dict[Any, Cost]:
    """The cost of the model calls among `spans`, per value of `key` (a field path)."""
    book = book or PriceBook.load()
    costs: dict[Any, Cost] = {}
    for row in usage_rows(spans, key):
        costs.setdefault(row[key], Cost()).add(book.row_cost(row))
    return costs


def trace_costs(trace_ids: Iterable[str], book: PriceBook | None = None) -> dict[str, Cost]:
    """Each trace's cost, in one query over the spans' (trace, started_at) index."""
    ids = list(trace_ids)
    if not ids:
        return {}
    return costs_by(Span.objects.filter(trace_id__in=ids), "trace_id", book)


def total_cost(spans: QuerySet[Span], book: PriceBook | None = None) -> Cost:
    book = book or PriceBook.load()
    cost = Cost()
    for row in usage_rows(spans):
        cost.add(book.row_cost(row))
    return cost


def _as_date(value: Any) -> date:
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    return date.fromisoformat(str(value)[:10])
