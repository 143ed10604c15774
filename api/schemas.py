"""What the API reads and writes, as pydantic schemas (the OpenAPI document is made from
them). Every value here is data: text people or the model wrote is returned as text, never
rendered."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from ninja import Field, Schema
from pydantic import AfterValidator

MAX_LIMIT = 100
# Text without NUL characters, which PostgreSQL cannot store: refused as invalid input.
NO_NUL = r"^[^\x00]*$"


def _no_nul(value: Any) -> Any:
    """`value` (JSON), refused when a string in it holds a NUL character."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("Text may not contain NUL characters.")
    elif isinstance(value, dict):
        for key, item in value.items():
            _no_nul(key)
            _no_nul(item)
    elif isinstance(value, list):
        for item in value:
            _no_nul(item)
    return value


Json = Annotated[Any, AfterValidator(_no_nul)]


class Error(Schema):
    detail: str = Field(description="What went wrong, for people.")
    code: str = Field(description="A stable word for programs: not_found, already_decided, …")
    errors: list[dict[str, Any]] | None = Field(
        default=None, description="For invalid input: each problem, as pydantic reports it."
    )
    limit: int | None = Field(
        default=None, description="For a body too large (413): the most bytes it may have."
    )


class Argument(Schema):
    name: str
    label: str
    hint: str
    value: str = Field(description="The value as the inbox shows it (money as money).")
    kind: Literal["text", "long", "money", "number", "empty", "json"]


class Fact(Schema):
    label: str
    value: str
    warning: bool


class Verdict(Schema):
    action: str = Field(description="approve, reject or ask (a person decides).")
    reason: str
    policy_id: int | None
    policy_name: str
    message: str
    failed: bool


class RunRef(Schema):
    id: int
    status: str
    agent: str
    conversation: str = Field(description="The conversation's public session id.")


# What kind of tool a request's call is for (`approvals.models.ToolKind`).
ToolKindName = Literal["function", "mcp", "hosted_mcp", "shell", "apply_patch", "other"]


class Allowed(Schema):
    decidable: bool = Field(description="The request still waits and has not expired.")
    editable: bool = Field(description="Its arguments may be edited before approving.")
    answerable: bool = Field(
        description="It may be answered as the tool (respond): not a hosted MCP server's call."
    )
    needs_another_reviewer: bool = Field(
        description="You started this conversation: you may reject it, not approve or answer."
    )


class RequestSummary(Schema):
    id: int
    status: str
    tool: str
    kind: ToolKindName = Field(
        description="The kind of tool: function, mcp (a local MCP server's tool), hosted_mcp "
        "(a hosted MCP server's), shell (`arguments`: the shell call's action), apply_patch "
        "(`arguments`: the file operation with its diff), other."
    )
    server: str = Field(
        description="The MCP server of an mcp or hosted_mcp tool (its name, or a hosted "
        "server's label); empty for other kinds."
    )
    agent: str
    call: str = Field(description="The call in one line, as the inbox shows it.")
    risk: str
    asked_by: str | None
    created: datetime
    expires_at: datetime
    run_id: int


class RequestPage(Schema):
    items: list[RequestSummary]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next, older page.")


class RequestDetail(RequestSummary):
    call_id: str
    origin: str
    arguments: Any = Field(description="The arguments as the model sent them.")
    arguments_hash: str = Field(description="Send it back as `seen_hash` when you decide.")
    arguments_intact: bool
    labelled_arguments: list[Argument]
    arguments_schema: dict[str, Any] = Field(description="The tool's JSON schema.")
    description: str
    risk_declared: bool
    facts: list[Fact] | None = Field(description="What the call would touch; null: unavailable.")
    policy: Verdict | None = Field(description="What the approval policies said at the pause.")
    policy_now: Verdict | None = Field(description="What they would say now, when it differs.")
    decided_by: str | None
    decided_at: datetime | None
    run: RunRef
    allowed: Allowed


class DecisionIn(Schema):
    action: Literal["approve", "approve_edited", "respond", "reject"]
    seen_hash: str = Field(
        min_length=1,
        max_length=64,
        pattern=NO_NUL,
        description="The arguments_hash of the request you read.",
    )
    arguments: dict[str, Json] | None = Field(
        default=None, description="approve_edited: the arguments the tool runs with instead."
    )
    response: str | None = Field(
        default=None,
        max_length=10_000,
        pattern=NO_NUL,
        description="respond: what the agent reads as output.",
    )
    message: str = Field(
        default="", max_length=2_000, pattern=NO_NUL, description="reject: for the agent."
    )
    note: str = Field(
        default="",
        max_length=2_000,
        pattern=NO_NUL,
        description="any action: for reviewers only (never sent to the agent).",
    )


class DecisionOut(Schema):
    id: int
    request_id: int
    kind: str = Field(
        description="approved, edited, rejected, responded, expired, expiry_approved (approved "
        "by the tool's expiry policy: nobody decided in time), withdrawn"
    )
    approved: bool
    reviewer: str | None
    policy_name: str
    message: str
    note: str
    always: bool
    arguments_hash: str
    edited_arguments: Any
    created: datetime


class RunRequest(Schema):
    id: int
    tool: str
    kind: ToolKindName
    server: str
    status: str
    created: datetime
    expires_at: datetime


class RunOut(Schema):
    id: int
    status: str
    agent: str
    conversation: str
    input: str
    error: str
    output: str | None = Field(description="The final answer, once the run has finished.")
    created: datetime
    updated: datetime
    finished: datetime | None
    requests: list[RunRequest]


class RunIn(Schema):
    text: str = Field(min_length=1, max_length=20_000, pattern=NO_NUL)


class ConversationOut(Schema):
    id: str = Field(description="The public session id.")
    title: str
    agent: str
    created: datetime
    updated: datetime


class ConversationPage(Schema):
    items: list[ConversationOut]
    next_cursor: str | None
