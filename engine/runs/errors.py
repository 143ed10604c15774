"""What a run or a decision refuses: the errors callers catch (each carries its message for the
person who tried), and the sizes past which input is refused."""

from __future__ import annotations

MAX_INPUT_CHARS = 20_000
MAX_MESSAGE_CHARS = 2_000
# What a reviewer may write as a tool's output when answering as the tool.
MAX_RESPONSE_CHARS = 10_000


class DecisionRefused(Exception):
    """A decision that cannot be taken; the message says why, for the person who tried."""


class AlreadyDecided(DecisionRefused):
    pass


class RequestExpired(DecisionRefused):
    pass


class RequestClosed(DecisionRefused):
    pass


class NeedsAnotherReviewer(DecisionRefused):
    """Separation of duties: nobody approves a call in a conversation she started herself
    (unless `AGENTSITE_SELF_APPROVAL` is on)."""


# Finer kinds of refusal, for callers that answer each differently (the JSON API's status
# codes); each is still a DecisionRefused with the same message.
class RequestWithdrawn(AlreadyDecided):
    """The person who asked withdrew the request."""


class NotAllowed(DecisionRefused):
    """The person may not decide tool calls at all."""


class StaleArguments(DecisionRefused):
    """The arguments changed since they were shown (`seen_hash`)."""


class InvalidDecision(DecisionRefused):
    """The decision itself is not acceptable: an empty or too long answer as the tool,
    edited arguments where edits are forbidden or that do not fit the tool's schema."""


class RateLimited(Exception):
    """Too many messages from one person in a minute; the message says when to try again,
    `retry_after` in how many seconds."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RunFailure(Exception):
    """Ends a run as failed with this reason; nothing of the paused call executes."""
