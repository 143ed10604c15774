"""The run's rows are the engine's now (engine 0001 made them there, on the same tables):
requests name the run there, and approvals' state lets them go. Nothing in the database
changes."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0016_filter_choices_index"),
        ("conversations", "0005_run_branch_on_the_run"),
        ("engine", "0002_run_branch"),
        ("tracing", "0007_runs_in_engine"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="approvalrequest",
                    name="run",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="approval_requests",
                        to="engine.agentrun",
                    ),
                ),
                migrations.DeleteModel(name="ConsumedState"),
                migrations.DeleteModel(name="AgentRun"),
                migrations.DeleteModel(name="ServerProcess"),
            ],
            database_operations=[],
        ),
    ]
