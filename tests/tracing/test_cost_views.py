"""The cost page (per day, model, agent and user, the models without a price) and the price
table in admin (its list, its validation, the add form filled in from "no price for X")."""

from __future__ import annotations

import re
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from tests.factories import T0, grant, make_staff, make_viewer
from tests.tracing.test_list_views import PRICED, UNPRICED, priced, traced_run
from tracing import cost_views
from tracing.forms import CostRangeForm
from tracing.models import ModelPrice, Span, Trace, TraceOutcome

pytestmark = pytest.mark.django_db


def section(html: str, table_id: str) -> str:
    part = html[html.index(f'id="{table_id}"') :]
    return part[: part.index("</table>")]


@pytest.fixture
def seeded() -> dict[str, Any]:
    """Two days of calls: alice's on the priced model (day one and two), bruno's on a model
    without a price (day two), one of them by the billing agent."""
    priced()
    day_one = T0 - timedelta(days=1)
    traces = {
        "alice_1": traced_run(
            TraceOutcome.COMPLETED,
            username="alice",
            started_at=day_one,
            usage=(1_000_000, 200_000, 100_000),
        ),
        "alice_2": traced_run(
            TraceOutcome.COMPLETED, username="alice", started_at=T0, usage=(500_000, 0, 250_000)
        ),
        "bruno": traced_run(
            TraceOutcome.FAILED,
            username="bruno",
            started_at=T0,
            model=UNPRICED,
            usage=(3_000, 0, 700),
        ),  # fmt: skip
    }
    run = traces["alice_2"].run
    assert run is not None
    type(run).objects.filter(pk=run.pk).update(agent_name="billing")
    Trace.objects.filter(pk=traces["alice_2"].pk).update(metadata={"agent": "billing"})
    Span.objects.filter(trace_id=traces["alice_2"].trace_id).exclude(model="").update(
        agent="billing"
    )
    return traces


def costs_page(client: Client, **query: str) -> Any:
    query.setdefault("since", "2026-11-01")
    query.setdefault("until", "2026-11-30")
    return client.get(reverse("trace_costs"), query)


def test_cost_is_tokens_times_price_per_day_model_agent_and_user(
    client: Client, seeded: dict[str, Any]
) -> None:
    client.force_login(make_viewer())
    response = costs_page(client)
    assert response.status_code == 200
    html = response.content.decode()
    # Day one: 800k × $1 + 200k × $0.50 + 100k × $4 = $1.30 (per million);
    # day two: 500k × $1 + 250k × $4 = $1.50, and the unpriced model's calls.
    context = response.context
    [one, two] = context["days"]
    assert (one.key, two.key) == (date(2026, 11, 29), date(2026, 11, 30))
    assert one.cost.amounts == {"USD": Decimal("1.3")}
    assert two.cost.amounts == {"USD": Decimal("1.5")} and two.cost.missing == [UNPRICED]
    assert context["total"].cost.amount() == Decimal("2.8")
    day_rows = section(html, "cost-by-day")
    assert "$1.30" in day_rows and "$1.50" in day_rows
    assert f"no price for {UNPRICED}" in day_rows and "$0.00" not in html

    models = section(html, "cost-by-model")
    assert re.search(rf"{PRICED}</td><td class=\"num\">1,850,000</td>.*\$2\.80", models)
    assert re.search(rf"{UNPRICED}</td><td class=\"num\">3,700</td>.*no price for", models)

    agents = {line.key: line for line in context["agents"]}
    assert agents["support"].cost.amounts == {"USD": Decimal("1.3")}
    assert agents["support"].cost.missing == [UNPRICED]
    assert agents["billing"].cost.amounts == {"USD": Decimal("1.5")}
    assert 'href="/traces/?agent=billing"' in section(html, "cost-by-agent")

    users = [line.key for line in context["users"]]
    assert users == ["alice", "bruno"]  # dearest first
    assert context["users"][0].cost.amount() == Decimal("2.8")
    assert 'href="/traces/?user=bruno"' in section(html, "cost-by-user")


def test_models_without_a_price_are_listed_with_their_calls_tokens_and_a_link(
    client: Client, seeded: dict[str, Any]
) -> None:
    client.force_login(make_viewer())
    html = costs_page(client).content.decode()
    unpriced = section(html, "unpriced-models")
    assert f'<td class="mono">{UNPRICED}</td><td class="num">1</td><td class="num">3,700</td>' in (
        unpriced
    )
    assert PRICED not in unpriced
    # olga may not add prices: the words, no link.
    assert "admin/tracing/modelprice/add" not in unpriced

    client.force_login(grant(make_staff("pam"), "tracing.add_modelprice"))
    unpriced = section(costs_page(client).content.decode(), "unpriced-models")
    add = reverse("admin:tracing_modelprice_add") + f"?model={UNPRICED}"
    assert f'<a href="{add}">Add a price for {UNPRICED}</a>' in unpriced

    # Priced now: past calls are priced too, and nothing is listed.
    ModelPrice.objects.create(
        model="mystery-*",
        input_per_million=Decimal("10"),
        output_per_million=Decimal("10"),
        valid_from=date(2026, 1, 1),
    )
    response = costs_page(client)
    assert "unpriced-models" not in response.content.decode()
    assert response.context["total"].cost.amount() == Decimal("2.8") + Decimal("0.037")


