"""A push's check of its socket's session runs beside its render, never in front of it: the
render starts at once, in the database's thread, and the frame waits for the check, in a hop
thread (`engine.access`). So a process's inbox sockets, whose checks have aged together, do not
queue their one shared render behind all their checks."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from approvals import consumers
from engine import access
from tests.engine.test_access import CLOSED, Inbox, logged_in, open_socket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_layer")]


class Held:
    """Every socket's check (each push's: `RECHECK_SECONDS` 0) waits for `release`, then
    answers as it would, or refuses when `deny` is set."""

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()
        self.deny = False


@pytest.fixture
def held_check(monkeypatch: pytest.MonkeyPatch) -> Held:
    held = Held()
    recheck_all = access.recheck_all

    def waits(consumers: list[access.GuardedConsumer]) -> list[bool]:
        held.started.set()
        assert held.release.wait(10), "the check was never released"
        return [ok and not held.deny for ok in recheck_all(consumers)]

    monkeypatch.setattr(access, "recheck_all", waits)
    monkeypatch.setattr(access, "RECHECK_SECONDS", 0.0)
    return held


@pytest.fixture
def renders(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    seen: list[int] = []
    render = consumers._render_new_row

    async def counted(request_id: int, *rest: Any) -> Any:
        seen.append(request_id)
        return await render(request_id, *rest)

    monkeypatch.setattr(consumers, "_render_new_row", counted)
    return seen


async def test_the_row_renders_while_the_check_runs_and_goes_out_after_it(
    held_check: Held, renders: list[int]
) -> None:
    started, release = held_check.started, held_check.release
    socket = Inbox()
    rita = await socket.setup()
    _, cookie = await logged_in(rita)
    communicator = await open_socket(socket.path, cookie)

    await socket.push()
    assert await sync_to_async(started.wait)(5), "no check before the push"
    for _ in range(250):  # the render does not wait for the check
        if renders:
            break
        await asyncio.sleep(0.02)
    assert renders, "the row was not rendered while its check ran"
    assert await communicator.receive_nothing(timeout=0.3), "a frame went out before its check"

    release.set()
    frame = await communicator.receive_from(timeout=5)
    assert 'id="request-' in frame
    await communicator.disconnect()


async def test_a_check_that_fails_while_the_row_renders_sends_nothing_and_closes(
    held_check: Held, renders: list[int]
) -> None:
    started, release = held_check.started, held_check.release
    socket = Inbox()
    rita = await socket.setup()
    _, cookie = await logged_in(rita)
    communicator = await open_socket(socket.path, cookie)

    held_check.deny = True
    await socket.push()
    assert await sync_to_async(started.wait)(5)
    for _ in range(250):
        if renders:
            break
        await asyncio.sleep(0.02)
    assert renders
    release.set()
    assert await communicator.receive_output(timeout=5) == CLOSED  # no frame before the close
    await communicator.wait()
