# Standard Webhooks signing: an endpoint's secret keeps its value (an older one signs the older
# way too until it is rotated); a rotation's previous secret signs for an overlap.

from django.db import migrations, models

import webhooks.models


class Migration(migrations.Migration):
    dependencies = [
        ("webhooks", "0002_approval_escalated"),
    ]

    operations = [
        migrations.AddField(
            model_name="webhookendpoint",
            name="previous_secret",
            field=models.CharField(blank=True, default="", editable=False, max_length=100),
        ),
        migrations.AddField(
            model_name="webhookendpoint",
            name="previous_secret_until",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AlterField(
            model_name="webhookendpoint",
            name="secret",
            field=models.CharField(
                default=webhooks.models.new_secret,
                editable=False,
                help_text=(
                    "Signs every delivery (Standard Webhooks: the webhook-signature header); "
                    "rotate it in the list."
                ),
                max_length=100,
            ),
        ),
    ]
