from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "demo"
    label = "demo"
    verbose_name = "Demo shop"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from engine import facts

        from .tools import order_facts

        # The inbox shows reviewers the order each of these calls would touch.
        for tool_name in ("lookup_order", "cancel_order", "issue_refund", "send_email"):
            facts.register(tool_name, order_facts)
