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
