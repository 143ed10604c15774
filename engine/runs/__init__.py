"""The run engine: the only package that calls `Runner.run_streamed` and `RunState.from_json`.

Callers use `from engine import runs` and the names below; the modules are the stages of a
run's life, each importing only those below it (`errors` and `rows` at the bottom, `driving`
at the top), as the SDK keeps `run_internal/` under its `run.py`.

One chat turn:
1. `starting.start_run` stores a queued `AgentRun` and, after commit, hands it to the
   executor.
2. `driving.execute` claims it (queued -> running, `rows.claim`), streams the agent on the
   conversation's session and, at the end of the stream, either completes the run or pauses
   it (`saving`): in ONE transaction the signed `RunState`, one `ApprovalRequest` per
   interruption and the status "waiting". A Stop (`stopping`), a guardrail or a failure
   (`endings`) ends it otherwise; every final write goes through a database outage
   (`final`).
3. `decisions.decide` records a reviewer's decision. A conditional UPDATE lets exactly one
   decision per request win; when none of that pause is still pending, another conditional
   UPDATE claims the run (waiting -> resuming) and the executor resumes it. Nobody deciding
   in time is `expiry`'s.
4. `driving.resume` claims the snapshot (resuming -> running, consumed, and in the same
   transaction a `ConsumedState` row for its pause, unique) so that it, or any copy of it
   written back, is resumed once only, ever; `restoring` checks it (signature, bound to this
   run and pause, schema version, agent fingerprint, argument hashes) and applies the
   decisions from our own rows, matched by call id (a reviewer's edit: `edits`); and it
   streams on.
5. `recovery` deals with what dead processes left behind.

The database is the truth; events are published only after commit.
"""

from __future__ import annotations

from engine.runs.decisions import (
    FIELDS,
    REQUIRED,
    SELF_APPROVAL_REFUSED,
    SELF_RESPONSE_REFUSED,
    WITHDRAWN_MESSAGE,
    Action,
    Decision,
    UnfitDecision,
    adecide,
    awithdraw,
    closed_reason,
    decide,
    needs_another_reviewer,
    unfit_field,
    withdraw,
)
from engine.runs.driving import execute, resume, run_job
from engine.runs.edits import edit_refusal, sign_edit
from engine.runs.endings import GUARDRAIL_INPUT_MESSAGE, GUARDRAIL_OUTPUT_MESSAGE, guardrail_message
from engine.runs.errors import (
    MAX_INPUT_CHARS,
    MAX_MESSAGE_CHARS,
    MAX_RESPONSE_CHARS,
    AlreadyDecided,
    DecisionRefused,
    InvalidDecision,
    NeedsAnotherReviewer,
    NotAllowed,
    RateLimited,
    RequestClosed,
    RequestExpired,
    RequestWithdrawn,
    RunFailure,
    StaleArguments,
)
from engine.runs.expiry import (
    APPROVED_ON_EXPIRY,
    Expiry,
    expire_overdue,
    expire_overdue_async,
    expiry_policy,
    send_reminders,
)
from engine.runs.final import (
    ABANDONED_REASON,
    SHUTDOWN_REASON,
    fail_abandoned,
    fail_unfinished,
    interrupt,
)
from engine.runs.recovery import RESTART_REASON, Recovery, recover_orphans, recover_stuck_runs
from engine.runs.restoring import rejection_text
from engine.runs.rows import STATE_BINDING, sign_state
from engine.runs.starting import astart_run, start_run
from engine.runs.stopping import STOPPED_CALL_OUTPUT, STOPPED_REASON, astop, stop

__all__ = [
    "ABANDONED_REASON",
    "FIELDS",
    "REQUIRED",
    "APPROVED_ON_EXPIRY",
    "GUARDRAIL_INPUT_MESSAGE",
    "GUARDRAIL_OUTPUT_MESSAGE",
    "MAX_INPUT_CHARS",
    "MAX_MESSAGE_CHARS",
    "MAX_RESPONSE_CHARS",
    "RESTART_REASON",
    "SELF_APPROVAL_REFUSED",
    "SELF_RESPONSE_REFUSED",
    "SHUTDOWN_REASON",
    "STATE_BINDING",
    "STOPPED_CALL_OUTPUT",
    "STOPPED_REASON",
    "WITHDRAWN_MESSAGE",
    "Action",
    "AlreadyDecided",
    "Decision",
    "DecisionRefused",
    "Expiry",
    "InvalidDecision",
    "NeedsAnotherReviewer",
    "NotAllowed",
    "RateLimited",
    "Recovery",
    "RequestClosed",
    "RequestExpired",
    "RequestWithdrawn",
    "RunFailure",
    "StaleArguments",
    "UnfitDecision",
    "unfit_field",
    "adecide",
    "astart_run",
    "astop",
    "awithdraw",
    "closed_reason",
    "decide",
    "edit_refusal",
    "execute",
    "expire_overdue",
    "expire_overdue_async",
    "expiry_policy",
    "fail_abandoned",
    "fail_unfinished",
    "guardrail_message",
    "interrupt",
    "needs_another_reviewer",
    "recover_orphans",
    "recover_stuck_runs",
    "rejection_text",
    "resume",
    "run_job",
    "send_reminders",
    "sign_edit",
    "sign_state",
    "start_run",
    "stop",
    "withdraw",
]
