from django.urls import path

from approvals import views

urlpatterns = [
    path("inbox/", views.inbox, name="inbox"),
    path("inbox/rows/", views.inbox_rows, name="inbox_rows"),
    path("inbox/history/", views.history, name="inbox_history"),
    path("inbox/decide/", views.bulk_decide, name="inbox_bulk_decide"),
    path("inbox/<int:pk>/", views.request_detail, name="inbox_request"),
    path("inbox/<int:pk>/decide/", views.decide_request, name="inbox_decide"),
]
