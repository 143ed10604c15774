from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "demo"
    label = "demo"
    verbose_name = "Demo shop"
    default_auto_field = "django.db.models.BigAutoField"

    # What reviewers read about the demo's tools (risk, money, the orders a call would touch)
    # is declared beside each tool in tools.py (`engine.registry.review`).
