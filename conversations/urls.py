from django.urls import path

from common import converters  # noqa: F401  (registers <key:...>)
from conversations import views

urlpatterns = [
    path("", views.home, name="home"),
    path("chats/", views.chats, name="chats"),
    path("chats/new/", views.chat_new, name="chat_new"),
    path("chats/<key:session_id>/", views.chat, name="chat"),
    path("chats/<key:session_id>/history/", views.chat_history, name="chat_history"),
    path("chats/<key:session_id>/messages/", views.chat_send, name="chat_send"),
    path("chats/<key:session_id>/undo/", views.chat_undo, name="chat_undo"),
    path("chats/<key:session_id>/clear/", views.chat_clear, name="chat_clear"),
    path("chats/<key:session_id>/rename/", views.chat_rename, name="chat_rename"),
    path("chats/<key:session_id>/turns/<int:turn>/edit/", views.chat_edit, name="chat_edit"),
    path("chats/<key:session_id>/branches/", views.chat_branch, name="chat_branch"),
    path("chats/<key:session_id>/runs/<int:pk>/stop/", views.chat_stop, name="chat_stop"),
    path(
        "chats/<key:session_id>/runs/<int:pk>/feedback/",
        views.chat_feedback,
        name="chat_feedback",
    ),
    path(
        "chats/<key:session_id>/requests/<int:pk>/withdraw/",
        views.chat_withdraw,
        name="chat_withdraw",
    ),
]
