"""The branch a run was started on becomes a column of the run (it was a row of
`conversations.RunBranch`, kept only for runs off "main", because the run lived in another
app): the rows are copied into the column, and conversations 0005 drops their table."""

from django.db import migrations, models
from django.db.models import OuterRef, Subquery


def copy_branches(apps, schema_editor):
    AgentRun = apps.get_model("engine", "AgentRun")
    RunBranch = apps.get_model("conversations", "RunBranch")
    db = schema_editor.connection.alias
    links = RunBranch.objects.using(db)
    AgentRun.objects.using(db).filter(pk__in=links.values("run_id")).update(
        branch=Subquery(links.filter(run_id=OuterRef("pk")).values("branch")[:1])
    )


def copy_branches_back(apps, schema_editor):
    AgentRun = apps.get_model("engine", "AgentRun")
    RunBranch = apps.get_model("conversations", "RunBranch")
    db = schema_editor.connection.alias
    off_main = AgentRun.objects.using(db).exclude(branch="main").values_list("pk", "branch")
    RunBranch.objects.using(db).bulk_create(
        [RunBranch(run_id=pk, branch=branch) for pk, branch in off_main.iterator()],
        batch_size=1000,
    )


class Migration(migrations.Migration):
    dependencies = [
        ("conversations", "0004_branches"),
        ("engine", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="agentrun",
            name="branch",
            field=models.CharField(default="main", max_length=100),
        ),
        migrations.RunPython(copy_branches, copy_branches_back),
    ]
