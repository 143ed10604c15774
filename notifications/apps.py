from __future__ import annotations

from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "notifications"
    verbose_name = "Email notifications"

    def ready(self) -> None:
        # The composition root of the app: the engine announces, the outbox listens; the
        # sender is handed the task enqueuer (it knows nothing of the task backend).
        from notifications import outbox, sending, tasks

        sending.configure(enqueue=tasks.enqueue)
        outbox.connect()
