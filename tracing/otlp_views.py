"""A trace as OpenTelemetry has it: `/traces/<id>.otlp.json`, an OTLP/JSON
`ExportTraceServiceRequest` (`tracing.otlp`) of its stored spans, masked as stored, which a
collector accepts as it is (`curl -H 'Content-Type: application/json' --data-binary @file
http://collector:4318/v1/traces`). For operators, as the trace viewer."""

from __future__ import annotations

import json

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.utils.http import content_disposition_header
from django.views.decorators.http import require_GET

from tracing import otlp
from tracing.access import get_trace_for_viewer, trace_viewer_required
from tracing.models import Span


@require_GET
@login_required
@trace_viewer_required
def trace_export_otlp(request: HttpRequest, trace_id: str) -> HttpResponse:
    trace = get_trace_for_viewer(request, trace_id)
    spans = Span.objects.filter(trace_id=trace.trace_id).order_by("started_at", "pk")
    payload = otlp.export_request(
        spans.iterator(),
        {trace.trace_id: trace},
        service_name=settings.AGENTSITE_OTLP_SERVICE_NAME,
    )
    response = HttpResponse(
        json.dumps(payload, ensure_ascii=False, separators=(",", ":")),
        content_type="application/json",
    )
    response["Content-Disposition"] = content_disposition_header(
        as_attachment=True, filename=f"{trace.trace_id}.otlp.json"
    )
    return response
