"""What a run has streamed so far (`engine/runs/streaming.py`): each delta says where it starts
and which stretch of the run it belongs to, and the run's row holds a prefix of the text now
and then, so a reload shows what was said. (The page that shows it:
tests/conversations/test_views_after_reload.py.)"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from conversations.models import Conversation
from engine import events, runs
from engine.models import AgentRun, RunStatus
from engine.runs import streaming

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]


def test_a_streaming_run_stores_what_it_said_and_numbers_each_delta(
    conversation: Conversation, submitted: list, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.AGENTSITE_DEMO_STREAM_DELAY = 0.01
    monkeypatch.setattr(streaming, "STREAMED_SAVE_SECONDS", 0.05)
    deltas: list[events.TextDelta] = []
    saved: list[str] = []
    publish, save = events.publish, streaming.save_streamed

    async def recording_publish(published: Any) -> None:
        published = list(published)
        deltas.extend(e for e in published if isinstance(e, events.TextDelta))
        await publish(published)

    def recording_save(run_id: int, text: str) -> None:
        saved.append(text)
        save(run_id, text)
        assert AgentRun.objects.get(pk=run_id).streamed_text == text

    monkeypatch.setattr(events, "publish", recording_publish)
    monkeypatch.setattr(streaming, "save_streamed", recording_save)

    run = runs.start_run(conversation, "hello", conversation.owner)
    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()

    assert run.status == RunStatus.COMPLETED
    text = "".join(delta.delta for delta in deltas)
    assert text == run.final_output
    offsets = [delta.at for delta in deltas]
    assert offsets == [len("".join(d.delta for d in deltas[:i])) for i in range(len(deltas))]
    assert {delta.segment for delta in deltas} == {0}
    # Stored now and then, not per word: each time what had streamed so far.
    assert 1 <= len(saved) < len(deltas)
    assert all(text.startswith(part) for part in saved)
    assert run.streamed_text == ""  # the session holds the reply now


async def test_deltas_that_come_while_one_is_sent_go_out_together_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A delta goes out at once; the ones that arrive during its round trip go out as one
    message, from where the first of them starts; nothing is lost or reordered."""
    sent: list[tuple[str, int]] = []
    in_flight = asyncio.Event()
    release = asyncio.Event()

    async def slow_publish(published: Any) -> None:
        (delta,) = published
        sent.append((delta.delta, delta.at))
        in_flight.set()
        await release.wait()

    monkeypatch.setattr(events, "publish", slow_publish)
    deltas = streaming.Deltas(run_id=1, conversation_id=2, segment=0)
    deltas.add("Hel", 0)
    await asyncio.wait_for(in_flight.wait(), 1)
    assert sent == [("Hel", 0)]  # at once, without waiting for more
    for at, word in ((3, "lo"), (5, ", "), (7, "world")):
        deltas.add(word, at)
    release.set()
    await asyncio.wait_for(deltas.flush(), 1)

    assert sent == [("Hel", 0), ("lo, world", 3)]
    deltas.add("!", 12)  # after a flush, the next one goes out on its own again
    await asyncio.wait_for(deltas.flush(), 1)
    assert sent[-1] == ("!", 12)


def test_a_run_ends_after_its_last_delta_reached_the_pages(
    conversation: Conversation, submitted: list, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deltas are sent beside the stream, not waited for by it: the run's completion is still
    published after every one of them, and the text they carry is the whole reply."""
    settings.AGENTSITE_DEMO_STREAM_DELAY = 0
    order: list[Any] = []
    publish = events.publish

    async def slow_publish(published: Any) -> None:
        published = list(published)
        if any(isinstance(event, events.TextDelta) for event in published):
            await asyncio.sleep(0.02)  # a slow layer: the stream runs ahead of it
        order.extend(published)
        await publish(published)

    monkeypatch.setattr(events, "publish", slow_publish)
    run = runs.start_run(conversation, "hello", conversation.owner)
    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()

    assert run.status == RunStatus.COMPLETED
    texts = [event for event in order if isinstance(event, events.TextDelta)]
    assert "".join(event.delta for event in texts) == run.final_output
    assert 1 <= len(texts) < len(run.final_output.split())  # merged while the layer was slow
    last_delta = max(i for i, event in enumerate(order) if isinstance(event, events.TextDelta))
    ended = [
        i
        for i, event in enumerate(order)
        if isinstance(event, events.RunUpdated) and event.status == RunStatus.COMPLETED
    ]
    assert ended and ended[0] > last_delta
