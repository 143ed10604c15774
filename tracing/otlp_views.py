"""A trace as OpenTelemetry has it, for operators, as the trace viewer: an OTLP
`ExportTraceServiceRequest` of its stored spans (`tracing.otlp`, masked as stored, a call that
waited for a reviewer with the decision on it), which a collector or viewer accepts as it is:

- `/traces/<id>.otlp.pb`, protobuf (`curl -H 'Content-Type: application/x-protobuf'
  --data-binary @file http://collector:4318/v1/traces`; Arize Phoenix takes this one);
- `/traces/<id>.otlp.json`, OTLP/JSON (`-H 'Content-Type: application/json'`).
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.utils.http import content_disposition_header
from django.views.decorators.http import require_GET

from tracing import otlp
from tracing.access import get_trace_for_viewer, trace_viewer_required
from tracing.models import Span

PROTOBUF = "application/x-protobuf"


@require_GET
@login_required
@trace_viewer_required
def trace_export_otlp(request: HttpRequest, trace_id: str, encoding: str = "json") -> HttpResponse:
    trace = get_trace_for_viewer(request, trace_id)
    spans = Span.objects.filter(trace_id=trace.trace_id).order_by("started_at", "pk")
    project = settings.AGENTSITE_OTLP_SERVICE_NAME
    if encoding == "pb":
        body: bytes | str = otlp.protobuf_request(
            spans.iterator(), {trace.trace_id: trace}, project=project
        )
        content_type = PROTOBUF
    else:
        body = otlp.json_request(spans.iterator(), {trace.trace_id: trace}, project=project)
        content_type = "application/json"
    response = HttpResponse(body, content_type=content_type)
    response["Content-Disposition"] = content_disposition_header(
        as_attachment=True, filename=f"{trace.trace_id}.otlp.{encoding}"
    )
    return response
