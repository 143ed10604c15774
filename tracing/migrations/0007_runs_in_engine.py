"""Traces and feedback name the run where the engine keeps it now (engine 0001): the same
table, so in the state alone."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("engine", "0001_initial"),
        ("tracing", "0006_backfill_usage"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="feedback",
                    name="run",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="feedback",
                        to="engine.agentrun",
                    ),
                ),
                migrations.AlterField(
                    model_name="trace",
                    name="run",
                    field=models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="traces",
                        to="engine.agentrun",
                    ),
                ),
            ],
            database_operations=[],
        ),
    ]
