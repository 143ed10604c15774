from django.db import migrations, models


class Migration(migrations.Migration):
    """Rules may approve only calls whose facts show no warnings. The rules that exist keep
    approving as they did (False); a new rule requires it unless told otherwise (True)."""

    dependencies = [
        ("approvals", "0019_agent_span"),
    ]

    operations = [
        migrations.AddField(
            model_name="approvalpolicy",
            name="requires_no_warnings",
            field=models.BooleanField(default=False),
        ),
        migrations.AlterField(
            model_name="approvalpolicy",
            name="requires_no_warnings",
            field=models.BooleanField(
                default=True,
                help_text="For an approving rule. The facts are what reviewers read of what "
                "a call would touch (an order already cancelled, more than is left to refund): a "
                "call they warn about, or whose facts cannot be read, goes to a person instead.",
                verbose_name="approve only when the facts show no warnings",
            ),
        ),
    ]
