"""What the API reads and writes, as pydantic schemas (the OpenAPI document is made from
them). Every value here is data: text people or the model wrote is returned as text, never
rendered."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from ninja import Field, Schema
from pydantic import ConfigDict

MAX_LIMIT = 100
# Text without NUL characters, which PostgreSQL cannot store: refused as invalid input.
NO_NUL = r"^[^\x00]*$"


NoNulText = Annotated[str, Field(pattern=NO_NUL)]


def _names_without_nul(schema: dict[str, Any]) -> None:
    """An object's keys as JSON Schema says "every key" (`propertyNames`): pydantic writes
    `patternProperties`, which leaves a key that does not match it unconstrained."""
    patterns = schema.pop("patternProperties", None)
    if patterns:
        [(pattern, values)] = patterns.items()
        schema["propertyNames"] = {"pattern": pattern}
        schema["additionalProperties"] = values


# Any JSON value whose strings (keys included, at any depth) hold no NUL: said in the OpenAPI
# document as a recursive schema, so what it allows is what the server takes.
type JsonObject = Annotated[dict[NoNulText, Json], Field(json_schema_extra=_names_without_nul)]
type Json = NoNulText | int | float | bool | None | list[Json] | JsonObject


class Error(Schema):
    detail: str = Field(description="What went wrong, for people.")
    code: str = Field(description="A stable word for programs: not_found, already_decided, …")
    errors: list[dict[str, Any]] | None = Field(
        default=None,
        description=(
            "For invalid input: each problem, as pydantic reports it, located where the"
            ' request has it (`["body", "seen_hash"]`, `["query", "limit"]`).'
        ),
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


# Text with something besides whitespace (what `runs.Decision` strips: Python's whitespace and
# JSON Schema's alike), and no NUL.
NOT_BLANK = r"^[^\x00]*[^\x00\s\x1c-\x1f\x85\ufeff][^\x00]*$"


class _Deciding(Schema):
    """What every decision carries; each action's own fields are in its schema, and no other
    field is accepted (`runs.FIELDS`: the message goes with a rejection only, and so on)."""

    model_config = ConfigDict(extra="forbid")

    seen_hash: str = Field(
        min_length=1,
        max_length=64,
        pattern=NO_NUL,
        description="The arguments_hash of the request you read.",
    )
    note: str = Field(
        default="",
        max_length=2_000,
        pattern=NO_NUL,
        description="For reviewers only (never sent to the agent).",
    )


class Approve(_Deciding):
    action: Literal["approve"]


class ApproveEdited(_Deciding):
    action: Literal["approve_edited"]
    arguments: JsonObject = Field(
        description="The arguments the tool runs with instead (they must fit its schema)."
    )


class Respond(_Deciding):
    action: Literal["respond"]
    response: str = Field(
        max_length=10_000,
        pattern=NOT_BLANK,
        description="What the agent reads as the tool's output.",
    )


class Reject(_Deciding):
    action: Literal["reject"]
    message: str = Field(
        default="", max_length=2_000, pattern=NO_NUL, description="Why, for the agent."
    )


# One schema per action, told apart by `action` (a discriminated union in the OpenAPI
# document): a field that does not go with the action is invalid by the schema itself.
DecisionIn = Annotated[Approve | ApproveEdited | Respond | Reject, Field(discriminator="action")]


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
