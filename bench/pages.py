"""Pages: the reviewers' inbox rendered on a full database, its websocket push, and a long
run's trace page.

- Render: server time of `GET /inbox/` and `GET /inbox/history/` through Django's test Client
  (every middleware, the session, the template), first with a few requests, then with 1,000
  pending and 100,000 decided ones; and of the trace page of a run of 2,000 spans. Peer: the
  login page through the same stack, the least a page costs here.
- Push: reviewers connected to the inbox socket through channels' `WebsocketCommunicator`;
  an `approval.created` event is published as the run engine publishes it, and each
  reviewer's wait for its fragment is timed. Peer: as many plain channels in a group of the
  same channel layer, receiving the same message: the layer's own delivery cost.

Until the inbox exists (issues 4 and 5) the rows say so.
"""

from __future__ import annotations

import asyncio
import importlib
import time
import uuid
from datetime import timedelta
from typing import Any

from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.db import transaction
from django.test import Client
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus, arguments_hash
from bench import site
from bench.harness import (
    Config,
    Row,
    arun,
    compared,
    interleave,
    median_of,
    ms,
    note,
    ratio,
    timed,
)
from conversations.models import Conversation
from engine import events
from engine.models import AgentRun, RunStatus
from tracing.models import Span, Trace

BENCHMARK = "pages"
TOOLS = ("refund_order", "cancel_order", "wire_money")
ARGUMENTS = {"order_id": 42}


def unavailable() -> str | None:
    """Why the pages cannot be measured yet, or None."""
    try:
        reverse("inbox")
        reverse("inbox_history")
        consumers = importlib.import_module("approvals.consumers")
    except (NoReverseMatch, ImportError) as exc:
        return f"not yet measured — inbox/trace pages land in issues 4/5 ({exc})"
    if not hasattr(consumers, "InboxConsumer"):
        return "not yet measured — inbox/trace pages land in issues 4/5 (no InboxConsumer)"
    return None


def run(config: Config) -> list[Row]:
    reason = unavailable()
    if reason:
        return [note(BENCHMARK, "inbox render, websocket push", reason)]
    try:
        rows = measure(config)
    except Exception as exc:  # the pages are being built while this suite runs
        rows = [note(BENCHMARK, "inbox render, websocket push", f"not measured: {exc!r}")]
    # The trace pages on their own: a failure of the inbox's rows does not lose them.
    try:
        rows += trace_rows(config)
    except Exception as exc:
        rows.append(note(BENCHMARK, "trace pages", f"not measured: {exc!r}"))
    return rows


def measure(config: Config) -> list[Row]:
    reviewer = site.reviewer()
    data = Data(reviewer)
    client = Client(HTTP_HOST="localhost")
    client.force_login(reviewer)
    repeats = config.pick(3, 5)
    count = config.pick(3, 6)
    rows: list[Row] = []

    data.add(pending=10, decided=10)
    rows.append(render_row(client, "/inbox/", "10 pending", repeats, count))

    pending, decided = config.pick((100, 2_000), (1_000, 100_000))
    data.add(pending=pending - 10, decided=decided - 10)
    scale = f"{pending:,} pending + {decided:,} decided"
    rows.append(render_row(client, "/inbox/", scale, repeats, count))
    rows.append(render_row(client, "/inbox/history/", scale, repeats, count))
    rows.append(push_row(config, data, reviewer))
    return rows


def trace_rows(config: Config) -> list[Row]:
    """The trace page of a long run, whole, and of a run too long to show whole."""
    client = Client(HTTP_HOST="localhost")
    client.force_login(site.reviewer())
    repeats = config.pick(3, 5)
    count = config.pick(3, 6)
    rows: list[Row] = []
    spans = config.pick(200, 2_000)
    trace_id = long_trace(spans)
    rows.append(
        render_row(
            client,
            reverse("trace_detail", args=[trace_id]),
            f"{spans:,} spans",
            repeats,
            count,
            label=f"GET /traces/<id>/, a run of {spans:,} spans",
            what=f"the trace page of a run of {spans:,} spans (tree, waterfall, first span)",
        )
    )

    # A trace too big to show whole: its first view (top levels, one light query of the rest)
    # and a page of a subtree loaded on demand, as the page's "Show N more" asks for it.
    big = config.pick(3_000, 10_000)
    big_id = long_trace(big)
    agent = Span.objects.filter(trace_id=big_id, span_type="agent").values_list(
        "span_id", flat=True
    )[0]
    rows.append(
        render_row(
            client,
            reverse("trace_detail", args=[big_id]),
            f"{big:,} spans",
            repeats,
            count,
            label=f"GET /traces/<id>/, a run of {big:,} spans (first view)",
            what=f"the first view of the trace page of a run of {big:,} spans (its top levels, "
            "the rest left to load on demand)",
        )
    )
    subtree = reverse("trace_subtree", args=[big_id, agent]) + f"?start=100&stop={big}"
    rows.append(
        render_row(
            client,
            subtree,
            f"{big:,} spans",
            repeats,
            count,
            label=f"GET /traces/<id>/tree/<span>/, a page of a {big:,}-span trace's subtree",
            what=f"the next 100 children of the agent span of a run of {big:,} spans (htmx)",
            headers={"HX-Request": "true"},
        )
    )
    return rows


