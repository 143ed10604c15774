"""The operators' dashboard at 100,000 traces: server time of `GET /traces/dashboard/`.

The data: 100,000 traces spread over the dashboard's default range (the last 7 days, so
every one of them is counted), two agents, every outcome, an active time each; two
generation spans per trace (200,000: three models, one of them without a price, so the
"no price for" path is priced too); 10,000 approval requests of 3 tools made by 2,000 runs,
most of them decided by two reviewers, a policy and the expiry, some still pending. All
seeded with `bulk_create` in a few seconds.

Peer: the login page through the same stack (as the other page rows), and for reference the
trace list's first page on the same 100,000 traces.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction
from django.test import Client
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from approvals.models import (
    ApprovalDecision,
    ApprovalRequest,
    ApprovalStatus,
    DecisionKind,
    arguments_hash,
)
from bench import site
from bench.harness import Config, Row, note
from bench.pages import render_row
from conversations.models import Conversation
from engine.models import AgentRun, RunStatus
from tracing.dashboard import Window
from tracing.models import Span, Trace, TraceOutcome, TraceStatus

BENCHMARK = "dashboard"
AGENTS = ("support", "billing")
# gpt-4.1-mini and gpt-4.1 are priced by the tracing app's seeded price table; the last is not.
MODELS = ("gpt-4.1-mini", "gpt-4.1", "local-llama")
OUTCOMES = (
    [TraceOutcome.COMPLETED] * 14
    + [TraceOutcome.APPROVED] * 2
    + [TraceOutcome.REJECTED, TraceOutcome.EXPIRED, TraceOutcome.FAILED, TraceOutcome.GUARDRAIL]
)
TOOLS = ("refund_order", "cancel_order", "wire_money")


def run(config: Config) -> list[Row]:
    try:
        reverse("trace_dashboard")
    except NoReverseMatch as exc:
        return [note(BENCHMARK, "GET /traces/dashboard/", f"not yet measured ({exc})")]
    traces = config.pick(5_000, 100_000)
    viewer = site.reviewer()
    seed(traces, requests=traces // 10, reviewer=viewer)
    client = Client(HTTP_HOST="localhost")
    client.force_login(viewer)
    repeats = config.pick(3, 5)
    count = config.pick(2, 4)
    scale = f"{traces:,} traces, {2 * traces:,} model calls, {traces // 10:,} requests"
    rows = [
        render_row(
            client,
            reverse("trace_dashboard"),
            scale,
            repeats,
            count,
            label=f"GET /traces/dashboard/ (7 days), {traces:,} traces",
            what=f"the dashboard (9 charts, 10 tables) over the last 7 days, {scale}, all in range",
        ),
        render_row(
            client,
            reverse("trace_dashboard") + "?agent=support",
            scale,
            repeats,
            count,
            label=f"GET /traces/dashboard/?agent=support, {traces:,} traces",
            what=f"the dashboard for one of the two agents, {scale}",
        ),
        render_row(
            client,
            reverse("trace_list"),
            scale,
            repeats,
            count,
            label=f"reference: GET /traces/, {traces:,} traces",
            what=f"the trace list's first page on the same data ({scale})",
        ),
    ]
    return [replace(row, benchmark=BENCHMARK) for row in rows]


def seed(count: int, requests: int, reviewer: Any, seed_value: int = 17) -> None:
    """`count` traces over the last 7 days (two model calls each) and `requests` approval
    requests with their decisions."""
    rng = random.Random(seed_value)
    now = timezone.now().astimezone(UTC)
    start = Window.last_days().start  # the dashboard's default range: all of them in it
    seconds = (now - start).total_seconds()
    with transaction.atomic():
        traces: list[Trace] = []
        spans: list[Span] = []
        for n in range(count):
            began = start + timedelta(seconds=rng.random() * seconds)
            active = rng.lognormvariate(0.5, 0.8)
            waited = rng.random() * 600 if rng.random() < 0.1 else 0.0
            outcome = rng.choice(OUTCOMES)
            trace_id = f"trace_{uuid.UUID(int=rng.getrandbits(128)).hex}"
            agent = AGENTS[n % 2]
            traces.append(
                Trace(
                    trace_id=trace_id,
                    workflow_name=f"agentsite: {agent.title()} desk",
                    group_id=f"conv_bench_{n}",
                    metadata={"run_id": str(n), "agent": agent},
                    started_at=began,
                    ended_at=began + timedelta(seconds=active + waited),
                    status=TraceStatus.ERROR if outcome == TraceOutcome.FAILED else TraceStatus.OK,
                    outcome=outcome,
                    active_seconds=active,
                    total_tokens=0,
                )
            )
            for call in range(2):
                model = MODELS[rng.randrange(len(MODELS))]
                tokens_in = rng.randrange(200, 4000)
                tokens_out = rng.randrange(10, 400)
                at = began + timedelta(seconds=active * call / 2)
                spans.append(
                    Span(
                        span_id=f"span_{n:016x}{call:08x}",
                        trace_id=trace_id,
                        parent_id=None,
                        span_type="generation",
                        name=model,
                        started_at=at,
                        ended_at=at + timedelta(seconds=active / 3),
                        span_data={"type": "generation", "model": model},
                        model=model,
                        input_tokens=tokens_in,
                        cached_tokens=tokens_in // 4,
                        output_tokens=tokens_out,
                        total_tokens=tokens_in + tokens_out,
                    )
                )
        Trace.objects.bulk_create(traces, batch_size=2000)
        Span.objects.bulk_create(spans, batch_size=2000)
        seed_requests(requests, reviewer, rng, start, now)


def seed_requests(
    count: int, reviewer: Any, rng: random.Random, start: datetime, now: datetime
) -> None:
    other = site.reviewer()
    conversation = Conversation.objects.create(agent_name="support", owner=reviewer)
    runs = AgentRun.objects.bulk_create(
        AgentRun(
            conversation=conversation,
            agent_name=AGENTS[n % 2],
            input="Please refund order 42.",
            status=RunStatus.COMPLETED,
            requested_by=reviewer,
        )
        for n in range(max(1, count // 5))
    )
    hashed = arguments_hash({"order_id": 42})
    made: list[ApprovalRequest] = []
    times: list[datetime] = []
    for n in range(count):
        created = start + timedelta(seconds=rng.random() * (now - start).total_seconds())
        wait = rng.expovariate(1 / 300)
        status = rng.choice(
            [ApprovalStatus.APPROVED] * 6
            + [ApprovalStatus.REJECTED] * 2
            + [ApprovalStatus.EXPIRED, ApprovalStatus.PENDING]
        )
        decided = status != ApprovalStatus.PENDING and created + timedelta(seconds=wait) < now
        if not decided:
            status = ApprovalStatus.PENDING
        made.append(
            ApprovalRequest(
                run=runs[n % len(runs)],
                pause=1,
                call_id=f"call_{n}",
                agent_name="Support desk",
                tool_name=TOOLS[n % len(TOOLS)],
                arguments={"order_id": 42},
                arguments_hash=hashed,
                status=status,
                expires_at=created + timedelta(hours=1),
                created=created,
                decided_at=created + timedelta(seconds=wait) if decided else None,
            )
        )
        times.append(created)
    ApprovalRequest.objects.bulk_create(made, batch_size=2000)
    # `created` is auto_now_add (the insert set it to now): set it back to the seeded time.
    for request, created in zip(made, times, strict=True):
        request.created = created
    ApprovalRequest.objects.bulk_update(made, ["created"], batch_size=2000)
    people = (reviewer, other)
    ApprovalDecision.objects.bulk_create(
        (
            ApprovalDecision(
                request=request,
                reviewer=None
                if request.status == ApprovalStatus.EXPIRED or n % 7 == 0
                else people[n % 2],
                approved=request.status == ApprovalStatus.APPROVED,
                kind=DecisionKind.EXPIRED
                if request.status == ApprovalStatus.EXPIRED
                else DecisionKind.APPROVED
                if request.status == ApprovalStatus.APPROVED
                else DecisionKind.REJECTED,
                policy_name="auto-refunds" if n % 7 == 0 else "",
                arguments_hash=hashed,
            )
            for n, request in enumerate(made)
            if request.decided_at is not None
        ),
        batch_size=2000,
    )
    # The audit's time (auto_now_add) is the decision's: set it to the request's decided_at.
    decisions = list(ApprovalDecision.objects.select_related("request").filter(request__in=made))
    for decision in decisions:
        assert decision.request.decided_at is not None
        decision.created = decision.request.decided_at
    ApprovalDecision.objects.bulk_update(decisions, ["created"], batch_size=2000)
