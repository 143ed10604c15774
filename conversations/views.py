"""The chat pages: a person's conversations, and one conversation with its agent.

Every page works as a plain page; htmx only makes sending faster. What a page shows is read
from the conversation's session (the SDK's history) and its latest run, the same way the
websocket consumer renders what it pushes, so a reload never disagrees with a push.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import wraps
from typing import Any, cast

from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import BadRequest, RequestDataTooBig
from django.core.paginator import Paginator
from django.db import DatabaseError
from django.db.models import Exists, OuterRef, Subquery
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import get_token
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import get_template, render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.csrf import csrf_protect
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect

from agentsite.db import pool
from approvals.models import ApprovalRequest
from common import formatting
from common.http import HtmxHttpRequest
from conversations import actions, feedback
from conversations.forms import (
    EditForm,
    FeedbackForm,
    MessageForm,
    NewConversationForm,
    RenameForm,
    SwitchForm,
)
from conversations.models import Branch, Conversation, branch_label
from conversations.rendering import (
    HISTORY_ITEMS_SHOWN,
    History,
    answering,
    branch_choices,
    build_history,
    display_title,
    edit_for,
    latest_run,
    shows_calls,
)
from conversations.session import open_session
from engine import providers, registry, runs
from engine.models import AgentRun, RunStatus
from engine.permissions import is_reviewer

CONVERSATIONS_PER_PAGE = 50
# What the list says about a conversation whose latest run is not simply done.
LIST_STATES: dict[str, str] = {
    RunStatus.QUEUED: "Replying…",
    RunStatus.RUNNING: "Replying…",
    RunStatus.RESUMING: "Replying…",
    RunStatus.WAITING: "Waiting for approval",
    RunStatus.FAILED: "Last reply failed",
    RunStatus.CANCELLED: "Last reply stopped",
    RunStatus.GUARDRAIL: "Last message refused",
}
PREVIEW_CHARS = 80


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    """Reviewers go to their inbox, everyone else to their chats; visitors see what this is."""
    if request.user.is_authenticated:
        return redirect("inbox" if is_reviewer(request.user) else "chats")
    return render(request, "conversations/home.html", {"agent_names": registry.agent_names()})


# --- helpers --------------------------------------------------------------------------------


def _get_conversation_for_user(request: HttpRequest, session_id: str) -> Conversation:
    """The conversation, if it is the user's; any other one is a 404, so none is revealed.
    `forked`: whether it has versions to switch between (the switcher reads them then)."""
    mine = Conversation.objects.owned_by(request.user).annotate(
        forked=Exists(Branch.objects.filter(conversation=OuterRef("pk")))
    )
    return get_object_or_404(mine, session_id=session_id)


@dataclass
class _Editing:
    """An edit that was refused: the message it was for, what she typed, and why."""

    turn: int
    text: str
    error: str
    # Shown in its message's Edit control (else the page says it as a notice).
    shown: bool = False


def _history(conversation: Conversation, editing: _Editing | None = None) -> History:
    session = open_session(conversation.session_id)
    # The current branch's items, each with its turn (a message's Edit control names it).
    rows = async_to_sync(session.get_items_with_turns)(HISTORY_ITEMS_SHOWN)  # type: ignore[attr-defined]
    items, turns = [item for _, item in rows], [turn for turn, _ in rows]
    # An encrypted session skips items it cannot decrypt; people are told, nothing is dropped.
    unreadable = int(getattr(session, "unreadable_seen", 0))
    history = build_history(conversation, items, latest_run(conversation), unreadable, turns)
    history.truncated = len(items) >= HISTORY_ITEMS_SHOWN
    history.branches = branch_choices(conversation)
    if editing is not None:
        edits = [entry.edit for entry in history.entries] + [
            history.run.edit if history.run is not None else None
        ]
        for edit in edits:
            if edit is not None and edit.turn == editing.turn:
                edit.text, edit.error, edit.open = editing.text, editing.error, True
                editing.shown = True
    return history


def _display_title(conversation: Conversation, history: History | None = None) -> str:
    return history.title if history is not None else display_title(conversation)


def _chat_page(
    request: HttpRequest,
    conversation: Conversation,
    *,
    form: MessageForm | None = None,
    rename_form: RenameForm | None = None,
    status: int = 200,
    busy: str = "",
    ratings: dict[int, feedback.Rating] | None = None,
    editing: _Editing | None = None,
) -> HttpResponse:
    history = _history(conversation, editing)
    if editing is not None and not editing.shown:
        messages.error(request, editing.error)
    feedback.attach(history, request.user, ratings)
    context = {
        "conversation": conversation,
        "history": history,
        "title": _display_title(conversation, history),
        "answering": answering(conversation),
        "show_calls": shows_calls(request.user),
        "form": form or MessageForm(),
        "rename_form": rename_form or RenameForm(initial={"title": conversation.title}),
        "ws_path": f"/ws/chats/{conversation.session_id}/",
        "busy": busy,
        # An empty chat on the offline model says what it understands.
        "examples": _examples(conversation) if history.is_empty else [],
    }
    response = render(request, "conversations/chat.html", context, status=status)
    response.shown_run = history.run  # type: ignore[attr-defined]
    return response


def _examples(conversation: Conversation) -> list[str]:
    try:
        agent = registry.get_agent(conversation.answering_agent)
    except Exception:
        return []  # an agent no longer registered: its page says so elsewhere
    return providers.offline_examples(agent)


# --- the list -------------------------------------------------------------------------------


@login_required
@require_GET
def chats(request: HttpRequest) -> HttpResponse:
    """The user's conversations, most recently active first."""
    return _chats_page(request)


