"""Migrating the test database back and forth, for the tests of a data migration: `migrate`
to where the rows are made (and the apps of that state), then to the migration under test;
`latest` in a `finally`, so the tests after it in the process find the schema they expect
(going back unapplies what depends on the target, other apps' later migrations too)."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.migrations.executor import MigrationExecutor


def migrate(targets: list[tuple[str, str | None]]) -> Any:
    """Migrate to `targets`; the apps of the state there."""
    MigrationExecutor(connection).migrate(targets)
    state = [target for target in targets if target[1] is not None]
    return MigrationExecutor(connection).loader.project_state(state).apps


def latest() -> None:
    """Every app at its latest migration."""
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
