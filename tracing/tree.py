"""A trace's spans as the rows of its tree and waterfall, built in one pass (O(n)).

Rows come in depth-first order, children by start time, each with its depth, where its bar
starts and how wide it is (percentages of the trace's whole duration), and how many subtrees
end after it (the template closes that many nodes). A span whose parent is not stored
(not exported yet, dropped, or from another process) is shown at the root level, never lost;
so is a span caught in a parent cycle, which only garbled data can make.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
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
    # "open": its children follow it; "lazy": they load on demand; "leaf": it has none.
    state: str = "leaf"
    descendants: int = 0  # spans under it, at every depth

    @property
    def has_children(self) -> bool:
        return self.children > 0

    @property
    def close_range(self) -> range:
        return range(self.closes)

    @property
    def is_lazy(self) -> bool:
        return self.state == "lazy"

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
class Gap:
    """Children of `parent_id` (None: roots) not shown, from index `start` to `stop`: a
    "N more" control that loads them a page at a time."""

    parent_id: str | None
    depth: int
    start: int
    stop: int

    @property
    def count(self) -> int:
        return self.stop - self.start

    @property
    def depth_class(self) -> str:
        return f"depth-{min(self.depth, MAX_INDENT)}"


class Close:
    """The end of an open row's subtree (the template closes its node)."""


CLOSE = Close()


@dataclass
class Tree:
    rows: list[Row] = field(default_factory=list)
    # What the template writes, in order: rows, gaps and the ends of subtrees.
    items: list[Row | Gap | Close] = field(default_factory=list)
    started_at: datetime | None = None
    ended_at: datetime | None = None
    parts: int = 0  # root task spans: 2 or more when a run paused and resumed
    span_count: int = 0  # every span of the trace, shown or not
    error_count: int = 0
    partial: bool = False  # some spans are left to load on demand

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


# --- the shape of a trace, and which of its spans a view shows --------------------------------

# A trace of at most this many spans is shown whole, as the page always did (2,000 spans render
# in about 70 ms); a bigger one opens with its top levels and loads the rest on demand.
FULL_TREE = 2_000
# How deep the first view of a big trace goes (0: the roots): a run's task, its agents and
# their turns; each turn's calls are one click away.
FIRST_DEPTH = 2
# Children of one span shown at once; a "N more" control loads the next page.
CHILD_PAGE = 100
# What the reader's loaded pages of roots are sent back as (no span id looks like it): a
# running trace's spans often arrive before their parents, and wait at the root level.
ROOTS = "*roots"
# The first errors of a big trace are shown with the path to them: an operator opens a failed
# trace for its error, and should not have to dig for it. More would defeat the top-levels view.
ERROR_PATHS = 5