def _chats_page(request: HttpRequest, status: int = 200) -> HttpResponse:
    latest_status = (
        AgentRun.objects.filter(conversation=OuterRef("pk"))
        .order_by("-created", "-pk")
        .values("status")[:1]
    )
    conversations = (
        Conversation.objects.owned_by(request.user)
        .touched()  # one opened and left unused is not listed (the next New reuses it)
        .with_first_message()
        .annotate(latest_status=Subquery(latest_status))
        .order_by("-updated", "-pk")
    )
    page = Paginator(conversations, CONVERSATIONS_PER_PAGE).get_page(request.GET.get("page"))
    rows = [_ChatRow.of(conversation) for conversation in page]
    return render(
        request,
        "conversations/chats.html",
        {"page": page, "rows": rows, "new_form": NewConversationForm()},
        status=status,
    )


@dataclass
class _ChatRow:
    conversation: Conversation
    preview: str
    activity: str
    status: str
    state: str
    # Who answers it now, by its own name ("Billing" after a handoff), as its header says.
    agent: str = ""

    @classmethod
    def of(cls, conversation: Conversation) -> _ChatRow:
        text = conversation.first_words
        status = str(getattr(conversation, "latest_status", None) or "")
        return cls(
            conversation=conversation,
            agent=answering(conversation),
            preview=formatting.preview(text, PREVIEW_CHARS) if text else "",
            activity=formatting.ago(conversation.updated, detailed=True),
            status=status,
            state=LIST_STATES.get(status, ""),
        )


@login_required
@require_POST
def chat_new(request: HttpRequest) -> HttpResponse:
    form = NewConversationForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose one of the agents in the list.")
        return redirect("chats")
    agent_name = form.agent_name()
    # One opened with this agent and never used is the new one: no pile of empty ones.
    unused = (
        Conversation.objects.owned_by(request.user)
        .untouched()
        .filter(agent_name=agent_name, current_agent__in=["", agent_name])
        .order_by("-pk")
        .first()
    )
    if unused is not None:
        return redirect("chat", session_id=unused.session_id)
    limit = settings.AGENTSITE_CONVERSATIONS_PER_HOUR
    since = timezone.now() - timedelta(hours=1)
    if limit > 0 and Conversation.objects.started_since(request.user, since).count() >= limit:
        messages.error(
            request,
            f"You are starting conversations too fast: at most {limit} an hour. "
            "Continue one of these, or try again later.",
        )
        return _chats_page(request, status=429)
    conversation = Conversation.objects.create(owner=cast(Any, request.user), agent_name=agent_name)
    return redirect("chat", session_id=conversation.session_id)