def test_the_range_defaults_to_the_last_30_days_and_bounds_the_calls(
    client: Client, seeded: dict[str, Any], settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.force_login(make_viewer())
    monkeypatch.setattr("django.utils.timezone.localdate", lambda *a, **k: date(2026, 12, 28))
    response = client.get(reverse("trace_costs"))
    assert response.status_code == 200
    assert (response.context["since"], response.context["until"]) == (
        date(2026, 11, 29),
        date(2026, 12, 28),
    )
    assert len(response.context["days"]) == 2
    response = costs_page(client, since="2026-11-30", until="2026-11-30")
    assert [line.key for line in response.context["days"]] == [date(2026, 11, 30)]
    empty = costs_page(client, since="2026-10-01", until="2026-10-31")
    assert "No model calls in these days." in empty.content.decode()
    for query, message in [
        ({"since": "2026-11-30", "until": "2026-11-01"}, "ends before it starts"),
        ({"since": "2020-01-01", "until": "2026-11-01"}, f"at most {CostRangeForm.MAX_DAYS} days"),
        ({"since": "soon"}, "Enter a valid date"),
    ]:
        response = client.get(reverse("trace_costs"), query)
        assert response.status_code == 400 and message in response.content.decode(), query


def test_the_page_reads_a_few_queries_whatever_the_number_of_users(
    client: Client, seeded: dict[str, Any], django_assert_max_num_queries: Any
) -> None:
    client.force_login(make_viewer())
    for n in range(25):
        traced_run(TraceOutcome.COMPLETED, username=f"user_{n}", started_at=T0)
    # session, user, prices, (model, day), agents, users, unpriced calls, + permission checks
    with django_assert_max_num_queries(10):
        response = costs_page(client)
    assert len(response.context["users"]) == cost_views.TOP_USERS


# --- the price table in admin ---------------------------------------------------------------


def test_the_admin_lists_prices_and_fills_the_add_form_from_the_link(
    client: Client, admin: Any
) -> None:
    client.force_login(admin)
    priced()
    html = client.get(reverse("admin:tracing_modelprice_changelist")).content.decode()
    assert PRICED in html and "4.0000" in html and "USD" in html
    add = client.get(reverse("admin:tracing_modelprice_add"), {"model": UNPRICED})
    assert add.status_code == 200
    assert add.context["adminform"].form.initial["model"] == UNPRICED
    assert f'value="{UNPRICED}"' in add.content.decode()


def post_price(client: Client, **fields: str) -> Any:
    data = {
        "model": "new-model",
        "input_per_million": "1.5",
        "cached_input_per_million": "",
        "output_per_million": "6",
        "currency": "USD",
        "valid_from": "2026-11-01",
        "note": "",
    }
    data.update(fields)
    return client.post(reverse("admin:tracing_modelprice_add"), data)


def test_the_admin_refuses_negative_prices_bad_currencies_and_blank_models(
    client: Client, admin: Any
) -> None:
    client.force_login(admin)
    for fields, message in [
        ({"input_per_million": "-1"}, "A price cannot be negative."),
        ({"cached_input_per_million": "-0.01"}, "A price cannot be negative."),
        ({"output_per_million": "-5"}, "A price cannot be negative."),
        ({"currency": "US"}, "Three letters"),
        ({"currency": "U$D"}, "Three letters"),
        ({"model": "   "}, "This field is required"),
    ]:
        response = post_price(client, **fields)
        assert response.status_code == 200, fields  # the form again, with its errors
        assert message in response.content.decode(), fields
    assert not ModelPrice.objects.filter(model="new-model").exists()
    response = post_price(client, currency="eur", model="  new-model ")
    assert response.status_code == 302
    saved = ModelPrice.objects.get(model="new-model")
    assert (saved.currency, saved.input_per_million) == ("EUR", Decimal("1.5"))


def test_the_trace_admin_shows_outcome_and_cost(client: Client, admin: Any) -> None:
    client.force_login(admin)
    priced()
    trace = traced_run(TraceOutcome.REJECTED, usage=(1_000_000, 0, 0))
    other = traced_run(TraceOutcome.COMPLETED, model=UNPRICED)
    html = client.get(reverse("admin:tracing_trace_changelist")).content.decode()
    assert "Completed, a call rejected" in html
    assert "$1.00" in html and f"no price for {UNPRICED}" in html
    detail = client.get(reverse("admin:tracing_trace_change", args=[trace.pk])).content.decode()
    assert "$1.00" in detail and "Completed, a call rejected" in detail
    detail = client.get(reverse("admin:tracing_trace_change", args=[other.pk])).content.decode()
    add = reverse("admin:tracing_modelprice_add") + f"?model={UNPRICED}"
    assert f'<a href="{add}">no price for {UNPRICED}</a>' in detail
