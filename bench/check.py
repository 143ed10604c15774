"""`python -m bench --check` (`make bench-check`): the rows issue 28 holds to a goal, measured
briefly, each printed against its goal; the exit status is 1 when a row is worse than its goal
by more than its margin, else 0.

The rows are measured by the benchmarks' own functions (`bench/turn.py`, `bench/approvals.py`,
`bench/sessions.py`, `bench/concurrency.py`, `bench/trace_cost.py`), with fewer repeats and
smaller sizes than `python -m bench`, and each ratio is the same statistic as its full row's:
the median over repeats of each repeat's ratio, ours ÷ the peer's. A row's margin is how far
that median moved from one check to the next on this 2-core machine (docs/benchmarks.md,
"Issue 28, part 4"): a row beyond it moved more than the machine's noise did there.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from bench import approvals, concurrency, sessions, trace_cost, tracing_setup, turn
from bench.harness import Config, markdown, ratio


@dataclass(frozen=True)
class Bound:
    """A goal: the row's value at most `limit` (a ratio), or at least it (`at_least`, an
    efficiency, shown in per cent)."""

    limit: float
    at_least: bool = False

    def shortfall(self, value: float) -> float:
        """How much worse than the goal `value` is (0 or less: the goal is met)."""
        return self.limit - value if self.at_least else value - self.limit

    def show(self, value: float) -> str:
        return f"{value:.0%}" if self.at_least else f"{value:.2f}×"

    def show_margin(self, margin: float) -> str:
        return f"{margin * 100:.0f} pts" if self.at_least else f"{margin:.2f}"

    def __str__(self) -> str:
        return f"{'≥' if self.at_least else '≤'} {self.show(self.limit)}"


@dataclass(frozen=True)
class Check:
    key: str
    case: str
    goal: Bound
    margin: float  # the run-to-run spread of the row's value (MARGINS)
    # A row whose goal is not met (docs/benchmarks.md says why, with the measurement) is
    # held where it is: it fails only when worse than this by more than its margin, so
    # that a regression of it cannot land either.
    held: Bound | None = None

    @property
    def bound(self) -> Bound:
        """What the row's value is checked against: its goal, or where it is held."""
        return self.held or self.goal


@dataclass(frozen=True)
class Verdict:
    check: Check
    value: float

    @property
    def worse_by(self) -> float:
        """How much worse than its goal the row is (0 or less: met)."""
        return self.check.goal.shortfall(self.value)

    @property
    def failed(self) -> bool:
        # Rounded: 1.6 − 1.5 is 0.10000000000000009 in floats, not beyond a margin of 0.1.
        return round(self.check.bound.shortfall(self.value), 9) > self.check.margin

    def text(self) -> str:
        goal, bound = self.check.goal, self.check.bound
        if self.worse_by <= 0:
            return "met"
        if self.failed:
            beyond = bound.show_margin(bound.shortfall(self.value))
            if self.check.held is None:
                return f"FAILED: worse by {beyond}, beyond the margin"
            return f"FAILED: worse than where it is held ({bound}) by {beyond}, beyond the margin"
        by = goal.show_margin(self.worse_by)
        if self.check.held is None:
            return f"missed by {by}, within the margin"
        return f"goal missed by {by} (known); held at {bound}: within"

    def cells(self) -> list[str]:
        goal = self.check.goal
        return [
            self.check.case,
            goal.show(self.value),
            str(goal),
            goal.show_margin(self.check.margin),
            self.text(),
        ]


# Each row's margin: the range (largest − smallest) of its value over six checks of this tree
# in a row on the project's 2-core machine with nothing else running (load average 0.4-1.2),
# 2026-12-07 10:22-10:28 UTC (docs/benchmarks.md, "Issue 28, part 4: the guard", has the runs
# and how to measure them again). The efficiency's is a fraction (0.02: 2 points).
MARGINS = {
    "turn": 0.10,
    "pause": 0.15,
    "resume": 0.16,
    "policy": 0.11,
    "add_items(1)": 0.08,
    "add_items(10)": 0.08,
    "add_items(100)": 0.04,
    "get_items(10)": 0.01,
    "get_items(1000)": 0.02,
    "get_items(10000)": 0.02,
    "pop_item": 0.01,
    "concurrency(10)": 0.02,
    "concurrency(100)": 0.09,
    "tracing": 0.02,
}

