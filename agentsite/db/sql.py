"""How the apps write the little plain SQL they keep (`conversations/sql.py`, `engine/sql.py`,
`tracing/sql.py`), one way: table and column names from the models' `_meta`, quoted by the
database (`connection.ops.quote_name`), each app's statements made once per database vendor.

Plain SQL is kept only where a row of docs/benchmarks.md needs it; each statement says which.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from django.db import connection, models


def table(model: type[models.Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def column(model: type[models.Model], name: str) -> str:
    """The quoted column of the field `name` (a foreign key's `_id` column for its name)."""
    field = model._meta.get_field(name)
    assert isinstance(field, models.Field) and field.column
    return connection.ops.quote_name(field.column)


def qualified(model: type[models.Model], name: str) -> str:
    return f"{table(model)}.{column(model, name)}"


def placeholders(count: int) -> str:
    return ", ".join(["%s"] * count)


def json_placeholder() -> str:
    """A JSON value's placeholder: PostgreSQL casts the text to `jsonb` as the ORM does."""
    return "%s::jsonb" if connection.vendor == "postgresql" else "%s"


def per_vendor[T](make: Callable[[], T]) -> Callable[[], T]:
    """`make()` run once per database vendor, its result kept (the statements of an app)."""
    made: dict[str, T] = {}

    @functools.wraps(make)
    def statements() -> T:
        vendor = connection.vendor
        if vendor not in made:
            made[vendor] = make()
        return made[vendor]

    return statements