# --- one conversation -----------------------------------------------------------------------


# A chat page reached with `?follow=1` (after a message sent without JavaScript) asks the
# browser to load it again (`Refresh`) while its reply is being written, or more slowly while
# a reviewer decides: without a script there is no socket and no re-read of its own.
FOLLOW = "follow"
FOLLOW_SECONDS = {"active": 3, RunStatus.WAITING: 15}


@login_required
@require_GET
def chat(request: HttpRequest, session_id: str) -> HttpResponse:
    conversation = _get_conversation_for_user(request, session_id)
    response = _chat_page(request, conversation)
    run = getattr(response, "shown_run", None)
    if request.GET.get(FOLLOW) and run is not None:
        seconds = FOLLOW_SECONDS["active"] if run.is_active else FOLLOW_SECONDS.get(run.run.status)
        if seconds:
            # Its own address, without the "#composer" it was reached with: a refresh to the
            # same address and a fragment would only scroll, not load the page again.
            response["Refresh"] = f"{seconds}; url={request.get_full_path()}"
    return response


@login_required
@require_GET
def chat_history(request: HttpRequest, session_id: str) -> HttpResponse:
    """The message list alone: the page re-fetches it whenever its socket (re)connects."""
    conversation = _get_conversation_for_user(request, session_id)
    history = _history(conversation)
    feedback.attach(history, request.user)
    context = {
        "conversation": conversation,
        "history": history,
        "show_calls": shows_calls(request.user),
        "title": history.title,
        "answering": answering(conversation),
        "examples": _examples(conversation) if history.is_empty else [],
    }
    # With the header's title and who answers, swapped out of band: a push missed while the
    # socket was down is made good by this re-read too.
    messages_html = render_to_string("conversations/chat.html#messages", context, request)
    header = render_to_string("conversations/chat.html#run-header", context, request)
    return HttpResponse(messages_html + header)


_View = Callable[..., HttpResponse]
TOO_LONG = f"The message is too long (at most {runs.MAX_INPUT_CHARS} characters)."


def _too_long_beyond_the_upload_limit(
    refuse: Callable[..., HttpResponse],
) -> Callable[[_View], _View]:
    """A message whose body is beyond `DATA_UPLOAD_MAX_MEMORY_SIZE` is refused as too long
    (`refuse(request, conversation, **the URL's other arguments)`), the way
    `runs.start_run` refuses a long one, instead of with Django's bare 400 page (which htmx
    shows as nothing). CSRF middleware
    reads the body before any view, so the view is exempt from it and checks the token
    itself, after the size: a refusal changes nothing. The text is not sent back (reading it
    is what the limit stops): the htmx form keeps it in the page."""

    def decorate(view: _View) -> _View:
        protected = csrf_protect(view)

        @wraps(view)
        def wrapper(request: HtmxHttpRequest, session_id: str, **kwargs: Any) -> HttpResponse:
            try:
                request.POST  # noqa: B018  (parsed here, within the limit, or refused)
            except RequestDataTooBig:
                # As Django's own handler does, so that POST reads as empty from here on.
                request._mark_post_parse_error()  # type: ignore[attr-defined]
                conversation = _get_conversation_for_user(request, session_id)
                return refuse(request, conversation, **kwargs)
            return protected(request, session_id, **kwargs)

        wrapper.csrf_exempt = True  # type: ignore[attr-defined]
        return wrapper

    return decorate


def _message_too_big(request: HtmxHttpRequest, conversation: Conversation) -> HttpResponse:
    form = MessageForm({"text": ""})
    form.add_error("text", TOO_LONG)
    if request.htmx:
        response = render(request, "conversations/chat.html#composer-note", {"form": form})
        response["HX-Retarget"] = "#composer-note"
        response["HX-Reswap"] = "outerHTML"
        return response
    return _refused(request, conversation, form, status=400)