def long_trace(count: int) -> str:
    """A trace shaped like a long run: a task, an agent, then turns of a model call and a tool
    call each, with inputs and outputs of a realistic size. Returns its id."""
    trace = Trace.objects.create(
        trace_id=f"trace_{uuid.uuid4().hex}", workflow_name="agentsite: Bench", status="ok"
    )
    began = timezone.now() - timedelta(hours=1)
    spans: list[Span] = []

    def span(
        kind: str, title: str, parent: Span | None, start: float, end: float, **data: Any
    ) -> Span:
        made = Span(
            span_id=f"span_{uuid.uuid4().hex[:24]}",
            trace=trace,
            parent_id=parent.span_id if parent else None,
            span_type=kind,
            name=title,
            started_at=began + timedelta(seconds=start),
            ended_at=began + timedelta(seconds=end),
            span_data={"type": kind, **data},
            total_tokens=data.get("usage", {}).get("total_tokens", 0),
        )
        spans.append(made)
        return made

    task = span("task", "agentsite: Bench", None, 0, count)
    agent = span(
        "agent", "Bench tool", task, 0.01, count, name="Bench tool", tools=["lookup_order"]
    )
    turn_number = 0
    while len(spans) < count:
        turn_number += 1
        at = float(turn_number)
        turn = span("turn", f"turn {turn_number}", agent, at, at + 1)
        span(
            "generation",
            "gpt-4.1-mini",
            turn,
            at,
            at + 0.6,
            model="gpt-4.1-mini",
            input=[{"role": "user", "content": "Where is my order 7? " * 10}],
            output=[{"role": "assistant", "content": "Let me look that up."}],
            usage={"input_tokens": 120, "output_tokens": 12, "total_tokens": 132},
        )
        span(
            "function",
            "lookup_order",
            turn,
            at + 0.6,
            at + 0.9,
            name="lookup_order",
            input='{"order_id": 7}',
            output="Order 7 shipped yesterday.",
        )
    Span.objects.bulk_create(spans[:count], batch_size=500)
    Trace.objects.filter(pk=trace.pk).update(
        started_at=began, ended_at=began + timedelta(seconds=count)
    )
    return trace.trace_id


class Data:
    """Approval requests in bulk, spread over a few runs of one conversation."""

    def __init__(self, reviewer: Any) -> None:
        self.reviewer = reviewer
        conversation = Conversation.objects.create(agent_name="bench_approval", owner=reviewer)
        self.runs = AgentRun.objects.bulk_create(
            AgentRun(
                conversation=conversation,
                agent_name="bench_approval",
                input="Please refund order 42.",
                status=RunStatus.WAITING,
                trace_id=f"trace_{uuid.uuid4().hex}",
                requested_by=reviewer,
            )
            for _ in range(50)
        )
        self.made = 0
        self.hash = arguments_hash(ARGUMENTS)

    def request(self, status: str = ApprovalStatus.PENDING) -> ApprovalRequest:
        self.made += 1
        decided = status != ApprovalStatus.PENDING
        return ApprovalRequest(
            run=self.runs[self.made % len(self.runs)],
            pause=1,
            call_id=f"call_{self.made}",
            agent_name="Bench approval",
            tool_name=TOOLS[self.made % len(TOOLS)],
            arguments=ARGUMENTS,
            arguments_hash=self.hash,
            status=status,
            decided_by=self.reviewer if decided else None,
        )

    def add(self, pending: int, decided: int) -> None:
        with transaction.atomic():
            ApprovalRequest.objects.bulk_create(
                (self.request() for _ in range(pending)), batch_size=2000
            )
            statuses = (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED)
            made = ApprovalRequest.objects.bulk_create(
                (self.request(statuses[i % 2]) for i in range(decided)), batch_size=2000
            )
            ApprovalDecision.objects.bulk_create(
                (
                    ApprovalDecision(
                        request=request,
                        reviewer=self.reviewer,
                        approved=request.status == ApprovalStatus.APPROVED,
                        arguments_hash=self.hash,
                    )
                    for request in made
                ),
                batch_size=2000,
            )


