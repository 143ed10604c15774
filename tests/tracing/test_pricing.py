"""Model calls' usage as the exporter stores it, each trace's active time, and what calls cost
under the price table (`tracing.pricing`)."""

from __future__ import annotations

import importlib
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from agents.tracing import GenerationSpanData, ResponseSpanData, get_trace_provider
from django.apps import apps

from tests.migrations import latest, migrate
from tracing.exporter import DatabaseExporter
from tracing.models import ModelPrice, Span, Trace
from tracing.pricing import Cost, PriceBook, money, trace_costs, usage_rows
from tracing.rows import model_usage

pytestmark = pytest.mark.django_db(transaction=True)

DAY = date(2026, 11, 30)


def price(model: str, prompt: str, output: str, cached: str | None = None, **kw: Any) -> ModelPrice:
    return ModelPrice.objects.create(
        model=model,
        input_per_million=Decimal(prompt),
        output_per_million=Decimal(output),
        cached_input_per_million=None if cached is None else Decimal(cached),
        valid_from=kw.pop("valid_from", date(2026, 1, 1)),
        **kw,
    )


def test_it_stores_a_model_calls_model_and_its_three_token_counts() -> None:
    provider = get_trace_provider()
    trace = provider.create_trace(name="w")
    trace.start()
    usage = {
        "requests": 1,
        "input_tokens": 1000,
        "output_tokens": 50,
        "total_tokens": 1050,
        "input_tokens_details": {"cached_tokens": 400},
    }
    spans = []
    for data in (
        GenerationSpanData(input=[], output=[], model="gpt-4.1-mini", usage=usage),
        ResponseSpanData(usage={"input_tokens": 7, "output_tokens": 3}),
    ):
        span = provider.create_span(data, parent=trace)
        span.start()
        span.finish()
        spans.append(span)
    trace.finish()
    DatabaseExporter().export([trace, *spans])
    rows = {s.span_type: s for s in Span.objects.filter(trace_id=trace.trace_id)}
    generation = rows["generation"]
    assert (generation.model, generation.input_tokens, generation.cached_tokens) == (
        "gpt-4.1-mini",
        1000,
        400,
    )
    assert generation.output_tokens == 50 and generation.total_tokens == 1050
    # A response span without its model named is still a call, of an unknown model.
    assert rows["response"].model == "unknown model" and rows["response"].input_tokens == 7


def test_only_model_calls_have_a_model_and_bad_counts_are_zero() -> None:
    assert model_usage("function", {"usage": {"input_tokens": 5}}) == ("", 0, 0, 0)
    assert model_usage(
        "generation", {"model": "m", "usage": {"input_tokens": -3, "output_tokens": True}}
    ) == (
        "m",
        0,
        0,
        0,
    )
    # Cached tokens never exceed the input tokens.
    assert model_usage(
        "generation",
        {"model": "m", "usage": {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 9}}},
    ) == ("m", 5, 5, 0)


def test_active_time_is_the_root_spans_and_waiting_is_the_rest() -> None:
    """A run paused for an hour: two root task spans of 2 s and 3 s."""
    provider = get_trace_provider()
    trace = provider.create_trace(name="w")
    DatabaseExporter().export([trace])
    start = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    for offset, seconds, parent in ((0, 2, None), (3600, 3, None), (1, 0.5, "span_parent")):
        Span.objects.create(
            span_id=f"span_{offset}",
            trace_id=trace.trace_id,
            parent_id=parent,
            span_type="task",
            started_at=start + timedelta(seconds=offset),
            ended_at=start + timedelta(seconds=offset + seconds),
        )
    # One more span through the exporter makes it recompute the trace's times: a root
    # span too (its parent is the trace), of 1 s.
    span = provider.create_span(GenerationSpanData(model="m"), parent=trace)
    span.start()
    span.finish()
    span._started_at = (start + timedelta(seconds=3601)).isoformat()  # type: ignore[attr-defined]
    span._ended_at = (start + timedelta(seconds=3602)).isoformat()  # type: ignore[attr-defined]
    DatabaseExporter().export([span])
    row = Trace.objects.get(trace_id=trace.trace_id)
    assert row.active_seconds == pytest.approx(2 + 3 + 1, abs=0.01)
    assert row.duration_seconds == pytest.approx(3603.0, abs=0.01)


def test_a_priced_calls_cost_is_its_tokens_times_the_price() -> None:
    price("gpt-4.1-mini", "0.40", "1.60", cached="0.10")
    book = PriceBook.load()
    cost = book.cost("gpt-4.1-mini", DAY, 1_000_000, 400_000, 500_000)
    # 600k uncached × 0.40 + 400k cached × 0.10 + 500k × 1.60, per million
    assert cost.amounts == {"USD": Decimal("0.24") + Decimal("0.04") + Decimal("0.80")}
    assert cost.complete and cost.money() == "$1.08"