# The rows whose goal (issue 28's) is not met, and where they are held instead: their worst
# value in the checks on the quiet machine (the six of the margins and four more).
# docs/benchmarks.md ("Issue 28: what is left, and why") says what meeting each would take.
HELD = {
    "add_items(1)": Bound(1.13),
    "add_items(10)": Bound(1.14),
    "concurrency(10)": Bound(0.79, at_least=True),
    "concurrency(100)": Bound(1.23),
}

# The goals are issue 28's.
CHECKS = tuple(
    Check(key, case, goal, MARGINS[key], HELD.get(key))
    for key, case, goal in (
        ("turn", "one turn, one tool call (mean) ÷ Runner.run + SQLiteSession", Bound(1.3)),
        ("pause", "pause (median) ÷ Runner.run + to_json", Bound(1.5)),
        ("resume", "resume (median) ÷ from_json + approve + Runner.run", Bound(1.5)),
        ("policy", "approved by a policy (median) ÷ the SDK's pause + resume", Bound(1.5)),
        ("add_items(1)", "add_items(1) ÷ SQLiteSession, synchronous=NORMAL", Bound(1.0)),
        ("add_items(10)", "add_items(10) ÷ SQLiteSession, synchronous=NORMAL", Bound(1.0)),
        ("add_items(100)", "add_items(100) ÷ SQLiteSession, synchronous=NORMAL", Bound(1.0)),
        ("get_items(10)", "get_items(limit=20), 10 items ÷ SQLiteSession", Bound(1.0)),
        ("get_items(1000)", "get_items(limit=20), 1,000 items ÷ SQLiteSession", Bound(1.0)),
        ("get_items(10000)", "get_items(limit=20), 10,000 items ÷ SQLiteSession", Bound(1.0)),
        ("pop_item", "pop_item() ÷ SQLiteSession, synchronous=NORMAL", Bound(1.0)),
        ("concurrency(10)", "10 concurrent runs: efficiency (ideal ÷ wall)", Bound(0.85, True)),
        ("concurrency(100)", "100 concurrent runs: wall ÷ the bare SDK's run_streamed", Bound(1.1)),
        ("tracing", "a turn traced ÷ untraced (mean)", Bound(1.1)),
    )
)

CHECKS_BY_KEY = {check.key: check for check in CHECKS}

HEADERS = ("row", "ratio", "goal", "margin", "verdict")

# The read sizes of the check: smaller than the full run's (10, 1,000, 100,000), to keep the
# check near a minute.
READ_SIZES = (10, 1_000, 10_000)


def verdicts(values: Mapping[str, float], checks: Iterable[Check] = CHECKS) -> list[Verdict]:
    return [Verdict(check, values[check.key]) for check in checks]


def status(found: Iterable[Verdict]) -> int:
    """The exit status: 1 when any row is worse than its goal by more than its margin."""
    return 1 if any(verdict.failed for verdict in found) else 0


def table(found: Iterable[Verdict]) -> str:
    return markdown(HEADERS, [verdict.cells() for verdict in found])


# --- measuring: each returns its rows' values by key -------------------------------------


_measured = itertools.count()


def _turn(config: Config) -> dict[str, float]:
    samples, _ = turn.measure(11, 20, config.workdir / "sdk-turns.sqlite3")
    return {"turn": ratio(samples["ours"], samples["peer"]).median}


def _approvals(config: Config) -> dict[str, float]:
    path = config.workdir / "sdk-approvals.sqlite3"
    pause, resume = approvals.pause_and_resume(7, 10, path)
    policy = approvals.policy_turns(7, 10, path)
    durable = approvals.durable(pause, resume)
    return {
        "pause": ratio(pause["ours"], pause["peer"], approvals.STATISTIC).median,
        "resume": ratio(resume["ours"], resume["peer"], approvals.STATISTIC).median,
        "policy": ratio(policy["ours"], durable, approvals.STATISTIC).median,
    }


