"""Where a push's time goes, stamped inside the cluster's processes: loaded by the push
benchmark only (`bench/push.py` puts this folder on the processes' PYTHONPATH, with
BENCH_PUSH_STAMPS naming a file prefix), so production code carries no stamp at all.

Once Django is set up, it wraps, for `approval.created` events only:

- in a worker: `engine.events.publish` ("publish" before the layer's group_send, "sent" once
  the inbox group's send returned);
- in a web process: `GuardedConsumer.dispatch` ("dispatch": the socket's message arrived from
  the layer), the inbox row's render (`approvals.consumers._render_new_row`: "render" when it
  is asked, "rendered" when its text is back on the loop), and the
  socket's send of the frame ("framed", once daphne took it).

Each line of `<prefix>.<pid>` is `time.time() stage request_id`.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

PREFIX = os.environ.get("BENCH_PUSH_STAMPS", "")


def stamp(stage: str, request_id: object) -> None:
    with open(f"{PREFIX}.{os.getpid()}", "a") as out:
        out.write(f"{time.time():.6f} {stage} {request_id}\n")


def _wrap_everything() -> None:
    from approvals import consumers
    from engine import access, events

    publish = events.publish

    @functools.wraps(publish)
    async def publish_stamped(published: Any) -> None:
        published = list(published)
        created = [e.request_id for e in published if isinstance(e, events.ApprovalCreated)]
        for request_id in created:
            stamp("publish", request_id)
        await publish(published)
        for request_id in created:
            stamp("sent", request_id)

    events.publish = publish_stamped  # type: ignore[assignment]

    dispatch = access.GuardedConsumer.dispatch

    @functools.wraps(dispatch)
    async def dispatch_stamped(self: Any, message: dict[str, Any]) -> None:
        if message.get("type") == "approval.created":
            stamp("dispatch", message["event"]["request_id"])
        await dispatch(self, message)

    access.GuardedConsumer.dispatch = dispatch_stamped  # type: ignore[method-assign]

    render = consumers._render_new_row

    async def render_stamped(request_id: int, back: str, viewers: frozenset[int]) -> str:
        stamp("render", request_id)
        html: str = await render(request_id, back, viewers)
        stamp("rendered", request_id)
        return html

    consumers._render_new_row = render_stamped

    created_handler = consumers.InboxConsumer.approval_created

    @functools.wraps(created_handler)
    async def created_stamped(self: Any, message: dict[str, Any]) -> None:
        await created_handler(self, message)
        stamp("framed", message["event"]["request_id"])

    consumers.InboxConsumer.approval_created = created_stamped  # type: ignore[method-assign]


def _after_setup() -> None:
    import django

    setup = django.setup

    @functools.wraps(setup)
    def setup_then_wrap(*args: Any, **kwargs: Any) -> None:
        setup(*args, **kwargs)
        _wrap_everything()

    django.setup = setup_then_wrap


if PREFIX:
    _after_setup()
