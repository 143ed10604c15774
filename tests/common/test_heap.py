"""A server or worker process freezes its startup heap: a full collection walks only what it
made since."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref
from pathlib import Path

from common import heap

ROOT = Path(__file__).resolve().parents[2]


def test_it_freezes_what_is_alive_and_collects_what_comes_after() -> None:
    class Cycle:
        me: object

    before = gc.get_freeze_count()
    try:
        frozen = heap.freeze_startup_heap()
        # (Other threads may free frozen objects meanwhile: the count only ever falls.)
        assert frozen > before
        assert frozen >= gc.get_freeze_count() > before
        # Garbage made after the freeze is collected as always (by this collection, or by
        # one the allocations started on their own meanwhile).
        made = Cycle()
        made.me = made
        alive = weakref.ref(made)
        del made
        gc.collect()
        assert alive() is None
        # No collection unfreezes: frozen objects leave only when freed by their count.
        assert gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


def test_the_asgi_application_freezes_the_heap_it_starts_with() -> None:
    probe = (
        "import gc; before = gc.get_freeze_count(); import agentsite.asgi; "
        "print(before, gc.get_freeze_count())"
    )
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "agentsite.settings", "DEBUG": "1"}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    before, after = (int(n) for n in done.stdout.split()[-2:])
    assert before == 0
    assert after > 50_000  # Django, Channels and the SDK, imported
