from django.urls import path

from common import converters  # noqa: F401  (registers <key:...>)
from tracing import dashboard_views, views

urlpatterns = [
    path("traces/", views.trace_list, name="trace_list"),
    path("traces/dashboard/", dashboard_views.trace_dashboard, name="trace_dashboard"),
    path("traces/<key:trace_id>.json", views.trace_export, name="trace_export"),
    path("traces/<key:trace_id>/", views.trace_detail, name="trace_detail"),
    path("traces/<key:trace_id>/tree/", views.trace_tree, name="trace_tree"),
    path("traces/<key:trace_id>/spans/<key:span_id>/", views.span_detail, name="trace_span"),
]