def test_an_unpriced_model_is_named_never_free() -> None:
    cost = PriceBook.load().cost("my-local-llm", DAY, 10, 0, 5)
    assert cost.amounts == {} and cost.missing == ["my-local-llm"]
    assert str(cost) == "no price for my-local-llm"
    # Summed with a priced call, the unpriced part still shows.
    price("m", "1", "1")
    total = Cost().add(cost).add(PriceBook.load().cost("m", DAY, 1_000_000, 0, 0))
    assert str(total) == "$1.00; no price for my-local-llm"


def test_the_exact_name_beats_a_pattern_the_longer_pattern_wins_and_dates_count() -> None:
    price("gpt-4.1*", "2", "8")
    price("gpt-4.1-mini*", "0.4", "1.6")
    price("gpt-4.1-mini-2025-04-14", "9", "9")
    price("gpt-4.1-mini-2025-04-14", "1", "1", valid_from=date(2026, 12, 1))
    book = PriceBook.load()
    assert book.price_for("gpt-4.1-nano", DAY).input_per_million == Decimal("2")
    assert book.price_for("gpt-4.1-mini-x", DAY).input_per_million == Decimal("0.4")
    assert book.price_for("gpt-4.1-mini-2025-04-14", DAY).input_per_million == Decimal("9")
    later = book.price_for("gpt-4.1-mini-2025-04-14", date(2026, 12, 2))
    assert later is not None and later.input_per_million == Decimal("1")
    # Before any price was valid, there is none.
    assert book.price_for("gpt-4.1-nano", date(2025, 1, 1)) is None


def test_currencies_are_kept_apart() -> None:
    price("a", "1", "0", currency="USD")
    price("b", "1", "0", currency="EUR")
    book = PriceBook.load()
    total = book.cost("a", DAY, 1_000_000, 0, 0).add(book.cost("b", DAY, 2_000_000, 0, 0))
    assert total.money() == "€2.00 + $1.00"


def test_money_shows_small_amounts_with_their_digits() -> None:
    assert money(Decimal("0.000123")) == "$0.000123"
    assert money(Decimal("0.0123")) == "$0.0123"
    assert money(Decimal("1234.5")) == "$1,234.50"
    assert money(Decimal("0")) == "$0.00"
    assert money(Decimal("2"), "CHF") == "2.00 CHF"


def test_the_seeded_table_prices_current_openai_models() -> None:
    # A transactional test's flush empties what migrations wrote: seed again, as the
    # migration does (it adds nothing twice).
    seeding = importlib.import_module("tracing.migrations.0003_seed_model_prices")
    seeding.seed(apps, None)
    seeding.seed(apps, None)
    assert ModelPrice.objects.count() == len(seeding.PRICES)
    book = PriceBook.load()
    for model in ("gpt-4.1-mini", "gpt-4o-mini-2024-07-18", "gpt-5", "o4-mini"):
        assert book.price_for(model, DAY) is not None, model
    assert book.price_for("offline-demo", DAY) is None


def test_trace_costs_sum_each_traces_calls_by_model_and_day() -> None:
    price("m", "1", "2")
    Trace.objects.create(trace_id="trace_a")
    Trace.objects.create(trace_id="trace_b")
    at = datetime(2026, 11, 30, 12, tzinfo=UTC)
    for n, (trace, model, tokens_in, tokens_out) in enumerate(
        [("trace_a", "m", 500_000, 0), ("trace_a", "m", 500_000, 1_000_000), ("trace_b", "x", 3, 4)]
    ):
        Span.objects.create(
            span_id=f"span_{n}",
            trace_id=trace,
            span_type="generation",
            started_at=at,
            model=model,
            input_tokens=tokens_in,
            output_tokens=tokens_out,
        )
    Span.objects.create(span_id="span_fn", trace_id="trace_a", span_type="function", started_at=at)
    costs = trace_costs(["trace_a", "trace_b"])
    assert costs["trace_a"].amounts == {"USD": Decimal(3)} and costs["trace_a"].complete
    assert costs["trace_b"].missing == ["x"]
    rows = usage_rows(Span.objects.all())
    assert len(rows) == 2  # the function span is no model call


def test_model_calls_stored_before_their_usage_columns_get_them_from_their_data() -> None:
    """Migration 0006: a site upgraded with traces already stored sees their cost."""
    migrate([("tracing", "0005_list_and_dashboard_indexes")])
    try:
        Trace.objects.create(trace_id="trace_old", metadata={"agent": "support"})
        usage = {
            "input_tokens": 900,
            "output_tokens": 40,
            "input_tokens_details": {"cached_tokens": 300},
        }
        Span.objects.create(
            span_id="span_old",
            trace_id="trace_old",
            span_type="generation",
            span_data={"type": "generation", "model": "gpt-4.1-mini", "usage": usage},
        )
        Span.objects.create(span_id="span_fn", trace_id="trace_old", span_type="function")
        migrate([("tracing", "0006_backfill_usage")])
    finally:
        latest()
    old = Span.objects.get(span_id="span_old")
    assert (old.model, old.input_tokens, old.cached_tokens, old.output_tokens, old.agent) == (
        "gpt-4.1-mini",
        900,
        300,
        40,
        "support",
    )
    assert Span.objects.get(span_id="span_fn").model == ""
