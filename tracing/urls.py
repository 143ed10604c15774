from django.urls import path

from tracing import views

urlpatterns = [
    path("traces/", views.trace_list, name="trace_list"),
    path("traces/<str:trace_id>.json", views.trace_export, name="trace_export"),
    path("traces/<str:trace_id>/", views.trace_detail, name="trace_detail"),
    path("traces/<str:trace_id>/tree/", views.trace_tree, name="trace_tree"),
    path("traces/<str:trace_id>/spans/<str:span_id>/", views.span_detail, name="trace_span"),
]
