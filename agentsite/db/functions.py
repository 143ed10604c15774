"""SQL functions the ORM lacks or makes slow on SQLite, each written for both databases."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db.models import CharField, Func


class UTCPeriod(Func):
    """The UTC hour ("2026-11-30 09") or day ("2026-11-30") a datetime falls in, as text.

    Django's TruncHour / TruncDate are Python functions called once per row on SQLite (a
    second per 100,000 rows here); SQLite stores a datetime as UTC text, so a prefix of it is
    the period, and PostgreSQL formats it natively.
    """

    output_field = CharField()

    def __init__(self, expression: Any, hourly: bool) -> None:
        self.hourly = hourly
        super().__init__(expression)

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        width = 13 if self.hourly else 10
        return self.as_sql(compiler, connection, template=f"substr(%(expressions)s, 1, {width})")

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        pattern = "YYYY-MM-DD HH24" if self.hourly else "YYYY-MM-DD"
        return self.as_sql(
            compiler,
            connection,
            template=f"to_char(%(expressions)s AT TIME ZONE 'UTC', '{pattern}')",
        )


def period_start(text: str) -> datetime:
    """The datetime of a `UTCPeriod` text."""
    form = "%Y-%m-%d %H" if len(text) > 10 else "%Y-%m-%d"
    return datetime.strptime(text, form).replace(tzinfo=UTC)
