from django.urls import path

from common import converters  # noqa: F401  (registers <key:...>)
from tracing import (
    cost_views,
    dashboard_views,
    export_views,
    list_views,
    otlp_views,
    session_views,
    trace_views,
)

urlpatterns = [
    path("traces/", list_views.trace_list, name="trace_list"),
    path("traces/costs/", cost_views.trace_costs, name="trace_costs"),
    path("traces/dashboard/", dashboard_views.trace_dashboard, name="trace_dashboard"),
    path("traces/export.jsonl", export_views.trace_export_jsonl, name="trace_export_jsonl"),
    # Above `traces/<id>/`, which would take "conversations" for a trace id.
    path(
        "traces/conversations/",
        session_views.trace_conversations,
        name="trace_conversations",
    ),
    path(
        "traces/conversations/<key:session_id>/",
        session_views.trace_conversation,
        name="trace_conversation",
    ),
    # Before `.json`, which would take `trace_x.otlp` for the id.
    path(
        "traces/<key:trace_id>.otlp.json",
        otlp_views.trace_export_otlp,
        name="trace_export_otlp",
    ),
    path(
        "traces/<key:trace_id>.otlp.pb",
        otlp_views.trace_export_otlp,
        {"encoding": "pb"},
        name="trace_export_otlp_protobuf",
    ),
    path("traces/<key:trace_id>.json", trace_views.trace_export, name="trace_export"),
    path("traces/<key:trace_id>/", trace_views.trace_detail, name="trace_detail"),
    path("traces/<key:trace_id>/tree/", trace_views.trace_tree, name="trace_tree"),
    path("traces/<key:trace_id>/roots/", trace_views.trace_roots, name="trace_roots"),
    path(
        "traces/<key:trace_id>/tree/<key:span_id>/",
        trace_views.trace_subtree,
        name="trace_subtree",
    ),
    path("traces/<key:trace_id>/spans/<key:span_id>/", trace_views.span_detail, name="trace_span"),
]