def _sessions(config: Config) -> dict[str, float]:
    stores = sessions.Stores(config, prefix=f"check-{next(_measured)}-")
    repeats = 11
    values = {}
    for size, count in ((1, 40), (10, 30), (100, 8)):
        samples = sessions.appends(stores, size, count, repeats, ("ours", "relaxed"))
        values[f"add_items({size})"] = ratio(samples["ours"], samples["relaxed"]).median
    samples = sessions.reads(stores, READ_SIZES, 40, repeats, ("ours", "peer"))
    for size in READ_SIZES:
        values[f"get_items({size})"] = ratio(
            samples[f"ours-{size}"], samples[f"peer-{size}"]
        ).median
    samples = sessions.pops(stores, 30, repeats, ("ours", "relaxed"))
    values["pop_item"] = ratio(samples["ours"], samples["relaxed"]).median
    stores.close()
    return values


def _concurrency(config: Config) -> dict[str, float]:
    path = config.workdir / "sdk-concurrency.sqlite3"
    ten, _ = concurrency.walls(10, 5, path)
    hundred, _ = concurrency.walls(100, 5, path)
    return {
        "concurrency(10)": 1 / ratio(ten["ours"], concurrency.ideal(ten["ours"])).median,
        "concurrency(100)": ratio(hundred["ours"], hundred["streamed"]).median,
    }


def _tracing(config: Config) -> dict[str, float]:
    processors, _ = tracing_setup.site_processors()
    samples = trace_cost.turn_samples(11, 20, processors, noop=False)
    return {"tracing": ratio(samples["exporter"], samples["untraced"]).median}


MEASURES: dict[str, Callable[[Config], dict[str, float]]] = {
    "turn": _turn,
    "approvals": _approvals,
    "sessions": _sessions,
    "concurrency": _concurrency,
    "tracing": _tracing,
}


def run(config: Config, machine: str) -> int:
    """Measure every row, print the table; the exit status (`status`). The rows of a
    measurement with a row beyond its margin are measured once more, and each keeps the
    better of its two values: a regression is beyond it both times, a passing burst of
    load on the machine (another process, the disk) seldom twice."""
    started, load = time.monotonic(), os.getloadavg()[0]
    values: dict[str, float] = {}
    groups: dict[str, list[str]] = {}
    for name, measure in MEASURES.items():
        began = time.monotonic()
        print(f"checking {name} ...", file=sys.stderr, flush=True)
        measured = measure(config)
        values.update(measured)
        groups[name] = list(measured)
        print(f"  {name}: {time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)
    failing = {verdict.check.key for verdict in verdicts(values) if verdict.failed}
    again: list[str] = []
    for name, keys in groups.items():
        if failing & set(keys):
            print(f"checking {name} again: a row was beyond its margin", file=sys.stderr)
            for key, second in MEASURES[name](config).items():
                first = values[key]
                values[key] = better(CHECKS_BY_KEY[key], first, second)
                if key in failing:
                    bound = CHECKS_BY_KEY[key].bound
                    again.append(f"{key}: {bound.show(first)}, then {bound.show(second)}")
    found = verdicts(values)
    print(
        f"\nagentsite benchmark check ({time.monotonic() - started:.0f} s; load average "
        f"{load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end)"
    )
    print(f"machine: {machine}\n")
    if max(load, os.getloadavg()[0]) > (os.cpu_count() or 1):
        # Measured so (docs/benchmarks.md, "Issue 28, part 4"): ratios then move beyond the
        # margins, both ways, so a verdict says little.
        print("note: more runnable processes than cores; the ratios are noisier than the margins\n")
    print(table(found))
    if again:
        print(f"\nmeasured twice (the better value kept): {'; '.join(again)}")
    failed = sum(verdict.failed for verdict in found)
    print(f"\n{failed} of {len(found)} rows worse than their goal by more than their margin")
    return status(found)


def better(check: Check, first: float, second: float) -> float:
    """Of two values of a row, the one nearer its goal."""
    return min(first, second, key=check.bound.shortfall)