def get(client: Client, path: str, headers: dict[str, str] | None = None) -> None:
    response = client.get(path, headers=headers)
    assert response.status_code == 200, (path, response.status_code)


def render_row(
    client: Client,
    path: str,
    scale: str,
    repeats: int,
    count: int,
    *,
    label: str | None = None,
    what: str | None = None,
    headers: dict[str, str] | None = None,
) -> Row:
    login = reverse("login")
    samples = interleave(
        {
            "ours": lambda: timed(lambda: get(client, path, headers), count),
            "peer": lambda: timed(lambda: get(client, login), count),
        },
        repeats,
    )
    ours, peer = samples["ours"], samples["peer"]
    return compared(
        BENCHMARK,
        label or f"GET {path}, {scale}",
        f"p50 {ms(ours.percentile(50))}, p99 {ms(ours.percentile(99))}",
        f"p50 {ms(peer.percentile(50))}, p99 {ms(peer.percentile(99))}",
        ratio(ours, peer, median_of),
        f"server time to render {what or f'{path} with {scale} requests'} for a reviewer "
        "(test Client: middleware, session, queries, template) ÷ the login page through the "
        "same stack",
    )


def push_row(config: Config, data: Data, reviewer: Any) -> Row:
    from approvals.consumers import InboxConsumer

    listeners = config.pick(10, 50)
    pushes = config.pick(3, 6)
    repeats = config.pick(2, 4)
    layer = get_channel_layer()
    group = f"bench.{uuid.uuid4().hex}"

    async def connect() -> tuple[list[WebsocketCommunicator], list[str]]:
        sockets = []
        for _ in range(listeners):
            socket = WebsocketCommunicator(InboxConsumer.as_asgi(), "/ws/inbox/?show=pending")
            socket.scope["user"] = reviewer
            connected, _ = await socket.connect(timeout=10)
            assert connected, "the inbox socket refused a reviewer"
            sockets.append(socket)
        channels = [await layer.new_channel() for _ in range(listeners)]
        for channel in channels:
            await layer.group_add(group, channel)
        return sockets, channels

    sockets, channels = arun(connect())

    def ours() -> list[float]:
        times: list[float] = []
        for _ in range(pushes):
            request = ApprovalRequest.objects.bulk_create([data.request()])[0]
            event = events.ApprovalCreated.for_request(request)
            times.extend(arun(delivered(sockets, lambda e=event: events.publish([e]))))
        return times

    def peer() -> list[float]:
        message = {"type": "approval.created", "event": {"request_id": 1}}
        times: list[float] = []
        for _ in range(pushes):
            times.extend(
                arun(delivered(channels, lambda: layer.group_send(group, message), layer=layer))
            )
        return times

    try:
        samples = interleave({"ours": ours, "peer": peer}, repeats)
    finally:

        async def close() -> None:
            for socket in sockets:
                await socket.disconnect()
            for channel in channels:
                await layer.group_discard(group, channel)

        arun(close())
    mine, theirs = samples["ours"], samples["peer"]
    return compared(
        BENCHMARK,
        f"websocket push, {listeners} reviewers connected",
        f"p50 {ms(mine.percentile(50))}, p99 {ms(mine.percentile(99))}",
        f"p50 {ms(theirs.percentile(50))}, p99 {ms(theirs.percentile(99))}",
        ratio(mine, theirs, median_of),
        f"from publishing approval.created to each of {listeners} inbox sockets receiving its "
        "rendered row (p50/p99 over every reviewer and push) ÷ the channel layer alone "
        f"delivering a message to {listeners} plain channels",
    )


async def delivered(listeners: list[Any], publish: Any, layer: Any = None) -> list[float]:
    """Seconds from `publish()` until each listener received its message."""
    arrived: list[float] = []

    async def wait(listener: Any) -> None:
        if layer is None:
            await listener.receive_from(timeout=30)
        else:
            await layer.receive(listener)
        arrived.append(time.perf_counter())

    waiting = [asyncio.create_task(wait(listener)) for listener in listeners]
    await asyncio.sleep(0)
    started = time.perf_counter()
    await publish()
    await asyncio.gather(*waiting)
    return [moment - started for moment in arrived]