@dataclass
class Skeleton:
    """A trace's shape from its spans' ids and parents alone (one light query, O(n)): the
    tree's order, each span's children, depth and number of descendants. Spans are placed
    as `build` places them: a span whose parent is not stored, or caught in a parent cycle,
    at the root level."""

    roots: list[str] = field(default_factory=list)
    children: dict[str, list[str]] = field(default_factory=dict)
    parent: dict[str, str | None] = field(default_factory=dict)  # as shown, None: a root
    depth: dict[str, int] = field(default_factory=dict)
    size: dict[str, int] = field(default_factory=dict)  # descendants
    orphans: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)  # in start order

    def __len__(self) -> int:
        return len(self.depth)

    def __contains__(self, span_id: object) -> bool:
        return span_id in self.depth

    @classmethod
    def of(cls, links: Iterable[tuple[str, str | None, Any]]) -> Skeleton:
        """From (span id, parent id, has an error: truthy) in start order."""
        order: list[str] = []
        parents: dict[str, str | None] = {}
        skeleton = cls()
        for span_id, parent_id, has_error in links:
            if span_id in parents:
                continue
            order.append(span_id)
            parents[span_id] = parent_id
            if has_error:
                skeleton.errors.append(span_id)
        stored: dict[str, list[str]] = {}
        tops: list[str] = []
        for span_id in order:
            parent = parents[span_id]
            if parent and parent != span_id and parent in parents:
                stored.setdefault(parent, []).append(span_id)
            else:
                tops.append(span_id)
        visited: set[str] = set()
        walk: list[str] = []  # depth-first order
        for top in tops:
            skeleton._walk(top, stored, visited, walk, orphan=bool(parents[top]))
        if len(visited) < len(order):
            # Only a parent cycle leaves spans unreached: show each group from its first span.
            for span_id in order:
                if span_id not in visited:
                    skeleton._walk(span_id, stored, visited, walk, orphan=True)
        size = skeleton.size
        for span_id in reversed(walk):
            size.setdefault(span_id, 0)
            parent = skeleton.parent[span_id]
            if parent is not None:
                size[parent] = size.get(parent, 0) + size[span_id] + 1
        return skeleton

    def _walk(
        self,
        top: str,
        stored: dict[str, list[str]],
        visited: set[str],
        walk: list[str],
        *,
        orphan: bool,
    ) -> None:
        """Depth-first, without recursion: a trace may nest deeper than Python's stack."""
        visited.add(top)
        self.roots.append(top)
        self.parent[top] = None
        if orphan:
            self.orphans.add(top)
        stack: list[tuple[str, int]] = [(top, 0)]
        while stack:
            span_id, depth = stack.pop()
            self.depth[span_id] = depth
            walk.append(span_id)
            kids = [kid for kid in stored.get(span_id, ()) if kid not in visited]
            if kids:
                visited.update(kids)
                self.children[span_id] = kids
                for kid in kids:
                    self.parent[kid] = span_id
                stack.extend((kid, depth + 1) for kid in reversed(kids))

    def kids(self, parent: str | None) -> list[str]:
        return self.roots if parent is None else self.children.get(parent, [])

    def path(self, span_id: str) -> list[str]:
        """The span and its ancestors, up to its root."""
        found: list[str] = []
        at: str | None = span_id
        while at is not None and at in self.depth:
            found.append(at)
            at = self.parent[at]
        return found


@dataclass
class View:
    """Which spans of a skeleton are shown. `whole`: all of them. Otherwise the rows down to
    `FIRST_DEPTH`, the children of `opened` spans (and of each span on the path to one), the
    paths to `shown` spans, and of each span's children the first `CHILD_PAGE` (or as many as
    `more` says the reader has loaded)."""

    skeleton: Skeleton
    whole: bool = False
    first_depth: int = FIRST_DEPTH
    opened: set[str] = field(default_factory=set)
    forced: set[str] = field(default_factory=set)  # spans on a path to a shown one
    more: dict[str, int] = field(default_factory=dict)

    @classmethod
    def first(
        cls,
        skeleton: Skeleton,
        *,
        opened: Iterable[str] = (),
        shown: Iterable[str] = (),
        more: dict[str, int] | None = None,
    ) -> View:
        if len(skeleton) <= FULL_TREE:
            return cls(skeleton, whole=True)
        view = cls(skeleton, more=dict(more or {}))
        targets = [*skeleton.errors[:ERROR_PATHS], *shown]
        for span_id in opened:
            if span_id in skeleton:
                view.opened.add(span_id)
                targets.append(span_id)
        for span_id in targets:
            view.forced.update(skeleton.path(span_id))
        return view

    def loaded(self, span_id: str) -> bool:
        """Whether a span's children are shown (else they load on demand)."""
        if self.whole:
            return True
        if span_id in self.opened:
            return True
        if span_id in self.forced and self._forced_below(span_id):
            return True
        return self.skeleton.depth[span_id] < self.first_depth

    def _forced_below(self, span_id: str) -> bool:
        return any(kid in self.forced for kid in self.skeleton.children.get(span_id, ()))

    def visible(self, parent: str | None, start: int = 0, stop: int | None = None) -> list[Any]:
        """The children of `parent` (None: the roots) from `start` to `stop` that are shown,
        with a `Gap` for each run of those that are not."""
        kids = self.skeleton.kids(parent)
        stop = len(kids) if stop is None else min(stop, len(kids))
        if self.whole:
            return kids[start:stop]
        loaded = self.more.get(parent if parent is not None else ROOTS, 0)
        limit = start + max(CHILD_PAGE, loaded - start)
        depth = self.skeleton.depth[parent] + 1 if parent is not None else 0
        shown: list[Any] = []
        gap_from: int | None = None
        for index in range(start, stop):
            kid = kids[index]
            if index < limit or kid in self.forced:
                if gap_from is not None:
                    shown.append(Gap(parent, depth, gap_from, index))
                    gap_from = None
                shown.append(kid)
            elif gap_from is None:
                gap_from = index
        if gap_from is not None:
            shown.append(Gap(parent, depth, gap_from, stop))
        return shown

    def items(self, tops: list[Any]) -> list[tuple[str, str] | Gap | Close]:
        """Depth-first from `tops` (span ids and gaps): ("leaf" | "open" | "lazy", span id)
        for each row shown, each gap, and a `CLOSE` after each open row's subtree."""
        out: list[tuple[str, str] | Gap | Close] = []
        stack = [iter(tops)]
        while stack:
            item = next(stack[-1], None)
            if item is None:
                stack.pop()
                if stack:
                    out.append(CLOSE)
                continue
            if isinstance(item, Gap):
                out.append(item)
            elif not self.skeleton.children.get(item):
                out.append(("leaf", item))
            elif self.loaded(item):
                out.append(("open", item))
                stack.append(iter(self.visible(item)))
            else:
                out.append(("lazy", item))
        return out


