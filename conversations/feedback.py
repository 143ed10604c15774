"""End users' ratings of replies on the chat page: thumbs up or down with an optional comment,
one `tracing.models.Feedback` row per run and user (rating again changes it).

The chat shows a conversation from its session items, not from its runs, so the turns of the
history are matched back to the runs that wrote them (`attach`), from the end of the history
back: each user message to the newest earlier run on the same text that wrote the reply the
session holds (else the newest on that text). A run whose turn was undone and sent again
keeps its own row: the reply tells the two apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import FilteredRelation, Q
from django.urls import reverse

from conversations.forms import FeedbackForm
from conversations.rendering import HISTORY_ITEMS_SHOWN, Entry, History
from engine.models import AgentRun, RunStatus
from tracing.models import Feedback

NOT_FINISHED = "This reply is not finished yet: you can rate it once it is."
THANKS = "Thanks for your feedback."
# After a comment was sent: it is kept, and can be read again under "Your comment".
COMMENT_SAVED = "Thanks, your comment is saved."


@dataclass
class Rating:
    """What the buttons under a reply show: the user's score (None: not rated yet), her
    comment, and a form's error with the text she typed."""

    run_pk: int
    url: str
    score: int | None = None
    comment: str = ""
    error: str = ""
    note: str = ""

    @property
    def open(self) -> bool:
        """The comment box is shown after a thumbs down, with a comment, or with an error."""
        return self.score == -1 or bool(self.comment) or bool(self.error)

    @property
    def send_score(self) -> int:
        """The score a comment is sent with: the user's, else thumbs down."""
        return self.score if self.score is not None else -1


def rating_for(
    run: AgentRun | int,
    session_id: str,
    row: Feedback | None,
    *,
    form: FeedbackForm | None = None,
    note: str = "",
) -> Rating:
    run_pk = run if isinstance(run, int) else run.pk
    rating = Rating(
        run_pk=run_pk,
        url=reverse("chat_feedback", args=[session_id, run_pk]),
        score=row.score if row is not None else None,
        comment=row.comment if row is not None else "",
        note=note,
    )
    if form is not None and form.errors:
        # What she typed stays, with the reason it was refused.
        rating.comment = str(form.data.get("comment", rating.comment))
        rating.error = " ".join(
            str(message) for errors in form.errors.values() for message in errors
        )
    return rating


def existing(run: AgentRun, user: Any) -> Feedback | None:
    return Feedback.objects.filter(run=run, user=user).first()


def rate(run: AgentRun, user: Any, score: int, comment: str | None) -> Feedback:
    """Her rating of `run`, created or changed (`comment` None: the comment is kept). Two
    quick clicks make one row: the (run, user) constraint holds, and `update_or_create`
    reads the row its loser could not insert."""
    values: dict[str, Any] = {"score": score}
    if comment is not None:
        values["comment"] = comment
    row, _ = Feedback.objects.update_or_create(run=run, user=user, defaults=values)
    return row


def attach(history: History, user: Any, overrides: dict[int, Rating] | None = None) -> None:
    """Put a `Rating` on the latest run's block (once it completed) and on the last reply of
    each earlier completed turn of `history`: one query."""
    overrides = overrides or {}
    conversation = history.conversation
    # One query: each run of the conversation with her rating of it, if any.
    # The newest runs only: the page shows at most HISTORY_ITEMS_SHOWN items.
    newest = list(
        AgentRun.objects.filter(conversation=conversation)
        .annotate(mine=FilteredRelation("feedback", condition=Q(feedback__user=user)))
        .order_by("-created", "-pk")
        .values_list("pk", "input", "status", "mine__score", "mine__comment", "final_output")[
            :HISTORY_ITEMS_SHOWN
        ]
    )
    runs = newest[::-1]
    rows = {
        pk: Feedback(run_id=pk, score=score, comment=comment or "")
        for pk, _, _, score, comment, _ in runs
        if score is not None
    }

    def rating(run_pk: int) -> Rating:
        found = overrides.get(run_pk)
        return found or rating_for(run_pk, conversation.session_id, rows.get(run_pk))

    shown = history.run.run.pk if history.run is not None else None
    if history.run is not None and history.run.run.status == RunStatus.COMPLETED:
        history.run.rating = rating(history.run.run.pk)
    earlier = [run for run in runs if run[0] != shown]
    turns = _turns(history.entries)
    left = len(earlier)
    for text, replies in reversed(turns):
        said = text.strip()
        reply = replies[-1].text.strip() if replies else None
        # The run on this text that wrote this reply, else the newest on this text.
        on_text = [k for k in range(left - 1, -1, -1) if earlier[k][1].strip() == said]
        wrote = [k for k in on_text if earlier[k][5].strip() == reply]
        if not on_text:
            continue
        left = (wrote or on_text)[0]
        run_pk, _, status, _, _, _ = earlier[left]
        if status == RunStatus.COMPLETED and replies:
            replies[-1].rating = rating(run_pk)


def _turns(entries: list[Entry]) -> list[tuple[str, list[Entry]]]:
    """The history as turns: each user message's text, with the replies that follow it."""
    turns: list[tuple[str, list[Entry]]] = []
    for entry in entries:
        if entry.kind == "user":
            turns.append((entry.text, []))
        elif entry.kind == "assistant" and turns:
            turns[-1][1].append(entry)
    return turns


def for_pushed_run(run: AgentRun, user_pk: int | None) -> Rating | None:
    """The rating a pushed block of a completed run shows (one query), for its owner."""
    if run.status != RunStatus.COMPLETED or user_pk is None:
        return None
    row = Feedback.objects.filter(run=run, user_id=user_pk).first()
    return rating_for(run, run.conversation.session_id, row)
