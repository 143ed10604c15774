"""A few current OpenAI prices (USD per million tokens, standard tier, from openai.com/api/pricing),
so that a new site's costs are right for the common models from the start. Operators keep the table
in admin; a model without a price shows "no price for <model>", never 0."""

from datetime import date
from decimal import Decimal

from django.db import migrations

SOURCE = "OpenAI API pricing, standard tier"
# model (or pattern), input, cached input, output, valid from
PRICES = [
    ("gpt-5", "1.25", "0.125", "10.00", date(2025, 8, 7)),
    ("gpt-5-*", "1.25", "0.125", "10.00", date(2025, 8, 7)),
    ("gpt-5-mini", "0.25", "0.025", "2.00", date(2025, 8, 7)),
    ("gpt-5-mini-*", "0.25", "0.025", "2.00", date(2025, 8, 7)),
    ("gpt-5-nano", "0.05", "0.005", "0.40", date(2025, 8, 7)),
    ("gpt-5-nano-*", "0.05", "0.005", "0.40", date(2025, 8, 7)),
    ("gpt-4.1", "2.00", "0.50", "8.00", date(2025, 4, 14)),
    ("gpt-4.1-*", "2.00", "0.50", "8.00", date(2025, 4, 14)),
    ("gpt-4.1-mini", "0.40", "0.10", "1.60", date(2025, 4, 14)),
    ("gpt-4.1-mini-*", "0.40", "0.10", "1.60", date(2025, 4, 14)),
    ("gpt-4.1-nano", "0.10", "0.025", "0.40", date(2025, 4, 14)),
    ("gpt-4.1-nano-*", "0.10", "0.025", "0.40", date(2025, 4, 14)),
    ("gpt-4o", "2.50", "1.25", "10.00", date(2024, 10, 1)),
    ("gpt-4o-2024-*", "2.50", "1.25", "10.00", date(2024, 10, 1)),
    ("gpt-4o-mini", "0.15", "0.075", "0.60", date(2024, 7, 18)),
    ("gpt-4o-mini-*", "0.15", "0.075", "0.60", date(2024, 7, 18)),
    ("o3", "2.00", "0.50", "8.00", date(2025, 6, 10)),
    ("o3-2025-*", "2.00", "0.50", "8.00", date(2025, 6, 10)),
    ("o4-mini", "1.10", "0.275", "4.40", date(2025, 4, 16)),
    ("o4-mini-*", "1.10", "0.275", "4.40", date(2025, 4, 16)),
]


def seed(apps, schema_editor):
    ModelPrice = apps.get_model("tracing", "ModelPrice")
    for model, prompt, cached, completion, valid_from in PRICES:
        ModelPrice.objects.get_or_create(
            model=model,
            valid_from=valid_from,
            defaults={
                "input_per_million": Decimal(prompt),
                "cached_input_per_million": Decimal(cached),
                "output_per_million": Decimal(completion),
                "currency": "USD",
                "note": SOURCE,
            },
        )


def unseed(apps, schema_editor):
    ModelPrice = apps.get_model("tracing", "ModelPrice")
    for model, _prompt, _cached, _completion, valid_from in PRICES:
        ModelPrice.objects.filter(model=model, valid_from=valid_from, note=SOURCE).delete()


class Migration(migrations.Migration):
    dependencies = [("tracing", "0002_usage_prices_feedback")]

    operations = [migrations.RunPython(seed, unseed)]
