"""A leave desk: the example agent of docs/agents.md, "Your first agent, without a model key".

Booking more than two days waits for a reviewer; the balance and the booking are the asker's
own, read from the run's context. Bookings are kept in this process's memory, keyed by the
call, to keep the example one file: a real tool writes your models.
"""

from __future__ import annotations

from datetime import date
from typing import Annotated, Any

from agents import Agent, RunContextWrapper, function_tool
from agents.tool_context import ToolContext
from pydantic import Field

from engine.context import RequesterUnavailable, RunContext, requesting_user_sync

DAYS_PER_YEAR = 25
# (user id, first day, days) by the call that booked it: a call replayed books nothing twice.
BOOKINGS: dict[str, tuple[int, date, int]] = {}


def days_left(user_id: int) -> int:
    booked = sum(days for owner, _, days in BOOKINGS.values() if owner == user_id)
    return DAYS_PER_YEAR - booked


@function_tool
def leave_balance(ctx: ToolContext[RunContext]) -> str:
    """How many days of leave the person asking has left this year."""
    try:
        user = requesting_user_sync(ctx)
    except RequesterUnavailable as refusal:
        return str(refusal)  # an answer for the agent to relay, not a failure
    return f"{user.get_username()} has {days_left(user.pk)} days of leave left."


async def longer_than_two_days(
    ctx: RunContextWrapper[RunContext], params: dict[str, Any], call_id: str
) -> bool:
    """A reviewer approves any leave longer than two days."""
    return int(params.get("days", 0)) > 2


@function_tool(needs_approval=longer_than_two_days)
def book_leave(
    ctx: ToolContext[RunContext],
    days: Annotated[int, Field(gt=0, le=DAYS_PER_YEAR, description="Working days off")],
    # A string, not a `date`: see "Arguments" below the example in docs/agents.md.
    first_day: Annotated[str, Field(description="The first day off, YYYY-MM-DD")],
) -> str:
    """Book leave for the person asking, from its first day off."""
    try:
        user = requesting_user_sync(ctx)
    except RequesterUnavailable as refusal:
        return str(refusal)
    try:
        start = date.fromisoformat(first_day)
    except ValueError:
        return f"{first_day} is not a date; nothing was booked."
    if ctx.tool_call_id not in BOOKINGS:
        if days > days_left(user.pk):
            return f"Only {days_left(user.pk)} days are left; nothing was booked."
        BOOKINGS[ctx.tool_call_id] = (user.pk, start, days)
    return f"Booked {days} days from {start:%d %B %Y}; {days_left(user.pk)} days left."


leave_desk = Agent[RunContext](
    name="Leave desk",
    instructions="You book leave for the employee who asks. Check the balance first.",
    tools=[leave_balance, book_leave],
)
