"""The run engine's plain SQL: the claim of a run, made once per database from the model
(`agentsite.db.sql`).

Why plain SQL: every turn starts with a claim (`execute` and `resume`), one conditional
UPDATE that decides which caller wins; the ORM's compilation of that UPDATE cost several
times running it. The benchmark row is "turn overhead: one turn, one tool call" (goal ≤ 1.5×
the bare SDK, docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentsite.db.sql import column, per_vendor, placeholders, table
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
    return Statements(
        claim=f"UPDATE {runs} SET {changes} WHERE {where}",
        claim_state=(
            f"UPDATE {runs} SET {changes}, {consumed} = %s WHERE {where} AND NOT {consumed}"
        ),
        consume=(
            f"INSERT INTO {table(ConsumedState)} ({consumed_columns}) VALUES ({placeholders(4)}) "
            "ON CONFLICT DO NOTHING"
        ),
    )
