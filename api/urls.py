from django.urls import path

from api import views
from api.endpoints import api

urlpatterns = [
    path("api/v1/", api.urls),
    path("account/tokens/", views.tokens, name="api_tokens"),
    path("account/tokens/<int:pk>/revoke/", views.revoke_token, name="api_token_revoke"),
]
