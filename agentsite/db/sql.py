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
        pk = model._meta.pk
        assert pk is not None
        self._by_name = {field.name: field for field in self.fields} | {"pk": pk}
        self._quoted = {name: quote(_column(field)) for name, field in self._by_name.items()}
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
        found = self.filter({"pk": pk})
        if not found:
            raise self.model.DoesNotExist(f"No {self.model.__name__} {pk}.")  # type: ignore[attr-defined]
        return found[0]

    def filter(self, where: dict[str, Any], order_by: Sequence[str] = ()) -> list[Any]:
        """`objects.filter(**where).order_by(*order_by)`, in one plain statement (none for an
        empty `__in`). The lookups are `_condition`'s."""
        condition = self._condition(where)
        if condition is None:
            return []
        tests, params = condition
        order = (
            f" ORDER BY {', '.join(self._quoted[name] for name in order_by)}" if order_by else ""
        )
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {self.select} FROM {self.table} WHERE {tests}{order}", params)
            return [self.load(row) for row in cursor.fetchall()]

    def exists(self, where: dict[str, Any]) -> bool:
        """`objects.filter(**where).exists()`, in one plain statement."""
        condition = self._condition(where)
        if condition is None:
            return False
        tests, params = condition
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT 1 FROM {self.table} WHERE {tests} LIMIT 1", params)
            return cursor.fetchone() is not None

    def update(self, pk: Any, changes: dict[str, Any], where: dict[str, Any] | None = None) -> int:
        """`objects.filter(pk=pk, **where).update(**changes)`, in plain SQL: how many rows
        changed. (A None change writes NULL, as the ORM's `update` does, a JSON field's too.)"""
        condition = self._condition({"pk": pk, **(where or {})})
        assert condition is not None
        tests, params = condition
        sets = ", ".join(f"{self._quoted[name]} = %s" for name in changes)
        values = [self.prepared(name, value) for name, value in changes.items()]
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {self.table} SET {sets} WHERE {tests}", [*values, *params])
            return int(cursor.rowcount)

    def _condition(self, where: dict[str, Any]) -> tuple[str, list[Any]] | None:
        """The WHERE clause and its parameters of the lookups `name` (equal), `name__gt`,
        `name__lte` and `name__in` (`pk` names the primary key; a related field takes an
        instance or a key); None when an `__in` has no value, which no row meets."""
        tests, params = [], []
        for lookup, value in where.items():
            name, _, operator = lookup.partition("__")
            if operator == "in":
                values = [self.prepared(name, each) for each in value]
                if not values:
                    return None
                tests.append(f"{self._quoted[name]} IN ({placeholders(len(values))})")
                params.extend(values)
            else:
                tests.append(f"{self._quoted[name]} {_OPERATORS[operator]} %s")
                params.append(self.prepared(name, value))
        return " AND ".join(tests), params

    def prepared(self, name: str, value: Any) -> Any:
        """`value` as the field `name` writes it (a related instance: its key)."""
        field = self._by_name[name]
        if field.remote_field is not None and isinstance(value, models.Model):
            value = value.prepare_database_save(field)
        return field.get_db_prep_save(value, connection)

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


_OPERATORS = {"": "=", "gt": ">", "lte": "<="}  # and "in", written by `_condition`


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
