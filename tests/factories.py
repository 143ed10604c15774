"""Small factories for test data: `make_*(**kwargs)` with sensible defaults, saved.

The shared people: alice (an end user, `make_user(username="alice")`), rita (a reviewer,
`make_reviewer()`), olga (an operator who may view traces, `make_viewer()`) and sam (staff with
no permission, `make_staff()`); every one has the password "pass-for-tests".

With the `orders` fixture, the demo's customers exist too, each owning their seeded orders:
alice owns 42, 44 and 46, chen 7, bruno 3, eva 15, hugo 58 (`demo/seed.py`). `make_user` of
such a name takes that account over; `start_run` and `pause_run` ask as the customer of the
order their text names, as the demo's tools act only on the asker's own orders.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model

from approvals.models import ApprovalDecision, ApprovalRequest, arguments_hash
from conversations.models import Conversation
from engine.models import AgentRun, RunStatus
from tracing.models import Span, Trace, TraceStatus

PASSWORD = "pass-for-tests"
REVIEWER = "approvals.decide_approvalrequest"
VIEWER = "tracing.view_trace"
# When made traces start: `make_trace` counts back from here, a minute per trace.
T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)

_counter = {"n": 0}
_calls = itertools.count(1)
_numbers = itertools.count(1)


def _next() -> int:
    _counter["n"] += 1
    return _counter["n"]


# --- people ---------------------------------------------------------------------------------


def make_user(perms: Iterable[str] = (), **kwargs: Any) -> Any:
    """A user with the permissions `perms`, each named "app_label.codename"."""
    kwargs.setdefault("username", f"user{_next()}")
    password = kwargs.pop("password", PASSWORD)
    # A demo customer that the `orders` fixture seeded is taken over, with its orders.
    user = get_user_model().objects.filter(username=kwargs["username"]).first()
    if user is None:
        user = get_user_model().objects.create_user(**kwargs)
    else:
        for name, value in kwargs.items():
            setattr(user, name, value)
    user.set_password(password)
    user.save()
    return grant(user, *perms) if perms else user


def grant(user: Any, *perms: str) -> Any:
    """`user`, given the permissions `perms` ("app_label.codename"), fetched again so that
    Django's permission cache does not hide them."""
    from django.contrib.auth.models import Permission

    for perm in perms:
        app_label, codename = perm.split(".", 1)
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    return type(user).objects.get(pk=user.pk)


def client_of(user: Any) -> Any:
    """A test client signed in as `user` (Django's own login: no form, no password)."""
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client


def make_reviewer(username: str = "rita", password: str = PASSWORD) -> Any:
    """A user who may decide tool calls (the permission `is_reviewer` checks); an existing
    user of that name is made a reviewer instead."""
    user = get_user_model().objects.filter(username=username).first() or make_user(
        username=username, password=password
    )
    return grant(user, REVIEWER)


def make_viewer(username: str = "olga") -> Any:
    """An operator who is not staff: the permission to view traces is all she has."""
    return make_user(perms=[VIEWER], username=username)


def make_staff(username: str = "sam") -> Any:
    """Staff, with no permission at all."""
    return make_user(username=username, is_staff=True)


# --- conversations, runs and approvals ------------------------------------------------------


def make_conversation(**kwargs: Any) -> Conversation:
    kwargs.setdefault("session_id", f"conv_test_{_next()}")
    kwargs.setdefault("agent_name", "support")
    return Conversation.objects.create(**kwargs)


def make_run(**kwargs: Any) -> AgentRun:
    """A run waiting at its first pause, owned by a fresh end user unless told otherwise."""
    if "conversation" not in kwargs:
        owner = kwargs.pop("owner", None) or make_user()
        kwargs["conversation"] = make_conversation(owner=owner)
    kwargs.setdefault("agent_name", "support")
    kwargs.setdefault("input", "cancel order 42")
    # The conversation's owner asked, as in the chat: the run acts on her behalf.
    kwargs.setdefault("requested_by", kwargs["conversation"].owner)
    kwargs.setdefault("status", RunStatus.WAITING)
    kwargs.setdefault("pause_count", 1)
    return AgentRun.objects.create(**kwargs)


def make_request(**kwargs: Any) -> ApprovalRequest:
    """A pending request, of its own waiting run unless `run` is given."""
    if "run" not in kwargs:
        kwargs["run"] = make_run()
    kwargs.setdefault("pause", kwargs["run"].pause_count or 1)
    kwargs.setdefault("call_id", f"call_{next(_calls)}")
    kwargs.setdefault("agent_name", "Support desk")
    kwargs.setdefault("tool_name", "cancel_order")
    kwargs.setdefault("arguments", {"order_id": 42})
    kwargs.setdefault("arguments_hash", arguments_hash(kwargs["arguments"]))
    created = kwargs.pop("created", None)
    request = ApprovalRequest.objects.create(**kwargs)
    if created is not None:
        ApprovalRequest.objects.filter(pk=request.pk).update(created=created)
        request.refresh_from_db()
    return request


