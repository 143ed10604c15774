"""The run's rows move from approvals to the engine, in the state alone: their tables keep
their names (`approvals_agentrun`, `approvals_consumedstate`, `approvals_serverprocess`), so no
table is rewritten, and runs that wait for a decision across the upgrade resume after it.
approvals 0017 takes them out of approvals' state once every foreign key points here. Their
content types move with them, and so do the permissions people were given on them."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

import agentsite.db.faithful

MOVED = ("agentrun", "consumedstate", "serverprocess")


def move_content_types(apps, schema_editor, source="approvals", target="engine"):
    ContentType = apps.get_model("contenttypes", "ContentType")
    db = schema_editor.connection.alias
    for model in MOVED:
        if ContentType.objects.using(db).filter(app_label=target, model=model).exists():
            continue  # made already (a database migrated with both): leave both as they are
        ContentType.objects.using(db).filter(app_label=source, model=model).update(app_label=target)


def move_content_types_back(apps, schema_editor):
    move_content_types(apps, schema_editor, source="engine", target="approvals")


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("approvals", "0016_filter_choices_index"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("conversations", "0004_branches"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="ServerProcess",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "identity",
                            models.CharField(
                                help_text="kind:host:pid:random token, as runs name it.",
                                max_length=160,
                                unique=True,
                            ),
                        ),
                        (
                            "kind",
                            models.CharField(
                                choices=[
                                    ("web", "Web server"),
                                    ("worker", "Task worker"),
                                    ("command", "Management command"),
                                ],
                                max_length=20,
                            ),
                        ),
                        ("host", models.CharField(max_length=100)),
                        ("pid", models.PositiveIntegerField()),
                        ("started", models.DateTimeField()),
                        ("beat", models.DateTimeField(help_text="Its last heartbeat.")),
                        (
                            "stopped",
                            models.DateTimeField(
                                blank=True, help_text="Set on a clean stop.", null=True
                            ),
                        ),
                    ],
                    options={
                        "verbose_name_plural": "server processes",
                        "db_table": "approvals_serverprocess",
                        "ordering": ["-started"],
                    },
                ),
                migrations.CreateModel(
                    name="AgentRun",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("agent_name", models.CharField(max_length=100)),
                        (
                            "input",
                            models.TextField(help_text="What the user wrote to start this run."),
                        ),
                        (
                            "status",
                            models.CharField(
                                choices=[
                                    ("queued", "Queued"),
                                    ("running", "Running"),
                                    ("waiting", "Waiting for approval"),
                                    ("resuming", "Resuming"),
                                    ("completed", "Completed"),
                                    ("failed", "Failed"),
                                    ("cancelled", "Cancelled"),
                                    ("guardrail", "Stopped by a guardrail"),
                                ],
                                db_index=True,
                                default="queued",
                                max_length=20,
                            ),
                        ),
                        (
                            "state",
                            agentsite.db.faithful.FaithfulJSONField(
                                blank=True, editable=False, null=True
                            ),
                        ),
                        (
                            "state_signature",
                            models.CharField(blank=True, editable=False, max_length=64),
                        ),
                        ("state_consumed", models.BooleanField(default=False)),
                        ("pause_count", models.PositiveIntegerField(default=0)),
                        ("sdk_version", models.CharField(blank=True, max_length=40)),
                        ("state_schema_version", models.CharField(blank=True, max_length=20)),
                        ("agent_fingerprint", models.CharField(blank=True, max_length=64)),
                        ("trace_id", models.CharField(blank=True, db_index=True, max_length=64)),
                        ("final_output", models.TextField(blank=True)),
                        (
                            "streamed_text",
                            models.TextField(
                                blank=True,
                                editable=False,
                                help_text="What the agent has written so far while it streams, so a reload shows it.",
                            ),
                        ),
                        ("usage", models.JSONField(blank=True, default=dict)),
                        ("error", models.TextField(blank=True)),
                        ("error_detail", models.JSONField(blank=True, default=dict)),
                        ("created", models.DateTimeField(auto_now_add=True)),
                        ("updated", models.DateTimeField(auto_now=True)),
                        ("finished", models.DateTimeField(blank=True, null=True)),
                        ("process", models.CharField(blank=True, default="", max_length=160)),
                        (
                            "stop_requested",
                            models.DateTimeField(blank=True, editable=False, null=True),
                        ),
                        (
                            "conversation",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="runs",
                                to="conversations.conversation",
                            ),
                        ),
                        (
                            "requested_by",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="agent_runs",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={
                        "db_table": "approvals_agentrun",
                        "ordering": ["-created"],
                    },
                ),
                migrations.CreateModel(
                    name="ConsumedState",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "pause",
                            models.PositiveIntegerField(
                                help_text="Which pause of the run the state was saved at."
                            ),
                        ),
                        (
                            "nonce",
                            models.CharField(
                                blank=True,
                                help_text="The nonce signed into that state; empty for states saved without one.",
                                max_length=64,
                            ),
                        ),
                        ("created", models.DateTimeField(auto_now_add=True)),
                        (
                            "run",
                            models.ForeignKey(
                                db_index=False,
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="consumed_states",
                                to="engine.agentrun",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "approvals_consumedstate",
                        "ordering": ["run", "pause"],
                    },
                ),
                migrations.AddIndex(
                    model_name="agentrun",
                    index=models.Index(
                        fields=["conversation", "-created"], name="run_conv_created"
                    ),
                ),
                migrations.AddConstraint(
                    model_name="consumedstate",
                    constraint=models.UniqueConstraint(
                        fields=("run", "pause"), name="consumed_state_once"
                    ),
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(move_content_types, move_content_types_back),
    ]
