from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView


class Favicon(RedirectView):
    """`/favicon.ico`: the site's icon, wherever static files are (its name is hashed once
    collected, so the redirect is not permanent)."""

    def get_redirect_url(self, *args: object, **kwargs: object) -> str:
        return static("agentsite/favicon.svg")


admin.site.site_header = "agentsite administration"
admin.site.site_title = "agentsite admin"
# No menu of every model beside each admin page: it took 300 px of a laptop's 1366, and the
# request list's columns then no longer fitted (the index and the breadcrumbs lead everywhere).
admin.site.enable_nav_sidebar = False

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    # Pages name their icon (base.html); a client that asks the old way is sent to it.
    path("favicon.ico", Favicon.as_view()),
    path("", include("conversations.urls")),
    path("", include("approvals.urls")),
    path("", include("tracing.urls")),
    path("", include("api.urls")),
    path("", include("notifications.urls")),
]