def make_decision(**kwargs: Any) -> ApprovalDecision:
    """A row of the audit only: rita approves a new pending request, as she saw it, unless
    told otherwise. The request itself is left as it is (`runs.decide` changes both)."""
    if "request" not in kwargs:
        kwargs["request"] = make_request()
    if "reviewer" not in kwargs:
        kwargs["reviewer"] = make_reviewer()
    kwargs.setdefault("approved", True)
    kwargs.setdefault("arguments_hash", kwargs["request"].arguments_hash)
    return ApprovalDecision.objects.create(**kwargs)


def customer_for(text: str) -> Any:
    """The demo customer of the first order `text` names ("cancel order 42": alice), or a new
    user when it names none (or no seeded order)."""
    from demo.models import Order

    named = re.search(r"\border\s+(\d+)", text)
    order = Order.objects.filter(number=int(named.group(1))).first() if named else None
    if order is not None and order.customer is not None:
        return order.customer
    return make_user(username=f"alice{AgentRun.objects.count()}")


def start_run(text: str, agent_name: str = "support") -> Any:
    """A run of `agent_name` on `text`, queued in a new conversation by the customer of the
    demo order the text names (`customer_for`)."""
    from engine import runs

    alice = customer_for(text)
    conversation = make_conversation(owner=alice, agent_name=agent_name)
    return runs.start_run(conversation, text, alice)


def pause_run(text: str = "cancel order 42", owner: Any = None) -> AgentRun:
    """A real run of the demo agent on `text`, executed here until it asks for approval:
    waiting, with its one pending request. `owner` (by default the customer of the order the
    text names) asks. Needs `transaction=True` (the tools run in worker
    threads) and the `submitted` fixture (`executor.submit` recorded, not run)."""
    import asyncio

    from engine import runs

    owner = owner or customer_for(text)
    conversation = make_conversation(owner=owner, agent_name="support")
    run = runs.start_run(conversation, text, owner)
    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING, run.error
    assert run.approval_requests.pending().count() == 1
    return run


def pause_and_approve(text: str = "cancel order 42") -> AgentRun:
    """`pause_run(text)`, then rita approves its one request through the engine: the run is
    claimed for resume (resuming), its resume job handed to the executor, not run. Needs
    what `pause_run` needs."""
    from engine import runs

    run = pause_run(text)
    runs.decide(run.approval_requests.get(), make_reviewer(), runs.Decision.approve())
    run = AgentRun.objects.get(pk=run.pk)
    assert run.status == RunStatus.RESUMING
    return run


# --- what a run did -------------------------------------------------------------------------


def session_items(run: AgentRun) -> list[dict[str, Any]]:
    """The items of `run`'s conversation, as its session returns them."""
    import asyncio

    from conversations.session import DjangoSession

    return list(asyncio.run(DjangoSession(run.conversation.session_id).get_items()))


def outputs_for(run: AgentRun, call_id: str) -> list[dict[str, Any]]:
    """The outputs of the call `call_id` in `run`'s conversation: one for a call that ran."""
    return [
        item
        for item in session_items(run)
        if item.get("type") == "function_call_output" and item.get("call_id") == call_id
    ]


def cancellations(order: int = 42) -> int:
    """How many times the demo's `cancel_order` cancelled `order`: once at most, whatever
    was retried, replayed or raced."""
    from demo.models import OrderEvent

    return OrderEvent.objects.filter(order__number=order, kind=OrderEvent.Kind.CANCELLED).count()


# --- items of a conversation (the SDK's input items) ----------------------------------------


def user_message(text: str) -> dict[str, Any]:
    """What a person said, as the SDK stores it in a session."""
    return {"role": "user", "content": text}


# --- traces ---------------------------------------------------------------------------------


def make_trace(**kwargs: Any) -> Trace:
    """A finished trace of the support desk on T0's day, each one a second older than the one
    before. (A minute older each, a process's 541st trace fell on the day before: a test of
    the list's date filters then failed or passed by how many ran before it.)"""
    n = next(_numbers)
    kwargs.setdefault("trace_id", f"trace_{n:032x}")
    kwargs.setdefault("workflow_name", "agentsite: Support desk")
    kwargs.setdefault("group_id", f"conv_made_{n}")
    kwargs.setdefault("status", TraceStatus.OK)
    kwargs.setdefault("started_at", T0 - timedelta(seconds=n))
    if kwargs["started_at"] is not None:
        kwargs.setdefault("ended_at", kwargs["started_at"] + timedelta(seconds=2))
    kwargs.setdefault("metadata", {"agent": "support"})
    return Trace.objects.create(**kwargs)


def make_span(
    trace: Trace,
    span_type: str,
    name: str = "",
    *,
    parent: Span | str | None = None,
    start: float = 0.0,
    end: float = 0.1,
    **kwargs: Any,
) -> Span:
    """An unsaved span `start`..`end` seconds into the trace (save many with `bulk_create`)."""
    begun = (trace.started_at or T0) + timedelta(seconds=start)
    kwargs.setdefault("span_data", {"type": span_type, "name": name})
    return Span(
        span_id=kwargs.pop("span_id", f"span_{next(_numbers):024x}"),
        trace=trace,
        parent_id=parent.span_id if isinstance(parent, Span) else parent,
        span_type=span_type,
        name=name or span_type,
        started_at=begun,
        ended_at=begun + timedelta(seconds=end - start),
        **kwargs,
    )
