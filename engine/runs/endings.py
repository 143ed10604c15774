"""A run that ends without completing or pausing: a guardrail's tripwire (the run ends as
"guardrail", the refused message taken back out of the session) or an error (a sentence for
the user, a detail for operators, an unanswered message taken back)."""

from __future__ import annotations

import json
import logging
from typing import Any

from agents import RunResultStreaming
from agents.exceptions import InputGuardrailTripwireTriggered, OutputGuardrailTripwireTriggered

from conversations.items import is_user_message, message_text
from engine import model_errors
from engine.models import AgentRun, RunStatus
from engine.runs import errors, final
from tracing import redaction

logger = logging.getLogger(__name__)


GUARDRAIL_INPUT_MESSAGE = (
    "Your message was not answered: a safety check of this agent refused it ({name})."
)
GUARDRAIL_OUTPUT_MESSAGE = "The agent's reply was held back by a safety check ({name})."


def guardrail_message(
    tripped: InputGuardrailTripwireTriggered | OutputGuardrailTripwireTriggered,
) -> str:
    """What the user reads when a guardrail ends the run: the guardrail's own words (its
    `output_info`, a text or a mapping with a "message"), else a plain sentence naming it."""
    result = tripped.guardrail_result
    info = result.output.output_info
    if isinstance(info, dict):
        info = info.get("message")
    if isinstance(info, str) and info.strip():
        return info.strip()[: errors.MAX_MESSAGE_CHARS]
    name = result.guardrail.get_name() if hasattr(result.guardrail, "get_name") else "guardrail"
    if isinstance(tripped, InputGuardrailTripwireTriggered):
        return GUARDRAIL_INPUT_MESSAGE.format(name=name)
    return GUARDRAIL_OUTPUT_MESSAGE.format(name=name)


async def end_by_guardrail(
    run: AgentRun,
    session: Any,
    tripped: InputGuardrailTripwireTriggered | OutputGuardrailTripwireTriggered,
    result: RunResultStreaming | None,
) -> None:
    """A guardrail that trips ends the run as "guardrail", with its message for the user.

    An input guardrail refused the message: the SDK had already stored it in the session,
    where the agent (and every guardrail, which reads the whole history) would meet it again
    on each later turn; it is taken out, and the run keeps it masked (card numbers, emails,
    ... as traces mask them), so a refused message is not kept as it was pasted."""
    message = guardrail_message(tripped)
    logger.info("Run %s: ended by a guardrail: %s", run.pk, message)
    masked = ""
    # Input guardrails run on a run's first turn only: a resumed run's turn holds executed
    # calls, which are never taken back.
    if isinstance(tripped, InputGuardrailTripwireTriggered) and run.pause_count == 0:
        try:
            await _take_back_input(session, run.input)
        except Exception:
            logger.exception("Run %s: the refused message could not be taken out", run.pk)
        masked = redaction.mask_text(run.input)
    await final.fail(
        run,
        message,
        result,
        status=RunStatus.GUARDRAIL,
        from_statuses=(RunStatus.RUNNING,),
        masked_input=masked,
    )


async def _take_back_input(session: Any, text: str) -> None:
    """Pop the session's newest items back to and with the user's message `text`, if it is
    the newest user message (items of other runs are never touched)."""
    items = await session.get_items(20)
    for index in range(len(items) - 1, -1, -1):
        if is_user_message(items[index]):
            if message_text(items[index]).strip() != text.strip():
                return
            for _ in range(len(items) - index):
                await session.pop_item()
            return


# What the log line of a failed run says: the detail without the provider's message, which
# may quote what the user wrote (the run's admin page shows it whole).
LOGGED_DETAIL = (
    "kind",
    "exception",
    "status_code",
    "request_id",
    "error_type",
    "error_code",
    "attempts",
    "model",
    "endpoint",
    "retry_after",
    "timeout_seconds",
)


async def end_by_error(
    run: AgentRun, session: Any, exc: Exception, result: RunResultStreaming | None
) -> None:
    """A model call (or anything else in the run) failed: the run fails with a sentence the
    user understands (`model_errors`), the detail is kept for operators (the run's
    `error_detail`, a span of its trace, one log line), and nothing of the failed answer
    stays: the SDK stores a response's items only once it completed. When nothing of the
    turn was stored but the user's message, it is taken out of the session too, so "Send
    again" does not repeat it to the agent; the chat still shows it with the failed run."""
    failure = model_errors.describe(exc)
    logged = {key: failure.detail[key] for key in LOGGED_DETAIL if key in failure.detail}
    logger.warning("Run %s failed: %s", run.pk, json.dumps(logged, default=str))
    if run.pause_count == 0:
        # A resumed run's turn holds calls that executed: never taken back.
        try:
            await _take_back_unanswered(session, run.input)
        except Exception:
            logger.exception("Run %s: its unanswered message could not be taken out", run.pk)
    await final.fail(run, failure.message, result, error_detail=failure.detail)


async def _take_back_unanswered(session: Any, text: str) -> bool:
    """Pop the user's message `text` if it is the session's newest item (nothing of its
    turn was stored after it: no tool ran); True if it was popped."""
    newest = await session.get_items(1)
    if not newest or not is_user_message(newest[-1]):
        return False
    if message_text(newest[-1]).strip() != text.strip():
        return False
    await session.pop_item()
    return True