def _refused_when_busy(view: _View) -> _View:
    """No database connection came free in time (the pool is exhausted): the message is
    refused as "busy, try again", its text kept in the composer for htmx, rather than lost
    to a 500. Answered without the database: the composer alone, drawn without the site's
    context processors (they ask the database who the user is)."""

    @wraps(view)
    def wrapper(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
        try:
            return view(request, session_id)
        except DatabaseError as error:
            if not pool.is_exhausted(error):
                raise
        if not request.htmx:
            return pool.busy_response()
        try:
            text = request.POST.get("text", "")
        except RequestDataTooBig:
            text = ""
        form = MessageForm({"text": text})
        form.add_error("text", pool.BUSY)
        context = {
            "conversation": Conversation(session_id=session_id),
            "form": form,
            "csrf_token": get_token(request),
        }
        return HttpResponse(get_template("conversations/chat.html#composer").render(context))

    return wrapper


@_refused_when_busy
@login_required
@require_POST
@_too_long_beyond_the_upload_limit(_message_too_big)
def chat_send(request: HtmxHttpRequest, session_id: str) -> HttpResponse:
    """Start a run on the message. Refused, with the text kept, when it is empty or too long,
    or while the conversation's last run is still going."""
    conversation = _get_conversation_for_user(request, session_id)
    form = MessageForm(request.POST)
    status = 400
    busy_with = ""
    moved = False
    valid = form.is_valid()
    if not valid and "branch" in form.errors:
        # Only a hand-made post names no version a page could show: said where she reads.
        form.add_error("text", SEND_NO_SUCH_VERSION)
    if valid:
        try:
            actions.send(
                conversation,
                request.user,
                form.cleaned_data["text"],
                shown=form.cleaned_data["branch"],
            )
        except actions.Refusal as refusal:
            form.add_error("text", str(refusal))
            if isinstance(refusal, actions.VersionMoved):
                status, moved = 409, True
            elif isinstance(refusal, actions.Busy):
                # The page takes this error away once the run is no longer so (chat.js).
                busy_with = refusal.why.value
            elif isinstance(refusal, actions.RateLimited):
                status = 429
    if form.errors:
        refused = _refused(request, conversation, form, status=status, busy=busy_with)
        if moved and request.htmx:
            refused["HX-Trigger"] = "resync"  # the page shows the version there is now
        return refused
    if request.htmx:
        # The run's block arrives over the socket (or with the next re-sync).
        return render(
            request,
            "conversations/chat.html#composer",
            {"conversation": conversation, "form": MessageForm(), "autofocus": True},
        )
    # A plain post: no script on the page, so nothing will be pushed to it. The page it lands
    # on reads itself again until the reply is in (`FOLLOW`).
    return redirect(reverse("chat", args=[conversation.session_id]) + f"?{FOLLOW}=1#composer")


def _refused(
    request: HtmxHttpRequest,
    conversation: Conversation,
    form: MessageForm,
    *,
    status: int,
    busy: str = "",
) -> HttpResponse:
    """A refused message with its error and its text: the composer for htmx (which swaps a
    2xx or a 429, and no other error), else the chat page with `status`."""
    if request.htmx:
        context = {"conversation": conversation, "form": form, "busy": busy}
        code = 429 if status == 429 else 200
        return render(request, "conversations/chat.html#composer", context, status=code)
    return _chat_page(request, conversation, form=form, status=status, busy=busy)


@login_required
@require_POST
def chat_undo(request: HttpRequest, session_id: str) -> HttpResponse:
    conversation = _get_conversation_for_user(request, session_id)
    try:
        removed = actions.undo(conversation)
    except actions.Refusal as refusal:
        messages.error(request, str(refusal))
        return redirect("chat", session_id=session_id)
    if removed:
        messages.success(request, "Your last message and its reply were removed.")
    else:
        messages.info(request, "There is nothing to undo.")
    return redirect("chat", session_id=session_id)


@login_required
@require_http_methods(["GET", "POST"])
def chat_clear(request: HttpRequest, session_id: str) -> HttpResponse:
    """GET asks for confirmation; POST empties the conversation (it keeps its title)."""
    conversation = _get_conversation_for_user(request, session_id)
    if request.method == "GET":
        busy = actions.busy(conversation)
        context = {
            "conversation": conversation,
            "title": _display_title(conversation),
            "busy": str(busy) if busy is not None else None,
        }
        return render(request, "conversations/clear.html", context)
    try:
        actions.clear(conversation)
    except actions.Busy as refusal:
        messages.error(request, str(refusal))
        return redirect("chat", session_id=session_id)
    messages.success(request, "The conversation was cleared.")
    return redirect("chat", session_id=session_id)


@login_required
@require_POST
def chat_rename(request: HttpRequest, session_id: str) -> HttpResponse:
    conversation = _get_conversation_for_user(request, session_id)
    form = RenameForm(request.POST)
    if not form.is_valid():
        return _chat_page(request, conversation, rename_form=form, status=400)
    title = actions.rename(conversation, form.cleaned_data["title"])
    messages.success(request, "Renamed." if title else "The title was removed.")
    return redirect("chat", session_id=session_id)


# --- versions: edit an earlier message, switch between versions ---------------------------

SEND_NO_SUCH_VERSION = (
    "This message names no version of this conversation, so it was not sent. Reload the page "
    "and send it again."
)
# What each refusal of an edit answers a plain form with (any other: 400).
EDIT_STATUS: dict[type[actions.Refusal], int] = {actions.Busy: 409, actions.RateLimited: 429}


def _edit_too_big(request: HtmxHttpRequest, conversation: Conversation, turn: int) -> HttpResponse:
    return _edit_refused(request, conversation, _Editing(turn, "", TOO_LONG), status=400)


def _edit_refused(
    request: HtmxHttpRequest, conversation: Conversation, editing: _Editing, *, status: int
) -> HttpResponse:
    """A refused edit, with its text and why: for htmx, its Edit control alone (swapped, so
    200); else the chat page with it open."""
    if request.htmx:
        edit = edit_for(conversation, editing.turn, editing.text)
        edit.error, edit.open = editing.error, True
        return render(request, "conversations/chat.html#edit", {"edit": edit})
    return _chat_page(request, conversation, status=status, editing=editing)


@login_required
@require_POST
@_too_long_beyond_the_upload_limit(_edit_too_big)
def chat_edit(request: HtmxHttpRequest, session_id: str, turn: int) -> HttpResponse:
    """The owner edits her message `turn`: the conversation forks from there (a new version,
    `create_branch_from_turn`, which keeps the turns before it) and the edited text is sent
    as that turn, on the new version, in the same transaction. The version she edited stays,
    one click away. Refused while the conversation is busy, and with what she typed kept."""
    conversation = _get_conversation_for_user(request, session_id)
    form = EditForm(request.POST)
    if not form.is_valid():
        raise BadRequest("An edit names the version of the conversation it was made in.")
    text = form.cleaned_data["text"]
    try:
        actions.edit(
            conversation, request.user, turn=turn, text=text, shown=form.cleaned_data["branch"]
        )
    except actions.VersionMoved as moved:
        messages.info(request, str(moved))
        return redirect("chat", session_id=session_id)
    except actions.Refusal as refusal:
        editing = _Editing(turn, text, str(refusal))
        status = EDIT_STATUS.get(type(refusal), 400)
        return _edit_refused(request, conversation, editing, status=status)
    url = reverse("chat", args=[session_id]) + "#composer"
    if request.htmx:
        return HttpResponseClientRedirect(url)
    return redirect(url)


@login_required
@require_POST
def chat_branch(request: HttpRequest, session_id: str) -> HttpResponse:
    """The owner switches the conversation to another of its versions: the page shows it,
    and her next message goes on it. Refused while the conversation is busy."""
    conversation = _get_conversation_for_user(request, session_id)
    form = SwitchForm(request.POST)
    if not form.is_valid():
        raise BadRequest("Choose a version of the conversation.")
    branch = form.cleaned_data["branch"]
    try:
        actions.switch_version(conversation, branch)
    except actions.Refusal as refusal:
        messages.error(request, str(refusal))
        return redirect("chat", session_id=session_id)
    messages.success(request, f"Now showing: {branch_label(branch)}.")
    return redirect("chat", session_id=session_id)


# --- withdraw and stop ----------------------------------------------------------------------


def _action_answer(
    request: HtmxHttpRequest, conversation: Conversation, text: str, *, ok: bool
) -> HttpResponse:
    """What a Withdraw or Stop answers: for htmx, the note beside its button (the run's
    block itself arrives over the socket); else the chat page with the note as a flash."""
    if request.htmx:
        return render(request, "conversations/chat.html#run-action-note", {"note": text, "ok": ok})
    (messages.success if ok else messages.error)(request, text)
    return redirect("chat", session_id=conversation.session_id)


@login_required
@require_POST
def chat_withdraw(request: HtmxHttpRequest, session_id: str, pk: int) -> HttpResponse:
    """The owner takes back a request of this conversation that waits for a reviewer."""
    conversation = _get_conversation_for_user(request, session_id)
    approval = get_object_or_404(ApprovalRequest, pk=pk, run__conversation=conversation)
    try:
        runs.withdraw(approval, request.user)
    except runs.DecisionRefused as refusal:
        return _action_answer(request, conversation, str(refusal), ok=False)
    return _action_answer(
        request, conversation, "Withdrawn. The agent is answering without it…", ok=True
    )


@login_required
@require_POST
def chat_stop(request: HtmxHttpRequest, session_id: str, pk: int) -> HttpResponse:
    """The owner stops a reply of this conversation that is being written."""
    conversation = _get_conversation_for_user(request, session_id)
    run = get_object_or_404(AgentRun, pk=pk, conversation=conversation)
    try:
        stopping = runs.stop(run, request.user)
    except runs.DecisionRefused as refusal:
        return _action_answer(request, conversation, str(refusal), ok=False)
    if not stopping:
        return _action_answer(
            request, conversation, "This reply had already ended; nothing was stopped.", ok=False
        )
    return _action_answer(request, conversation, "Stopping…", ok=True)


# --- feedback -------------------------------------------------------------------------------


@login_required
@require_POST
def chat_feedback(request: HtmxHttpRequest, session_id: str, pk: int) -> HttpResponse:
    """The owner rates a finished reply of this conversation: thumbs up or down, with an
    optional comment; rating again changes it. For htmx the buttons alone come back (a
    refused comment with its error and its text); else the chat page, at the reply."""
    conversation = _get_conversation_for_user(request, session_id)
    run = get_object_or_404(AgentRun, pk=pk, conversation=conversation)
    if not run.is_finished:
        return HttpResponse(feedback.NOT_FINISHED, status=409, content_type="text/plain")
    form = FeedbackForm(request.POST)
    if not form.is_valid():
        existing = feedback.existing(run, request.user)
        rating = feedback.rating_for(run, session_id, existing, form=form)
        if request.htmx:
            # 200, as the composer's refusals are: htmx swaps no 4xx, and the text must stay.
            return render(request, "conversations/chat.html#feedback", {"rating": rating})
        return _chat_page(request, conversation, status=400, ratings={run.pk: rating})
    comment = form.cleaned_data["comment"] if "comment" in request.POST else None
    row = feedback.rate(run, request.user, form.cleaned_data["score"], comment)
    note = feedback.COMMENT_SAVED if comment and comment.strip() else feedback.THANKS
    if request.htmx:
        rating = feedback.rating_for(run, session_id, row, note=note)
        return render(request, "conversations/chat.html#feedback", {"rating": rating})
    messages.success(request, note)
    return redirect(reverse("chat", args=[session_id]) + f"#feedback-{run.pk}")
