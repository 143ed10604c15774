from __future__ import annotations

from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    verbose_name = "Webhooks"

    def ready(self) -> None:
        # The composition root of the app: the engine announces, the outbox listens; the
        # delivery is handed the task enqueuer (it knows nothing of the task backend).
        from webhooks import delivery, outbox, tasks

        delivery.configure(enqueue=tasks.enqueue)
        outbox.connect()
