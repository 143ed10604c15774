"""How the apps write the little plain SQL they keep (`conversations/sql.py`, `engine/sql.py`,
`tracing/sql.py`), one way: table and column names from the models' `_meta`, quoted by the
database (`connection.ops.quote_name`), each app's statements made once per database vendor.

Plain SQL is kept only where a row of docs/benchmarks.md needs it; each statement says which.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Protocol

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


class PerVendor[T](Protocol):
    def __call__(self, vendor: str | None = None) -> T: ...


def per_vendor[T](make: Callable[[], T]) -> PerVendor[T]:
    """`make()` run once per database vendor, its result kept (the statements of an app).
    The vendor is the default connection's, or `vendor` from a caller that holds that
    connection already (a lookup in Django's per-thread handler costs a few µs)."""
    made: dict[str, T] = {}

    @functools.wraps(make)
    def statements(vendor: str | None = None) -> T:
        if vendor is None:
            vendor = connection.vendor
        if vendor not in made:
            made[vendor] = make()
        return made[vendor]

    return statements


class Columns:
    """A model's concrete fields in plain SQL, read and written as the ORM does it: a row read
    goes through the converters the ORM's compiler applies (the backend's, then the field's)
    and becomes an instance with `from_db`; a value written goes through the field's
    `get_db_prep_save` (after `pre_save` for an insert: `auto_now`, `auto_now_add`). What is
    saved is the ORM's compilation of the statement, which for a wide model like `AgentRun`
    costs ten times running it (`columns` keeps one per model and vendor)."""

    def __init__(self, model: type[models.Model]) -> None:
        self.model = model
        self.fields: tuple[models.Field[Any, Any], ...] = tuple(model._meta.concrete_fields)
        self.attnames = tuple(field.attname for field in self.fields)
        self.table = table(model)
        self.select = ", ".join(f"{self.table}.{quote(_column(field))}" for field in self.fields)
        self._converters = []
        for index, field in enumerate(self.fields):
            col = field.get_col(model._meta.db_table)
            found = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
            if found:
                self._converters.append((index, tuple(found), col))
        self._by_name = {field.name: field for field in self.fields}
        self._updates: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}
        pk = model._meta.pk
        assert pk is not None
        self._pk_index = self.attnames.index(pk.attname)
        self.pk_column = quote(_column(pk))
        # Every column but the key, which the database makes and returns (SQLite 3.35+ and
        # PostgreSQL have RETURNING; Django itself uses it on both).
        self._written = [field for field in self.fields if field is not pk]
        names = ", ".join(quote(_column(field)) for field in self._written)
        self._insert = (
            f"INSERT INTO {self.table} ({names}) VALUES ({placeholders(len(self._written))}) "
            f"RETURNING {self.pk_column}"
        )

    def load(self, values: Sequence[Any]) -> Any:
        """The instance of a row's values, in the order of `select` (None for a row of NULLs
        from an outer join: its primary key is NULL)."""
        row = list(values)
        if row[self._pk_index] is None:
            return None
        for index, converters, col in self._converters:
            value = row[index]
            for converter in converters:
                value = converter(value, col, connection)
            row[index] = value
        return self.model.from_db(connection.alias, self.attnames, row)

    def get(self, pk: Any) -> Any:
        """`objects.get(pk=pk)`, in one plain statement (raising the model's DoesNotExist)."""
        found = self.where(f"{self.table}.{self.pk_column} = %s", [pk])
        if not found:
            raise self.model.DoesNotExist(f"No {self.model.__name__} {pk}.")  # type: ignore[attr-defined]
        return found[0]

    def where(self, condition: str, params: Sequence[Any], then: str = "") -> list[Any]:
        """The instances of the rows that meet `condition` (SQL on this table's quoted
        columns), `then` (e.g. an ORDER BY) after it."""
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {self.select} FROM {self.table} WHERE {condition} {then}", params
            )
            return [self.load(row) for row in cursor.fetchall()]

    def _test(self, lookup: str) -> str:
        name, _, op = lookup.partition("__")
        return f"{quote(_column(self._by_name[name]))} {_OPERATORS[op]} %s"

    def exists(self, equal: dict[str, Any]) -> bool:
        """`filter(**equal).exists()` for plain equalities, in one plain statement."""
        tests = " AND ".join(self._test(name) for name in equal)
        params = [self.prepared(name, value) for name, value in equal.items()]
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT 1 FROM {self.table} WHERE {tests} LIMIT 1", params)
            return cursor.fetchone() is not None

    def prepared(self, name: str, value: Any) -> Any:
        """`value` as the field `name` writes it (a related instance: its key)."""
        field = self._by_name[name]
        if field.remote_field is not None and isinstance(value, models.Model):
            value = value.prepare_database_save(field)
        return field.get_db_prep_save(value, connection)

    def update(self, pk: Any, changes: dict[str, Any], where: dict[str, Any] | None = None) -> int:
        """`filter(pk=pk, **where).update(**changes)`, in plain SQL: how many rows changed.
        (A None change writes NULL, as the ORM's `update` does, a JSON field's too.) `where`
        takes equalities, and the lookups `name__gt` and `name__lte`."""
        where = where or {}
        key = (tuple(changes), tuple(where))
        sql = self._updates.get(key)
        if sql is None:
            sets = ", ".join(f"{quote(_column(self._by_name[name]))} = %s" for name in changes)
            tests = "".join(f" AND {self._test(lookup)}" for lookup in where)
            sql = self._updates[key] = (
                f"UPDATE {self.table} SET {sets} WHERE {self.pk_column} = %s{tests}"
            )
        params = [self.prepared(name, value) for name, value in changes.items()]
        params.append(pk)
        params.extend(
            self.prepared(lookup.split("__")[0], value) for lookup, value in where.items()
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return int(cursor.rowcount)

    def insert(self, instance: models.Model) -> None:
        """INSERT `instance` (its primary key made by the database) and give it its key, as
        `save()` of a new instance does, without signals (the models written so send none)."""
        values = [
            field.get_db_prep_save(field.pre_save(instance, add=True), connection)
            for field in self._written
        ]
        with connection.cursor() as cursor:
            cursor.execute(self._insert, values)
            key = cursor.fetchone()[0]
        instance.pk = key
        instance._state.adding = False
        instance._state.db = connection.alias


_OPERATORS = {"": "=", "gt": ">", "lte": "<="}


def _column(field: models.Field[Any, Any]) -> str:
    assert field.column is not None
    return field.column


def quote(name: str) -> str:
    return connection.ops.quote_name(name)


_columns: dict[tuple[str, type[models.Model]], Columns] = {}


def columns(model: type[models.Model]) -> Columns:
    """The `Columns` of `model` on this database vendor, made once."""
    key = (connection.vendor, model)
    if key not in _columns:
        _columns[key] = Columns(model)
    return _columns[key]
