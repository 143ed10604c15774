"""The shared row writes every stage stands on: claiming a run (one conditional UPDATE), failing it
(`fail_sync`: its state consumed, its open requests cancelled, in one transaction), signing
a saved state, and the event that tells pages a run changed. Nothing here imports another
stage."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from agents import RunResultStreaming
from agents.memory.session import SessionABC
from django.db import connection, transaction
from django.utils import timezone
from django.utils.crypto import salted_hmac

from agentsite.db.hops import db_hop
from approvals.models import ApprovalRequest, ApprovalStatus
from conversations.session import open_session
from engine import events, heartbeat, signals
from engine.models import ACTIVE_STATUSES, AgentRun, ConsumedState, RunStatus
from engine.sql import statements
from tracing import recording

logger = logging.getLogger(__name__)

# The key, inside a saved state and so under its signature, that binds the state to its run
# and pause: {"run": id, "pause": n, "nonce": random hex}. States saved before it have none.
# (It sorts after "$schemaVersion", which stays first where staff read the state.)
STATE_BINDING = "$stateBinding"


@dataclass
class Outcome:
    events: list[events.Event] = field(default_factory=list)


LOOKBACK_ITEMS = 50


def usage_of(result: RunResultStreaming | None) -> dict[str, int]:
    if result is None:
        return {}
    usage = result.context_wrapper.usage
    return {
        "requests": usage.requests,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
    }


def trace_id_of(result: RunResultStreaming | None) -> str:
    trace = getattr(result, "trace", None)
    return str(getattr(trace, "trace_id", "") or "")


def sign_state(state: Any) -> str:
    canonical = json.dumps(state, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # The salt keeps the module's old name: runs that waited for a reviewer across the move
    # to engine/ must still verify.
    return salted_hmac("agentsite.runs.state", canonical, algorithm="sha256").hexdigest()


def run_updated(
    run_id: int, conversation_id: int, status: str, error: str = ""
) -> events.RunUpdated:
    return events.RunUpdated(
        run_id=run_id, conversation_id=conversation_id, status=status, error=error
    )


async def claim(run_id: int, expected: str) -> AgentRun | None:
    run = await db_hop(claim_sync)(run_id, expected)
    if run is not None:
        await events.publish([run_updated(run.pk, run.conversation_id, RunStatus.RUNNING)])
    return run


def claim_sync(run_id: int, expected: str) -> AgentRun | None:
    """Move the run from `expected` to running; only one caller ever wins."""
    # One conditional UPDATE decides who wins (engine/sql.py says why it is plain SQL).
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    with connection.cursor() as cursor:
        cursor.execute(
            statements().claim, [RunStatus.RUNNING, now, heartbeat.owner(), run_id, expected]
        )
        claimed = cursor.rowcount == 1
    if not claimed:
        logger.info("Run %s was not %s (or already taken); left alone.", run_id, expected)
        return None
    return load_run(run_id)


def load_run(run_id: int, *, lock: bool = False) -> AgentRun:
    """The run with its conversation and requester, as `select_related` loads them, in one
    plain statement (`engine.sql`: the ORM's compilation cost most of a claim); with `lock`,
    in a transaction, its row locked FOR NO KEY UPDATE until the transaction ends."""
    sql = statements()
    with connection.cursor() as cursor:
        cursor.execute(sql.load_run_locked if lock else sql.load_run, [run_id])
        row = cursor.fetchone()
    if row is None:
        raise AgentRun.DoesNotExist(f"No run {run_id}.")
    return sql.loaded_run(row)


def lock_run(run_id: int) -> tuple[str, int]:
    """In a transaction: the run's status and pause count, its row locked until the end of
    the transaction (FOR NO KEY UPDATE: the exporter's insert of the run's spans, which checks
    its foreign key to the run, does not wait for it)."""
    with connection.cursor() as cursor:
        cursor.execute(statements().lock_run, [run_id])
        status, pause = cursor.fetchone()
    return str(status), int(pause)


def claim_state_sync(run_id: int) -> tuple[AgentRun, bool] | None:
    """Move the run from resuming to running and take its saved state; only one caller ever
    wins. With the run: True if its pause's state was never taken before, False if a row says
    it was (a copy written back after its resumption or its run's failure)."""
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    sql = statements()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                sql.claim_state,
                [RunStatus.RUNNING, now, heartbeat.owner(), True, run_id, RunStatus.RESUMING],
            )
            claimed = cursor.rowcount == 1
        if not claimed:
            logger.info("Run %s was not resuming (or already taken); left alone.", run_id)
            return None
        run = load_run(run_id)
        with connection.cursor() as cursor:
            cursor.execute(sql.consume, [run.pk, run.pause_count, nonce(run.state), now])
            first_use = cursor.rowcount == 1
    if not first_use:
        logger.warning(
            "Run %s: the state of pause %s was taken before; refused.", run_id, run.pause_count
        )
    return run, first_use


def nonce(state: Any) -> str:
    """The nonce a saved state is bound by; "" for a state saved before states were bound."""
    binding = state.get(STATE_BINDING) if isinstance(state, dict) else None
    nonce = binding.get("nonce") if isinstance(binding, dict) else None
    return nonce if isinstance(nonce, str) else ""


def fail_sync(
    run_id: int,
    reason: str,
    result: RunResultStreaming | None = None,
    *,
    from_statuses: tuple[str, ...] = ACTIVE_STATUSES,
    quiet_since: Any = None,
    owned_by: str | None = None,
    status: str = RunStatus.FAILED,
    masked_input: str = "",
    error_detail: dict[str, Any] | None = None,
) -> bool:
    """Fail the run if it is still in one of `from_statuses`; True if this call failed it.
    (Or end it with another finished `status`: cancelled, guardrail; `reason` is its
    message, and `masked_input` replaces what the user wrote.) `error_detail`, for
    operators, is stored on the run and as a span of its trace.

    Its saved state goes with it: a failed run can never be resumed, whatever its status is
    set back to later."""
    now = timezone.now()
    changes: dict[str, Any] = {
        "status": status,
        "error": reason,
        "state": None,
        "state_signature": "",
        "streamed_text": "",
        "finished": now,
        "updated": now,
    }
    if masked_input:
        changes["input"] = masked_input
    if error_detail is not None:
        changes["error_detail"] = error_detail
    if result is not None:
        changes["usage"] = usage_of(result)
        if trace_id_of(result):
            changes["trace_id"] = trace_id_of(result)
    with transaction.atomic():
        matching = AgentRun.objects.filter(pk=run_id, status__in=from_statuses)
        if quiet_since is not None:
            matching = matching.stuck(quiet_since)
        if owned_by is not None:
            matching = matching.filter(process=owned_by)
        paused = matching.filter(pause_count__gt=0).values_list("pause_count", "state").first()
        failed = matching.update(**changes)
        if failed and paused is not None:
            # Its last pause's state is taken too: a copy of it written back is refused.
            pause, state = paused
            ConsumedState.objects.bulk_create(
                [ConsumedState(run_id=run_id, pause=pause, nonce=nonce(state))],
                ignore_conflicts=True,
            )
        if failed:
            # Whatever still waits in this run can no longer be decided.
            ApprovalRequest.objects.filter(run_id=run_id).pending().update(
                status=ApprovalStatus.CANCELLED
            )
            recording.follow_run(run_id)
            if error_detail is not None:
                recording.record_failure(run_id, reason, error_detail, now)
            signals.run_failed.send(sender=AgentRun, run_id=run_id, status=status, reason=reason)
    return bool(failed)


def session_of(run: AgentRun) -> SessionABC:
    """The run's conversation's session, on the branch the run was started on (a switch of
    the conversation meanwhile moves none of the run's items)."""
    conversation = run.conversation
    return open_session(
        conversation.session_id,
        owner=conversation.owner_id,
        agent_name=run.agent_name,
        conversation_pk=conversation.pk,
        branch=run.branch,
    )
