"""Query plans for tests that assert an index is used, on SQLite and PostgreSQL alike."""

from __future__ import annotations

from django.db import connection


def explain(sql: str) -> str:
    """The database's plan for `sql`, its lines joined by " | "."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("EXPLAIN QUERY PLAN " + sql)
            return " | ".join(str(row[-1]) for row in cursor.fetchall())
        cursor.execute("EXPLAIN " + sql)
        return " | ".join(str(row[0]) for row in cursor.fetchall())
