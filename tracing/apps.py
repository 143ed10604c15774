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
        checks.register(check_otlp_destination)
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


def check_otlp_destination(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """An OTLP endpoint at an address the site does not send to (a literal private one; a
    name is checked at each send) is said at start-up, not only in the log of each batch."""
    from common import destinations

    endpoint = settings.AGENTSITE_OTLP_ENDPOINT
    refused = endpoint and destinations.refusal_for_url(endpoint, resolving=False)
    if not refused:
        return []
    return [
        checks.Warning(
            f"AGENTSITE_OTLP_ENDPOINT: {refused}",
            hint="Add its host to AGENTSITE_OUTBOUND_ALLOWED_HOSTS to forward spans there.",
            id="tracing.W002",
        )
    ]
