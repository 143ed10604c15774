"""A run's branch is a column of the run now (engine 0002 copied these rows into it): the
`RunBranch` table goes, and the turns' usage names the run where the engine keeps it (the
same table: no constraint is rewritten)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("conversations", "0004_branches"),
        ("engine", "0002_run_branch"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="turnusage",
                    name="run",
                    field=models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="turn_usage",
                        to="engine.agentrun",
                    ),
                ),
            ],
            database_operations=[],
        ),
        migrations.DeleteModel(name="RunBranch"),
    ]
