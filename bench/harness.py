"""A small harness: interleaved repeats, ratios with their spread, and one table.

These machines are shared and noisy, so an absolute time says little on its own. Every
contender of a comparison runs once per repeat, in turn (A B A B ...), so that a noisy
neighbour slows both about equally; the ratio of each repeat's pair is what we report, as the
median over repeats with its interquartile range. Absolute numbers are given for reference.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# One event loop for the whole suite, so worker threads (and their database connections)
# live as long as they would in a server. Between two `arun` calls no loop is running in the
# main thread, so synchronous setup code may use the ORM there.
_loop: asyncio.Runner | None = None


def arun[T](coroutine: Coroutine[Any, Any, T]) -> T:
    """Run `coroutine` to its end on the suite's event loop."""
    global _loop
    if _loop is None:
        _loop = asyncio.Runner()
    return _loop.run(coroutine)


def close_loop() -> None:
    global _loop
    if _loop is not None:
        _loop.close()
        _loop = None


@dataclass(frozen=True)
class Config:
    quick: bool
    workdir: Path  # a throwaway directory for the peers' database files

    def pick[T](self, quick: T, full: T) -> T:
        return quick if self.quick else full


# --- measuring ------------------------------------------------------------------------------

# A contender runs one repeat and returns the seconds each of its operations took.
Contender = Callable[[], list[float]]


@dataclass
class Samples:
    """What one contender measured: for each repeat, the seconds of each operation."""

    repeats: list[list[float]] = field(default_factory=list)

    def per_repeat(self, statistic: Callable[[list[float]], float]) -> list[float]:
        return [statistic(times) for times in self.repeats]

    def flat(self) -> list[float]:
        return [t for times in self.repeats for t in times]

    def mean(self) -> float:
        """Mean seconds per operation over all repeats (throughput: 1 / this)."""
        return statistics.fmean(self.flat())

    def percentile(self, p: float) -> float:
        return percentile(self.flat(), p)


def percentile(values: Iterable[float], p: float) -> float:
    """The p-th percentile (0-100), nearest-rank: an actual sample, never an interpolation."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no samples")
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def interleave(
    contenders: dict[str, Contender], repeats: int, warmup: int = 1
) -> dict[str, Samples]:
    """Run each contender `warmup` times unrecorded, then `repeats` times, in turn."""
    for _ in range(warmup):
        for contender in contenders.values():
            contender()
    samples = {name: Samples() for name in contenders}
    for _ in range(repeats):
        for name, contender in contenders.items():
            samples[name].repeats.append(contender())
    return samples


def timed(operation: Callable[[], object], count: int) -> list[float]:
    """Call `operation` `count` times; the seconds of each call."""
    times = []
    for _ in range(count):
        start = time.perf_counter()
        operation()
        times.append(time.perf_counter() - start)
    return times


async def atimed(operation: Callable[[], Coroutine[Any, Any, object]], count: int) -> list[float]:
    """Await `operation()` `count` times; the seconds of each."""
    times = []
    for _ in range(count):
        start = time.perf_counter()
        await operation()
        times.append(time.perf_counter() - start)
    return times


@dataclass(frozen=True)
class Ratio:
    """Ours ÷ peer, per repeat: the median and the interquartile range over repeats."""

    median: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.median:.2f}× [{self.low:.2f}–{self.high:.2f}]"


def ratio(
    ours: Samples,
    peer: Samples,
    statistic: Callable[[list[float]], float] = statistics.fmean,
) -> Ratio:
    """The ratio of `statistic` of each repeat's times, ours over the peer's (below 1: faster)."""
    pairs = [
        a / b
        for a, b in zip(ours.per_repeat(statistic), peer.per_repeat(statistic), strict=True)
        if b > 0
    ]
    if len(pairs) == 1:
        return Ratio(pairs[0], pairs[0], pairs[0])
    q1, q2, q3 = statistics.quantiles(pairs, n=4, method="inclusive")
    return Ratio(q2, q1, q3)


def median_of(times: list[float]) -> float:
    return statistics.median(times)


# --- reporting ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Goal:
    """A bound on a ratio: met when the median is at most `at_most`."""

    at_most: float
    text: str

    def verdict(self, value: float) -> str:
        return f"{self.text}: {'met' if value <= self.at_most else 'MISSED'}"


@dataclass(frozen=True)
class Row:
    benchmark: str
    case: str
    ours: str
    peer: str
    ratio: str
    goal: str
    meaning: str


def compared(
    benchmark: str,
    case: str,
    ours: str,
    peer: str,
    value: Ratio,
    meaning: str,
    goal: Goal | None = None,
) -> Row:
    return Row(
        benchmark, case, ours, peer, str(value), goal.verdict(value.median) if goal else "", meaning
    )


def mean_compared(
    benchmark: str, case: str, ours: Samples, peer: Samples, meaning: str, goal: Goal | None = None
) -> Row:
    """One row: the mean of `ours` against the mean of `peer`, the ratio per repeat."""
    return compared(
        benchmark, case, ms(ours.mean()), ms(peer.mean()), ratio(ours, peer), meaning, goal
    )


def mean_and_median(
    benchmark: str,
    case: str,
    ours: Samples,
    peer: Samples,
    meaning: str,
    goal: Goal,
    median_meaning: str,
) -> list[Row]:
    """Two rows of one comparison of times per turn: the mean (held to `goal`), then the
    median of every turn."""
    return [
        mean_compared(benchmark, f"{case} (mean per turn)", ours, peer, meaning, goal),
        compared(
            benchmark,
            f"{case} (median per turn)",
            ms(median_of(ours.flat())),
            ms(median_of(peer.flat())),
            ratio(ours, peer, median_of),
            median_meaning,
        ),
    ]


def note(benchmark: str, case: str, meaning: str) -> Row:
    """A row without numbers: something skipped, or not measured yet, and why."""
    return Row(benchmark, case, "—", "—", "—", "", meaning)


def ops_per_second(samples: Samples) -> str:
    return f"{1 / samples.mean():,.0f} ops/s"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


HEADERS = ("benchmark", "case", "agentsite", "peer", "ratio ours/peer [IQR]", "goal", "meaning")


def table(rows: list[Row]) -> str:
    """A Markdown table: readable in a terminal, and pasted as is into docs/benchmarks.md."""
    return markdown(
        HEADERS, [[r.benchmark, r.case, r.ours, r.peer, r.ratio, r.goal, r.meaning] for r in rows]
    )


def markdown(headers: Iterable[str], lines: Iterable[list[str]]) -> str:
    """`lines` of cells under `headers`, as a Markdown table with aligned columns."""
    cells = [list(headers), *lines]
    widths = [max(len(line[i]) for line in cells) for i in range(len(cells[0]))]

    def line(values: list[str]) -> str:
        return "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)) + " |"

    out = [line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out.extend(line(values) for values in cells[1:])
    return "\n".join(out)
