"""The run engine's plain SQL: the claim of a run, made once per database from the model
(`agentsite.db.sql`).

Why plain SQL: every turn starts with a claim (`execute` and `resume`), one conditional
UPDATE that decides which caller wins; the ORM's compilation of that UPDATE cost several
times running it. The benchmark row is "turn overhead: one turn, one tool call" (goal ≤ 1.5×
the bare SDK, docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import connection

from agentsite.db.sql import Columns, column, columns, per_vendor, placeholders, qualified, table
from conversations.models import Conversation
from engine.models import AgentRun, ConsumedState


@dataclass(frozen=True)
class Statements:
    # Params: new status, updated, owner (the claiming process's identity, in the same
    # UPDATE: no round trip of its own), run id, expected status (turn overhead).
    claim: str
    # The same, and the state taken, once: params: new status, updated, owner, True, run id,
    # expected status (turn overhead; pause and resume). `runs.resume` runs it in one
    # transaction with `consume`.
    claim_state: str
    # The pause's `ConsumedState` row, or nothing (row count 0) when it exists: params: run
    # id, pause, nonce, created (pause and resume: in SQL, as the ORM's insert in a savepoint
    # cost about 0.35 ms a resume).
    consume: str
    # Params: run id. The run, its conversation and who asked (NULLs when nobody did), every
    # column of each, in the order of `runs`, `conversations`, `people` (turn overhead: the
    # ORM's `select_related(...).get()` of them cost 0.9 ms a claim, the statement 0.05 ms).
    load_run: str
    # The same, the run's row locked FOR NO KEY UPDATE on PostgreSQL (a decision).
    load_run_locked: str
    # Params: run id. The run's status and pause count, its row locked FOR NO KEY UPDATE on
    # PostgreSQL (SQLite's write transaction holds the database) (pause and resume).
    lock_run: str
    runs: Columns
    conversations: Columns
    people: Columns

    def loaded_run(self, row: tuple[object, ...]) -> AgentRun:
        """The run of a `load_run` row, its conversation and requester loaded with it (as
        `select_related` makes them)."""
        width, more = len(self.runs.fields), len(self.conversations.fields)
        run: AgentRun = self.runs.load(row[:width])
        AgentRun.conversation.field.set_cached_value(
            run, self.conversations.load(row[width : width + more])
        )
        AgentRun.requested_by.field.set_cached_value(run, self.people.load(row[width + more :]))
        return run


@per_vendor
def statements() -> Statements:
    assert AgentRun._meta.pk is not None
    status, consumed = column(AgentRun, "status"), column(AgentRun, "state_consumed")
    changes = (
        f"{status} = %s, {column(AgentRun, 'updated')} = %s, {column(AgentRun, 'process')} = %s"
    )
    where = f"{column(AgentRun, AgentRun._meta.pk.name)} = %s AND {status} = %s"
    runs = table(AgentRun)
    consumed_columns = ", ".join(
        column(ConsumedState, name) for name in ("run", "pause", "nonce", "created")
    )
    runs_columns = columns(AgentRun)
    conversations, people = columns(Conversation), columns(get_user_model())
    run_pk = qualified(AgentRun, AgentRun._meta.pk.name)
    load_run = (
        f"SELECT {runs_columns.select}, {conversations.select}, {people.select} "
        f"FROM {runs} INNER JOIN {conversations.table} "
        f"ON {qualified(AgentRun, 'conversation')} = "
        f"{conversations.table}.{conversations.pk_column} "
        f"LEFT OUTER JOIN {people.table} ON {qualified(AgentRun, 'requested_by')} = "
        f"{people.table}.{people.pk_column} WHERE {run_pk} = %s"
    )
    return Statements(
        load_run=load_run,
        load_run_locked=load_run
        + (f" FOR NO KEY UPDATE OF {runs}" if connection.vendor == "postgresql" else ""),
        lock_run=(
            f"SELECT {status}, {column(AgentRun, 'pause_count')} FROM {runs} WHERE {run_pk} = %s"
            + (" FOR NO KEY UPDATE" if connection.vendor == "postgresql" else "")
        ),
        runs=runs_columns,
        conversations=conversations,
        people=people,
        claim=f"UPDATE {runs} SET {changes} WHERE {where}",
        claim_state=(
            f"UPDATE {runs} SET {changes}, {consumed} = %s WHERE {where} AND NOT {consumed}"
        ),
        consume=(
            f"INSERT INTO {table(ConsumedState)} ({consumed_columns}) VALUES ({placeholders(4)}) "
            "ON CONFLICT DO NOTHING"
        ),
    )
