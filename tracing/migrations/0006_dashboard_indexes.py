"""The dashboard's indexes: its range queries read them alone (bench/dashboard.py).

`span_usage` is made again with the calls' trace and tokens (the same model calls by time): one
index entry per model call, as before, so the exporter writes no more rows than it did.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("tracing", "0004_trace_outcome")]

    operations = [
        migrations.RemoveIndex(model_name="span", name="span_usage"),
        migrations.AddIndex(
            model_name="span",
            index=models.Index(
                condition=models.Q(("model", ""), _negated=True),
                fields=[
                    "started_at",
                    "model",
                    "trace",
                    "input_tokens",
                    "cached_tokens",
                    "output_tokens",
                    "total_tokens",
                ],
                name="span_usage",
            ),
        ),
        migrations.AddIndex(
            model_name="trace",
            index=models.Index(
                fields=["started_at", "outcome", "status", "active_seconds"],
                name="trace_dashboard",
            ),
        ),
    ]
