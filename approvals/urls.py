from django.urls import path

from approvals import views

urlpatterns = [
    path("inbox/", views.inbox, name="inbox"),
]
