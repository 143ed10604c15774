from django.urls import path

from notifications import views

urlpatterns = [
    path("account/notifications/", views.notification_settings, name="notification_settings"),
    path("notifications/open/", views.open_link, name="notification_open"),
]
