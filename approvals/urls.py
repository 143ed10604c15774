from django.urls import path

from approvals import policy_views, views

urlpatterns = [
    path("inbox/", views.inbox, name="inbox"),
    path("inbox/rows/", views.inbox_rows, name="inbox_rows"),
    path("inbox/history/", views.history, name="inbox_history"),
    path("inbox/decide/", views.bulk_decide, name="inbox_bulk_decide"),
    path("inbox/<int:pk>/", views.request_detail, name="inbox_request"),
    path("inbox/<int:pk>/decide/", views.decide_request, name="inbox_decide"),
    path("inbox/policies/", policy_views.policy_list, name="policies"),
    path("inbox/policies/new/", policy_views.policy_new, name="policy_new"),
    path("inbox/policies/<int:pk>/", policy_views.policy_edit, name="policy_edit"),
    path("inbox/policies/<int:pk>/toggle/", policy_views.policy_toggle, name="policy_toggle"),
    path("inbox/policies/<int:pk>/delete/", policy_views.policy_delete, name="policy_delete"),
]
