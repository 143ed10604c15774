"""The JSON API under /api/v1/: approvals and runs, for other systems and people.

Decisions go through `runs.decide`, as the inbox's do: the same permission, the same
`seen_hash`, the same exactly-once rule and the same messages; each refusal maps to a status
(see docs/api.md). Runs start through `conversations.actions.send`, as the chat's do, one
at a time per conversation. Everything is JSON: what people or the model wrote is returned as data.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI, Path, Query, Status
from ninja.errors import HttpError, ValidationError, ValidationErrorContext

from api import limits, schemas
from api.auth import BearerToken, Caller, Forbidden, Unauthorized, require_scope
from approvals import explain
from approvals.models import FILTER_COLUMNS, ApprovalDecision, ApprovalRequest, ToolKind
from common import formatting
from conversations import actions
from conversations.models import Conversation
from conversations.rendering import TITLE_CHARS
from engine import permissions, policies, registry, runs
from engine.models import AgentRun


class Api(NinjaAPI):
    """django-ninja's API, with invalid input located where the caller wrote it."""

    def validation_error_from_error_contexts(
        self, error_contexts: list[ValidationErrorContext[Any]]
    ) -> ValidationError:
        errors: list[dict[str, Any]] = []
        for context in error_contexts:
            located = super().validation_error_from_error_contexts([context]).errors
            errors.extend(_in_body(error, context.model) for error in located)
        return ValidationError(errors)


def _in_body(error: dict[str, Any], model: Any) -> dict[str, Any]:
    """`error` under "body" as the caller wrote the body: django-ninja reads a lone body
    parameter as {its name: body}, and names it too ("body.body.seen_hash"); pydantic names
    the member of a discriminated union it read by its tag ("body.body.approve.seen_hash"),
    kept as the error's `tag` (`_said` words a decision's fields with it)."""
    # The name ninja wraps the body in (its BodyModel's marker); none when several parameters
    # share the body, each then a key of it, which its location rightly names.
    name = getattr(model, "__read_from_single_attr__", None)
    loc = tuple(error["loc"])
    if not name or loc[:2] != ("body", name):
        return error
    inside = loc[2:]
    if inside and model.model_fields[name].discriminator:
        return {**error, "loc": ("body", *inside[1:]), "tag": inside[0]}
    return {**error, "loc": ("body", *inside)}


api = Api(
    title="agentsite API",
    version="1",
    description="Approvals and runs of agentsite. See docs/api.md.",
    urls_namespace="api",
    auth=BearerToken(),
    openapi_url="/openapi.json",
    docs_url="/docs",
)

E = schemas.Error
# What every authenticated operation may answer besides its own.
READ_ERRORS: dict[int, Any] = {401: E, 403: E, 413: E, 422: E}
WRITE_ERRORS: dict[int, Any] = {401: E, 403: E, 404: E, 413: E, 422: E}


# Ids the database can hold (a larger one is a 422, not an overflow), and no NUL characters
# (PostgreSQL stores none).
Id = Annotated[int, Path(ge=1, le=2**63 - 1)]
SessionId = Annotated[str, Path(max_length=255, pattern=schemas.NO_NUL)]


class ApiError(HttpError):
    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(status, message)
        self.code = code


# --- errors ---------------------------------------------------------------------------------

DEFAULT_CODES = {400: "invalid", 401: "invalid_token", 403: "forbidden", 404: "not_found"}


def _error(request: HttpRequest, status: int, detail: str, code: str, **extra: Any) -> HttpResponse:
    return api.create_response(request, {"detail": detail, "code": code, **extra}, status=status)


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    if isinstance(exc, Unauthorized):
        response = _error(request, 401, str(exc), exc.error)
        # RFC 6750: no error attribute when no credentials came at all.
        error = "" if exc.error == "invalid_request" else f', error="{exc.error}"'
        response["WWW-Authenticate"] = f'Bearer realm="api"{error}'
        return response
    if exc.status_code == 400:  # ninja's "Cannot parse request body": the JSON is malformed
        return _error(request, 422, "The request body is not valid JSON.", "invalid_json")
    code = getattr(exc, "code", DEFAULT_CODES.get(exc.status_code, "error"))
    return _error(request, exc.status_code, str(exc), code)


