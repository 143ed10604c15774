"""`python -m bench [--quick] [--only NAME] [--check]`: measure agentsite against the SDK, print
one table.

`--check` measures only the rows held to a goal, briefly, each against its goal and margin,
and exits with 1 when one is worse than both (`bench/check.py`).

The process gets a throwaway SQLite file database, migrated here, the offline settings (no
model key, so nothing can reach a network) and the benchmark agents of `bench.agents`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import shutil
import sqlite3
import sys
import tempfile
import time
import warnings
from pathlib import Path

# Name -> module; each module has `run(config) -> list[Row]`.
BENCHMARKS = {
    "sessions": "bench.sessions",
    "turn": "bench.turn",
    "http": "bench.http_turn",
    "approvals": "bench.approvals",
    "tracing": "bench.trace_cost",
    "concurrency": "bench.concurrency",
    "pages": "bench.pages",
    "dashboard": "bench.dashboard",
    "asgi": "bench.asgi",
    "cpu": "bench.cpu",
    "push": "bench.push",
    "scaling": "bench.scaling",
    "conversations": "bench.conversations",
    "soak": "bench.soak",
}


def setup_django(workdir: Path) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "agentsite.settings"
    os.environ.setdefault("DEBUG", "1")  # the offline settings; see the query log below
    os.environ["DATABASE_URL"] = f"sqlite:///{workdir / 'agentsite.sqlite3'}"
    from bench.agents import REGISTRY

    os.environ["AGENTSITE_AGENTS"] = ",".join(f"{k}={v}" for k, v in REGISTRY.items())
    os.environ["AGENTSITE_EXECUTOR"] = "inprocess"
    os.environ["AGENTSITE_SWEEP_SECONDS"] = "0"
    os.environ["AGENTSITE_DEMO_STREAM_DELAY"] = "0"
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    for name in (
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "AGENTSITE_SESSION_ENCRYPTION_KEY",
        "REDIS_URL",
    ):
        os.environ.pop(name, None)

    import django
    from django.conf import settings
    from django.core.management import call_command

    # WhiteNoise warns that `collectstatic` has not run; the pages serve static files from
    # the source tree, as in the tests.
    warnings.filterwarnings("ignore", message="No directory at", category=UserWarning)
    django.setup()
    call_command("migrate", verbosity=0, interactive=False)
    # DEBUG makes Django time and keep every query (a cost no production server pays, and
    # one SQLiteSession does not have); the benchmarks measure the site as it is deployed.
    settings.DEBUG = False

    from bench import tracing_setup

    tracing_setup.drop_openai_export()
    # Set up as a server process is (`agentsite/asgi.py`): the startup heap out of the
    # collector's sight, for ours and the SDK's contenders alike (one process).
    from common import heap

    heap.freeze_startup_heap()


def machine() -> str:
    import agents
    import django

    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{os.cpu_count()} cores, {cpu}; Python {platform.python_version()}, "
        f"SQLite {sqlite3.sqlite_version}, Django {django.get_version()}, "
        f"openai-agents {agents.__version__}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="few repeats, small sizes: checks the harness"
    )
    parser.add_argument("--only", choices=sorted(BENCHMARKS), help="run one benchmark")
    parser.add_argument(
        "--check",
        action="store_true",
        help="the rows with goals, in about a minute; exit 1 if one is worse than goal + margin",
    )
    args = parser.parse_args(argv)
    if args.check and (args.quick or args.only):
        parser.error("--check runs its own rows: not with --quick or --only")

    workdir = Path(tempfile.mkdtemp(prefix="agentsite-bench-"))
    started = time.monotonic()
    try:
        setup_django(workdir)
        from bench import harness

        config = harness.Config(quick=args.quick, workdir=workdir)
        if args.check:
            from bench import check

            status = check.run(config, machine())
            harness.close_loop()
            return status
        rows: list[harness.Row] = []
        names = [args.only] if args.only else list(BENCHMARKS)
        for name in names:
            began = time.monotonic()
            print(f"running {name} ...", file=sys.stderr, flush=True)
            module = importlib.import_module(BENCHMARKS[name])
            rows.extend(module.run(config))
            print(f"  {name}: {time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)
        harness.close_loop()
        mode = "quick" if args.quick else "full"
        print(f"\nagentsite benchmarks ({mode} run, {time.monotonic() - started:.0f} s)")
        print(f"machine: {machine()}\n")
        print(harness.table(rows))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
