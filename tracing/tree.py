"""A trace's spans as the rows of its tree and waterfall, built in one pass (O(n)).

Rows come in depth-first order, children by start time, each with its depth, where its bar
starts and how wide it is (percentages of the trace's whole duration), and how many subtrees
end after it (the template closes that many `<details>`). A span whose parent is not stored
(not exported yet, dropped, or from another process) is shown at the root level, never lost;
so is a span caught in a parent cycle, which only garbled data can make.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from common import formatting
from tracing.recording import DECISION_SPAN_NAME

# A trace shorter than this is drawn as if it lasted this long (no division by zero).
_MIN_DURATION = timedelta(microseconds=1)

# Rows deeper than this are indented as much as this (traces.css has one class per depth).
MAX_INDENT = 31

# Span types the stylesheet colours; any other type is drawn as "other".
KINDS = frozenset(
    {
        "task",
        "agent",
        "turn",
        "generation",
        "response",
        "function",
        "handoff",
        "guardrail",
        "custom",
        "mcp_tools",
        "transcription",
        "speech",
        "speech_group",
    }
)


def is_decision(span_type: str, name: str) -> bool:
    """Whether a span is a reviewer's decision (`tracing.recording` writes them)."""
    return span_type == "custom" and name == DECISION_SPAN_NAME


def truthy(value: Any) -> bool:
    """A flag read from span data, which may store it as JSON, text or a number."""
    return value in (True, 1, "1", "true", "True")


def kind_class(span_type: str, name: str = "") -> str:
    """The CSS class suffix for a span type (user data never becomes a class name)."""
    if is_decision(span_type, name):
        return "decision"
    return span_type if span_type in KINDS else "other"


@dataclass
class Row:
    span: Any  # a `tracing.models.Span`, possibly without its `span_data` loaded
    depth: int
    children: int = 0
    offset: float = 0.0  # percent of the trace, from its start
    width: float = 0.0  # percent of the trace
    closes: int = 0  # subtrees that end with this row
    open: bool = False  # no end time stored
    orphan: bool = False  # at the root level because its parent is not in the trace
    part: int = 0  # for a root task span: which half of a paused-then-resumed run

    @property
    def has_children(self) -> bool:
        return self.children > 0

    @property
    def close_range(self) -> range:
        return range(self.closes)

    @property
    def is_decision(self) -> bool:
        return is_decision(self.span.span_type, self.span.name)

    @property
    def kind(self) -> str:
        return kind_class(self.span.span_type, self.span.name)

    @property
    def tripped(self) -> bool:
        """A guardrail that tripped (`tripped` is annotated by the view's query)."""
        return truthy(getattr(self.span, "tripped", None))

    @property
    def duration(self) -> str:
        return formatting.duration(self.span.duration_seconds)

    @property
    def depth_class(self) -> str:
        """The row's indent, as one of a bounded set of classes that traces.css defines: the
        Content Security Policy allows no inline style. Deeper rows share the deepest indent."""
        return f"depth-{min(self.depth, MAX_INDENT)}"

    @property
    def bar_place(self) -> str:
        """The bar's start and width (percent of the waterfall), as SVG attributes: SVG
        geometry is no inline style to the Content Security Policy, and it draws without
        JavaScript."""
        return f'x="{self.offset:.3f}%" width="{self.width:.3f}%"'

    @property
    def label_place(self) -> str:
        """Where the duration label fits: after the bar, before it, or inside a wide bar."""
        if self.offset + self.width <= 78:
            return "after"
        if self.offset >= 22:
            return "before"
        return "inside"

    @property
    def label_position(self) -> str:
        """Where the duration label is anchored (percent, see `bar_place`): the bar's end for
        a label after it, else its start (a label before the bar ends there, traces.css)."""
        if self.label_place == "after":
            return f'x="{self.offset + self.width:.3f}%"'
        return f'x="{self.offset:.3f}%"'


@dataclass
class Tree:
    rows: list[Row] = field(default_factory=list)
    started_at: datetime | None = None
    ended_at: datetime | None = None
    parts: int = 0  # root task spans: 2 or more when a run paused and resumed

    @property
    def duration_seconds(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return (self.ended_at - self.started_at).total_seconds()

    def ticks(self, count: int = 4) -> list[dict[str, float]]:
        """Evenly spaced marks for the time axis: position (percent) and seconds."""
        total = self.duration_seconds or 0.0
        return [
            {"percent": 100 * n / count, "seconds": total * n / count} for n in range(count + 1)
        ]


def build(spans: Sequence[Any]) -> Tree:
    """The tree of `spans` (each with `span_id`, `parent_id`, `started_at`, `ended_at`),
    which come sorted by start time."""
    tree = Tree()
    if not spans:
        return tree
    by_id = {span.span_id: span for span in spans}
    children: dict[str, list[Any]] = {}
    roots: list[Any] = []
    for span in spans:
        parent = span.parent_id
        if parent and parent != span.span_id and parent in by_id:
            children.setdefault(parent, []).append(span)
        else:
            roots.append(span)

    starts = [span.started_at for span in spans if span.started_at is not None]
    ends = [span.ended_at or span.started_at for span in spans if span.started_at is not None]
    tree.started_at = min(starts) if starts else None
    tree.ended_at = max(ends) if ends else None

    visited: set[str] = set()
    for root in roots:
        _walk(root, children, visited, tree, orphan=bool(root.parent_id))
    if len(visited) < len(by_id):
        # Only a parent cycle leaves spans unreached: show each such group from its first span.
        for span in spans:
            if span.span_id not in visited:
                _walk(span, children, visited, tree, orphan=True)

    _place(tree)
    part = 0
    for row in tree.rows:
        if row.depth == 0 and row.span.span_type == "task":
            part += 1
            row.part = part
    tree.parts = part
    return tree


def _walk(
    root: Any, children: dict[str, list[Any]], visited: set[str], tree: Tree, *, orphan: bool
) -> None:
    """Depth-first, without recursion: a trace may nest deeper than Python's stack."""
    visited.add(root.span_id)
    stack: list[tuple[Any, int] | None] = [(root, 0)]
    last: Row | None = None
    while stack:
        item = stack.pop()
        if item is None:  # the end of a subtree
            if last is not None:
                last.closes += 1
            continue
        span, depth = item
        kids = [kid for kid in children.get(span.span_id, ()) if kid.span_id not in visited]
        visited.update(kid.span_id for kid in kids)
        row = Row(span=span, depth=depth, children=len(kids), orphan=orphan and depth == 0)
        tree.rows.append(row)
        last = row
        if kids:
            stack.append(None)
            stack.extend((kid, depth + 1) for kid in reversed(kids))


def _place(tree: Tree) -> None:
    start, end = tree.started_at, tree.ended_at
    if start is None or end is None:
        return
    total = max(end - start, _MIN_DURATION)
    for row in tree.rows:
        begun = row.span.started_at
        if begun is None:
            continue
        ended = row.span.ended_at
        row.open = ended is None
        ended = ended or end
        row.offset = round(100 * ((begun - start) / total), 3)
        row.width = round(100 * (max(ended - begun, timedelta(0)) / total), 3)
        row.width = min(row.width, max(0.0, 100 - row.offset))