@api.exception_handler(ValidationError)
def _invalid(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    # What was sent is not echoed back (`input`): where it is, it says nothing new.
    errors = [
        {"loc": list(error.get("loc", [])), "msg": str(error.get("msg", "")), "type": error["type"]}
        for error in exc.errors
    ]
    detail = "; ".join(_said(error) for error in exc.errors)
    return _error(request, 422, detail or "Invalid input.", "invalid", errors=errors)


def _said(error: dict[str, Any]) -> str:
    """One validation error for people: a decision's field that does not go with its action,
    or that it lacks, in the engine's words (`runs.FIELDS`, as the inbox says them)."""
    loc = list(error.get("loc", []))
    tag = error.get("tag")
    if tag in runs.FIELDS and len(loc) == 2:
        action, name = runs.Action(tag), str(loc[-1])
        if error["type"] == "extra_forbidden":
            return runs.unfit_field(name)
        required, missing = runs.REQUIRED.get(action, ("", ""))
        if error["type"] == "missing" and name == required:
            return missing
    return f"{'.'.join(map(str, loc))}: {error['msg']}"


@api.exception_handler(RequestDataTooBig)
def _too_large(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    # A body without its length, found too large as it was read (`api/limits.py`).
    return limits.too_large(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0)


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return _error(request, 404, "Not found.", "not_found")


# What each refusal of `runs.decide` is, over HTTP: the first class that matches (subclasses
# before their bases: a withdrawn request is also "already decided").
REFUSALS: list[tuple[type[runs.DecisionRefused], int, str]] = [
    (runs.NeedsAnotherReviewer, 403, "needs_another_reviewer"),
    (runs.NotAllowed, 403, "not_allowed"),
    (runs.RequestWithdrawn, 410, "withdrawn"),
    (runs.AlreadyDecided, 409, "already_decided"),
    (runs.RequestExpired, 410, "expired"),
    (runs.RequestClosed, 410, "closed"),
    (runs.StaleArguments, 409, "stale_arguments"),
    (runs.InvalidDecision, 422, "invalid_decision"),
]


def _refusal(refusal: runs.DecisionRefused) -> ApiError:
    """The status and code of a refusal of `runs.decide`, with its own message."""
    for kind, status, code in REFUSALS:
        if isinstance(refusal, kind):
            return ApiError(status, str(refusal), code)
    # The arguments were changed outside agentsite: a conflict with the stored call.
    return ApiError(409, str(refusal), "refused")


# --- paging ---------------------------------------------------------------------------------


# A page's cursor: the last row's `created` in microseconds since 1970 and its id,
# "<micros>-<id>". Every text the pattern allows is one this API could give (17 digits of
# microseconds reach the year 5138; 18 of an id stay below 2^63), so the schema promises no
# more than the server accepts.
CURSOR = r"^[0-9]{1,17}-[0-9]{1,18}$"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _cursor(created: datetime, pk: int) -> str:
    return f"{(created - EPOCH) // timedelta(microseconds=1)}-{pk}"


def _after(rows: QuerySet[Any], cursor: str | None) -> QuerySet[Any]:
    """The rows older than the cursor's, in the order (-created, -pk): a keyset, so a page
    stays the same however many rows arrive meanwhile."""
    if not cursor:
        return rows
    micros, _, pk_text = cursor.partition("-")
    created, pk = EPOCH + timedelta(microseconds=int(micros)), int(pk_text)
    return rows.filter(Q(created__lt=created) | Q(created=created, pk__lt=pk))


def _page(rows: QuerySet[Any], cursor: str | None, limit: int) -> tuple[list[Any], str | None]:
    listed = list(_after(rows.order_by("-created", "-pk"), cursor)[: limit + 1])
    more = len(listed) > limit
    listed = listed[:limit]
    return listed, (_cursor(listed[-1].created, listed[-1].pk) if more and listed else None)


class PageQuery(schemas.Schema):
    cursor: str | None = schemas.Field(
        default=None,
        pattern=CURSOR,
        description="The next_cursor of the page before (none: the first page).",
    )
    limit: int = schemas.Field(default=50, ge=1, le=schemas.MAX_LIMIT)


class RequestFilter(PageQuery):
    agent: str | None = schemas.Field(default=None, max_length=100, pattern=schemas.NO_NUL)
    tool: str | None = schemas.Field(default=None, max_length=200, pattern=schemas.NO_NUL)
    kind: schemas.ToolKindName | None = None
    server: str | None = schemas.Field(default=None, max_length=200, pattern=schemas.NO_NUL)


# --- access ---------------------------------------------------------------------------------


def _caller(request: HttpRequest) -> Caller:
    caller: Caller = request.auth  # type: ignore[attr-defined]
    return caller


def _reviewer(request: HttpRequest) -> Caller:
    caller = _caller(request)
    if not permissions.is_reviewer(caller.user):
        raise Forbidden("Only reviewers can read and decide approval requests.", "not_allowed")
    return caller


def _get_request(pk: int) -> ApprovalRequest:
    approval = (
        ApprovalRequest.objects.select_related(
            "run__requested_by", "run__conversation__owner", "decided_by"
        )
        .filter(pk=pk)
        .first()
    )
    if approval is None:
        raise Http404
    return approval


def _get_run_for_user(user: Any, pk: int) -> AgentRun:
    """The run, if it is of the user's conversation or she is a reviewer; else 404."""
    run = AgentRun.objects.select_related("conversation").filter(pk=pk).first()
    if run is None or not (run.conversation.owner_id == user.pk or permissions.is_reviewer(user)):
        raise Http404
    return run


def _get_conversation_for_user(user: Any, session_id: str) -> Conversation:
    """The conversation, if it is the user's: another's is a 404 like one that is not."""
    conversation = Conversation.objects.owned_by(user).filter(session_id=session_id).first()
    if conversation is None:
        raise Http404
    return conversation


# --- shapes ---------------------------------------------------------------------------------


def _summary(approval: ApprovalRequest) -> dict[str, Any]:
    explanation = explain.for_request(approval)
    asker = approval.run.requested_by
    return {
        "id": approval.pk,
        "status": approval.status,
        "tool": approval.tool_name,
        "kind": approval.kind,
        "server": approval.server,
        "agent": approval.agent_name,
        "call": approval.call_display(),
        "risk": explanation.risk,
        "asked_by": asker.get_username() if asker is not None else None,
        "created": approval.created,
        "expires_at": approval.expires_at,
        "run_id": approval.run_id,
    }


def _verdict(verdict: policies.Verdict | None) -> dict[str, Any] | None:
    return asdict(verdict) if verdict is not None else None


def _detail(approval: ApprovalRequest, user: Any) -> dict[str, Any]:
    explanation = explain.for_request(approval)
    run = approval.run
    # A function tool's JSON schema, or what a local MCP server listed for its tool; a shell
    # or patch tool has none.
    schema = (
        registry.request_sheet(run.agent_name, approval).schema
        if approval.kind in (ToolKind.FUNCTION, ToolKind.MCP)
        else {}
    )
    return {
        **_summary(approval),
        "call_id": approval.call_id,
        "origin": approval.origin,
        "arguments": approval.arguments,
        "arguments_hash": approval.arguments_hash,
        "arguments_intact": explanation.intact,
        "labelled_arguments": [asdict(argument) for argument in explanation.arguments],
        "arguments_schema": schema,
        "description": explanation.description,
        "risk_declared": explanation.risk_declared,
        "facts": (
            None if explanation.facts is None else [fact._asdict() for fact in explanation.facts]
        ),
        "policy": _verdict(explanation.policy),
        "policy_now": _verdict(explanation.policy_now),
        "decided_by": approval.decider_display() or None,
        "decided_at": approval.decided_at,
        "run": _run_ref(run),
        "allowed": {
            "decidable": approval.is_pending and not approval.is_overdue(),
            "editable": explanation.editable,
            "answerable": explanation.answerable,
            "needs_another_reviewer": runs.needs_another_reviewer(approval, user),
        },
    }


def _run_ref(run: AgentRun) -> dict[str, Any]:
    return {
        "id": run.pk,
        "status": run.status,
        "agent": run.agent_name,
        "conversation": run.conversation.session_id,
    }


def _decision(decision: ApprovalDecision) -> dict[str, Any]:
    return {
        "id": decision.pk,
        "request_id": decision.request_id,
        "kind": decision.kind,
        "approved": decision.approved,
        "reviewer": decision.reviewer.get_username() if decision.reviewer is not None else None,
        "policy_name": decision.policy_name,
        "message": decision.message,
        "note": decision.note,
        "always": decision.always,
        "arguments_hash": decision.arguments_hash,
        "edited_arguments": decision.edited_arguments,
        "created": decision.created,
    }


def _run(run: AgentRun) -> dict[str, Any]:
    requests = run.approval_requests.order_by("created", "pk")
    return {
        "id": run.pk,
        "status": run.status,
        "agent": run.agent_name,
        "conversation": run.conversation.session_id,
        "input": run.input,
        "error": run.error,
        "output": run.final_output if run.is_finished else None,
        "created": run.created,
        "updated": run.updated,
        "finished": run.finished,
        "requests": [
            {
                "id": r.pk,
                "tool": r.tool_name,
                "kind": r.kind,
                "server": r.server,
                "status": r.status,
                "created": r.created,
                "expires_at": r.expires_at,
            }
            for r in requests
        ],
    }


# --- approval requests ----------------------------------------------------------------------


@api.get(
    "/requests",
    response={200: schemas.RequestPage, **READ_ERRORS},
    summary="Pending requests, newest first",
    tags=["approvals"],
)
def list_requests(request: HttpRequest, filters: Query[RequestFilter]) -> dict[str, Any]:
    """The requests a reviewer can still decide, filtered as in the inbox (by agent, tool,
    kind of tool and MCP server), `limit` at a time; `next_cursor` reads the next (older)
    page."""
    _reviewer(request)
    rows = ApprovalRequest.objects.open().select_related("run__requested_by")
    for name, column in FILTER_COLUMNS.items():
        if value := getattr(filters, name):
            rows = rows.filter(**{column: value})
    listed, next_cursor = _page(rows, filters.cursor, filters.limit)
    explain.attach(listed, with_facts=False)
    return {"items": [_summary(approval) for approval in listed], "next_cursor": next_cursor}


@api.get(
    "/requests/{request_id}",
    response={200: schemas.RequestDetail, **READ_ERRORS, 404: E},
    summary="One request, with what the inbox shows of it",
    tags=["approvals"],
)
def read_request(request: HttpRequest, request_id: Id) -> dict[str, Any]:
    caller = _reviewer(request)
    return _detail(_get_request(request_id), caller.user)


@api.post(
    "/requests/{request_id}/decide",
    response={200: schemas.DecisionOut, **WRITE_ERRORS, 409: E, 410: E},
    summary="Approve, approve with edited arguments, answer as the tool, or reject",
    tags=["approvals"],
)
def decide(request: HttpRequest, request_id: Id, body: schemas.DecisionIn) -> dict[str, Any]:
    """Through the same engine call as the inbox. 409: already decided, or the arguments
    changed since `seen_hash`; 410: expired, withdrawn or closed; 403: not a reviewer, or
    another reviewer must approve (separation of duties)."""
    caller = _reviewer(request)
    require_scope(caller)
    approval = _get_request(request_id)
    try:
        # Which fields go with which action: `runs.FIELDS`, as the inbox's form reads it.
        chosen = runs.Decision.of(
            body.action,
            message=getattr(body, "message", None),
            note=body.note,
            response=getattr(body, "response", None),
            arguments=getattr(body, "arguments", None),
        )
        decision = runs.decide(approval, caller.user, chosen, seen_hash=body.seen_hash)
    except runs.UnfitDecision as unfit:
        raise ApiError(422, str(unfit), "invalid") from None
    except runs.DecisionRefused as refusal:
        raise _refusal(refusal) from None
    decision.reviewer = caller.user
    return _decision(decision)


@api.get(
    "/requests/{request_id}/decisions",
    response={200: list[schemas.DecisionOut], **READ_ERRORS, 404: E},
    summary="The audit of one request: its decisions, oldest first",
    tags=["approvals"],
)
def list_decisions(request: HttpRequest, request_id: Id) -> list[dict[str, Any]]:
    _reviewer(request)
    approval = _get_request(request_id)
    decisions = approval.decisions.select_related("reviewer").order_by("created", "pk")
    return [_decision(decision) for decision in decisions]


@api.get(
    "/requests/{request_id}/decisions/{decision_id}",
    response={200: schemas.DecisionOut, **READ_ERRORS, 404: E},
    summary="One decision of a request",
    tags=["approvals"],
)
def read_decision(request: HttpRequest, request_id: Id, decision_id: Id) -> dict[str, Any]:
    _reviewer(request)
    decision = (
        ApprovalDecision.objects.select_related("reviewer")
        .filter(pk=decision_id, request_id=request_id)
        .first()
    )
    if decision is None:
        raise Http404
    return _decision(decision)


# --- runs and conversations -----------------------------------------------------------------


@api.get(
    "/runs/{run_id}",
    response={200: schemas.RunOut, **READ_ERRORS, 404: E},
    summary="A run: its status, error, output when finished, its requests",
    tags=["runs"],
)
def read_run(request: HttpRequest, run_id: Id) -> dict[str, Any]:
    """A run of one of your conversations (any run, for a reviewer)."""
    return _run(_get_run_for_user(_caller(request).user, run_id))


@api.get(
    "/conversations",
    response={200: schemas.ConversationPage, **READ_ERRORS},
    summary="Your conversations, newest first",
    tags=["runs"],
)
def list_conversations(request: HttpRequest, page: Query[PageQuery]) -> dict[str, Any]:
    rows = Conversation.objects.owned_by(_caller(request).user).with_first_message()
    listed, next_cursor = _page(rows, page.cursor, page.limit)
    items = [
        {
            "id": c.session_id,
            # As the chats list shows it: its title, else its first message's words.
            "title": c.title or formatting.preview(c.first_words, TITLE_CHARS),
            "agent": c.agent_name or registry.default_agent_name(),
            "created": c.created,
            "updated": c.updated,
        }
        for c in listed
    ]
    return {"items": items, "next_cursor": next_cursor}


# What each refusal of a message is, over HTTP (a rate limit: 429 with Retry-After).
SEND_REFUSALS: dict[type[actions.Refusal], tuple[int, str]] = {
    actions.Busy: (409, "busy"),
    actions.InvalidMessage: (422, "invalid"),  # empty (after trimming) or too long
    actions.AgentGone: (409, "agent_gone"),
}


@api.post(
    "/conversations/{session_id}/runs",
    response={202: schemas.RunOut, **WRITE_ERRORS, 409: E, 429: E},
    summary="Send a message: start a run in one of your conversations",
    tags=["runs"],
)
def start_run(
    request: HttpRequest, session_id: SessionId, body: schemas.RunIn
) -> Status[dict[str, Any]] | HttpResponse:
    """As the chat's send: one run at a time per conversation (409 while one works or
    waits for approval), the message rate limit (429 with Retry-After)."""
    caller = _caller(request)
    require_scope(caller)
    conversation = _get_conversation_for_user(caller.user, session_id)
    try:
        run = actions.send(conversation, caller.user, body.text)
    except actions.RateLimited as limit:
        response = _error(request, 429, str(limit), "rate_limited")
        response["Retry-After"] = str(limit.retry_after)
        return response
    except actions.Refusal as refusal:
        status, code = SEND_REFUSALS.get(type(refusal), (409, "refused"))
        raise ApiError(status, str(refusal), code) from None
    run.conversation = conversation
    return Status(202, _run(run))
