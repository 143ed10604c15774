from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks


class TracingConfig(AppConfig):
    name = "tracing"
    verbose_name = "Traces"

    def ready(self) -> None:
        checks.register(check_redact_patterns)
        if settings.AGENTSITE_TRACING:
            from tracing import exporter

            exporter.install()


def check_redact_patterns(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from tracing.redaction import invalid_patterns

    return [
        checks.Error(
            f"AGENTSITE_TRACE_REDACT_PATTERNS: {source!r} is not a regular expression ({reason}).",
            hint="Give a JSON list when a pattern contains a comma.",
            id="tracing.E001",
        )
        for source, reason in invalid_patterns(settings.AGENTSITE_TRACE_REDACT_PATTERNS)
    ]
