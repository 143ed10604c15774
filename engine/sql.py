"""The run engine's plain SQL: the claim of a run and the load of the claimed run, made once
per database from the models (`agentsite.db.sql`).

Why plain SQL: every turn starts with a claim (`execute` and `resume`): one conditional
UPDATE that decides which caller wins, then the run with its conversation. The ORM's
compilation of these cost several times running them (the load: 0.42 ms against 0.14 ms),
which took "turn overhead: one turn, one tool call" past its goal (≤ 1.5× the bare SDK,
docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection

from agentsite.db.sql import column, per_vendor, qualified, table
from approvals.models import AgentRun
from conversations.models import Conversation


@dataclass(frozen=True)
class Statements:
    # Params: new status, updated, run id, expected status (turn overhead).
    claim: str
    # The same, and the state taken, once: params: new status, updated, True, run id,
    # expected status (turn overhead; pause and resume).
    claim_state: str
    # Params: run id. The run's columns, and its conversation's session id and owner as
    # `conversation__session_id` and `conversation__owner_id` (turn overhead).
    claimed_run: str


@per_vendor
def statements() -> Statements:
    assert AgentRun._meta.pk is not None
    status, consumed = column(AgentRun, "status"), column(AgentRun, "state_consumed")
    changes = f"{status} = %s, {column(AgentRun, 'updated')} = %s"
    run_pk = column(AgentRun, AgentRun._meta.pk.name)
    where = f"{run_pk} = %s AND {status} = %s"
    runs, conversations = table(AgentRun), table(Conversation)
    quote = connection.ops.quote_name
    selected = [qualified(AgentRun, field.name) for field in AgentRun._meta.concrete_fields]
    selected += [
        f"{qualified(Conversation, 'session_id')} AS {quote('conversation__session_id')}",
        f"{qualified(Conversation, 'owner')} AS {quote('conversation__owner_id')}",
    ]
    return Statements(
        claim=f"UPDATE {runs} SET {changes} WHERE {where}",
        claim_state=(
            f"UPDATE {runs} SET {changes}, {consumed} = %s WHERE {where} AND NOT {consumed}"
        ),
        claimed_run=(
            f"SELECT {', '.join(selected)} FROM {runs} JOIN {conversations} "
            f"ON {qualified(Conversation, 'id')} = {qualified(AgentRun, 'conversation')} "
            f"WHERE {qualified(AgentRun, AgentRun._meta.pk.name)} = %s"
        ),
    )


def claimed_run(run_id: int) -> AgentRun:
    """The run, with what the engine reads of its conversation: its other fields load on
    first use, as deferred fields do."""
    # A raw query converts each of the run's columns as the ORM would (JSON, times).
    run = next(iter(AgentRun.objects.raw(statements().claimed_run, [run_id])))
    extra = vars(run)  # the conversation's columns, as attributes of the raw row
    run.conversation = Conversation.from_db(
        connection.alias,
        ["id", "session_id", "owner_id"],
        [run.conversation_id, extra["conversation__session_id"], extra["conversation__owner_id"]],
    )
    return run