def arrange(
    skeleton: Skeleton,
    items: list[tuple[str, str] | Gap | Close],
    spans: dict[str, Any],
    *,
    started_at: datetime | None = None,
    ended_at: datetime | None = None,
) -> Tree:
    """The tree of `items` (`View.items`), each row with its span from `spans`, drawn on the
    time scale `started_at`..`ended_at` widened to every shown span."""
    tree = Tree(span_count=len(skeleton), error_count=len(skeleton.errors))
    last: Row | None = None
    opened: list[bool] = []  # for each open row around this item: whether it is shown
    for item in items:
        if isinstance(item, Close):
            if opened.pop():
                if last is not None:
                    last.closes += 1
                tree.items.append(item)
            continue
        if isinstance(item, Gap):
            tree.partial = True
            tree.items.append(item)
            continue
        state, span_id = item
        span = spans.get(span_id)
        if state == "open":
            opened.append(span is not None)
        if span is None:  # pruned between the two queries: its children follow its parent
            continue
        row = Row(
            span=span,
            depth=skeleton.depth[span_id],
            children=len(skeleton.children.get(span_id, ())),
            orphan=span_id in skeleton.orphans,
            state=state,
            descendants=skeleton.size.get(span_id, 0),
        )
        if state == "lazy":
            tree.partial = True
        tree.rows.append(row)
        tree.items.append(row)
        last = row
    starts = [row.span.started_at for row in tree.rows if row.span.started_at is not None]
    ends = [
        row.span.ended_at or row.span.started_at
        for row in tree.rows
        if row.span.started_at is not None
    ]
    if started_at is not None:
        starts.append(started_at)
    if ended_at is not None:
        ends.append(ended_at)
    tree.started_at = min(starts) if starts else None
    tree.ended_at = max(ends) if ends else None
    _place(tree)
    part = 0
    for row in tree.rows:
        if row.depth == 0 and row.span.span_type == "task":
            part += 1
            row.part = part
    tree.parts = part
    return tree


def build(spans: Sequence[Any]) -> Tree:
    """The whole tree of `spans` (each with `span_id`, `parent_id`, `started_at`, `ended_at`,
    `error`), which come sorted by start time."""
    skeleton = Skeleton.of(
        (span.span_id, span.parent_id, getattr(span, "error", None) is not None) for span in spans
    )
    view = View(skeleton, whole=True)
    by_id = {span.span_id: span for span in spans}
    return arrange(skeleton, view.items(view.visible(None)), by_id)


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
