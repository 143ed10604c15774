"""DjangoSession's branches, turns and usage must answer exactly as the SDK's own
AdvancedSQLiteSession does.

The same random operation sequences run against both stores, over two interleaved session
ids: turns of every item shape, pops, clears, branches made from turns and from content,
switches, deletions, listings, searches, usage stored from fake run results; every answer
is compared, an error by its type and message. A failure names its seed, so it replays
exactly. What must differ is normalized, and only that:

- times: the SDK's are SQLite's CURRENT_TIMESTAMP (whole seconds of its own clock), so
  `created_at` and `timestamp` are left out, and branches listed in the same second have no
  defined order there: `list_branches` is compared sorted by branch id (ours lists them by
  their first item, oldest first);
- on PostgreSQL, the preview of a structured user message (its parts' JSON) in turn
  listings: `jsonb` does not keep key order (`turns_compared`);
- the current branch: the SDK keeps it in the session object, ours on the conversation, so
  a fresh DjangoSession object ("reopen") must go on where the old one was, while the SDK's
  object stays the same.

Generated branch ids hold the time ("branch_from_turn_2_<unix time>"): both modules read
the same fake clock, which the sequence moves on now and then.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from agents.extensions.memory import advanced_sqlite_session
from agents.extensions.memory.advanced_sqlite_session import AdvancedSQLiteSession
from agents.memory.session_settings import SessionSettings
from agents.usage import Usage
from django.db import connection
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

from conversations.session import DjangoSession, branches

pytestmark = pytest.mark.django_db(transaction=True)

SEQUENCES = 320
WORDS = [
    "order",
    "Order",
    "refund",
    "héllo",
    "日本語",
    "emoji 🤖",
    "50%",
    "snake_case",
    'a "quote"',
    "back\\slash",
    "tab\tline\nbreak",
    "Ωμέγα",
    "nul\x00byte",
    "lone\ud800half",
]
TOOLS = ["lookup_order", "cancel_order", "transfer_to_billing"]


class Clock:
    """The time both modules read to name a branch they generate."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def time(self) -> float:
        return self.now


def random_text(rng: random.Random) -> str:
    if rng.random() < 0.05:
        return ""
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4)))


def user_item(rng: random.Random) -> dict[str, Any]:
    roll = rng.random()
    if roll < 0.7:
        return {"role": "user", "content": random_text(rng)}
    if roll < 0.9:
        return {"role": "user", "content": [{"type": "input_text", "text": random_text(rng)}]}
    return {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": random_text(rng)},
            {"type": "input_image", "image_url": "https://example.com/a.png"},
        ],
    }


def other_item(rng: random.Random, n: int) -> dict[str, Any]:
    """Anything but a user message, of every shape the SDK stores and names tools for."""
    call_id = f"call_{n}"
    shapes = [
        lambda: {
            "type": "message",
            "role": "assistant",
            "id": f"msg_{n}",
            "status": "completed",
            "content": [{"type": "output_text", "text": random_text(rng), "annotations": []}],
        },
        lambda: {"role": "system", "content": random_text(rng)},
        lambda: {
            "type": "function_call",
            "call_id": call_id,
            "name": rng.choice(TOOLS),
            "arguments": json.dumps({"order_id": n}),
        },
        lambda: {
            "type": "function_call",
            "call_id": call_id,
            "name": "lookup",
            "namespace": rng.choice(["shop", "crm"]),
            "arguments": "{}",
        },
        lambda: {"type": "function_call_output", "call_id": call_id, "output": random_text(rng)},
        lambda: {"type": "reasoning", "id": f"rs_{n}", "summary": []},
        lambda: {
            "type": "mcp_call",
            "id": f"mcp_{n}",
            "server_label": rng.choice(["files", ""]),
            "name": rng.choice(["read", ""]),
            "arguments": "{}",
        },
        lambda: {"type": "mcp_call", "id": f"mcp_{n}", "arguments": "{}"},
        lambda: {"type": "mcp_approval_request", "id": f"mar_{n}", "server_label": "files"},
        lambda: {"type": "computer_call", "id": f"cc_{n}", "call_id": call_id, "action": {}},
        lambda: {"type": "shell_call", "id": f"sh_{n}", "call_id": call_id, "action": {}},
        lambda: {"type": "apply_patch_call", "id": f"ap_{n}", "call_id": call_id},
        lambda: {"type": "tool_search_call", "id": f"ts_{n}", "call_id": call_id},
        lambda: {"type": "tool_search_output", "id": f"tso_{n}", "call_id": call_id},
        lambda: {"type": "custom_tool_call", "call_id": call_id, "name": "grep", "input": "x"},
        lambda: {"type": "web_search_call", "id": f"ws_{n}", "status": "completed"},
    ]
    return rng.choice(shapes)()


def random_batch(rng: random.Random, counter: list[int]) -> list[dict[str, Any]]:
    """Mostly a turn (a user message, then what the agent did); sometimes no user message,
    two of them, or nothing."""
    shape = rng.choices(["turn", "tail", "two", "empty"], [7, 2, 1, 0.3])[0]
    batch: list[dict[str, Any]] = []
    users = {"turn": 1, "tail": 0, "two": 2, "empty": 0}[shape]
    for _ in range(users):
        batch.append(user_item(rng))
        for _ in range(rng.choice([0, 1, 1, 2, 3])):
            counter[0] += 1
            batch.append(other_item(rng, counter[0]))
    if shape == "tail":
        for _ in range(rng.randint(1, 3)):
            counter[0] += 1
            batch.append(other_item(rng, counter[0]))
    return batch


def texts_of(batch: list[dict[str, Any]]) -> list[str]:
    return [item["content"] for item in batch if isinstance(item.get("content"), str)]


def fake_result(rng: random.Random) -> Any:
    """What `store_run_usage` reads of a `RunResult`: its context wrapper's usage."""
    if rng.random() < 0.1:
        return SimpleNamespace(context_wrapper=SimpleNamespace(usage=None))
    inputs, outputs = rng.randint(0, 5000), rng.randint(0, 800)
    usage = Usage(
        requests=rng.randint(0, 4),
        input_tokens=inputs,
        output_tokens=outputs,
        total_tokens=inputs + outputs,
        input_tokens_details=InputTokensDetails(
            cached_tokens=rng.randint(0, inputs), cache_write_tokens=rng.randint(0, 9)
        ),
        output_tokens_details=OutputTokensDetails(reasoning_tokens=rng.randint(0, outputs)),
    )
    return SimpleNamespace(context_wrapper=SimpleNamespace(usage=usage))


async def answer(call: Any) -> tuple[str, Any]:
    """What a call gave: its value, or its error's type and message."""
    try:
        return "ok", await call
    except Exception as error:
        return "error", f"{type(error).__name__}: {error}"


def without_times(value: Any) -> Any:
    if isinstance(value, list):
        return [without_times(entry) for entry in value]
    if isinstance(value, dict):
        return {
            key: entry for key, entry in value.items() if key not in ("created_at", "timestamp")
        }
    return value


def turns_compared(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Turns without their times. On PostgreSQL, also without the preview of a structured
    content (a list of parts): the preview is that content's JSON, and `jsonb` keeps no key
    order, so its keys come back in PostgreSQL's order. The content itself is compared."""
    turns = without_times(turns)
    if connection.vendor == "postgresql":
        for turn in turns:
            if not isinstance(turn["full_content"], str):
                turn["content"] = "(structured)"
    return turns


class Run:
    """One sequence: both stores, the names it has seen, what it knows of each session."""

    def __init__(self, seed: int, db_path: Path) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.db_path = db_path
        self.ids = [f"seq{seed}-a", f"seq{seed}-b"]
        self.settings_limit = self.rng.choice([None, None, None, 3])
        self.pairs = {session_id: self.make_pair(session_id) for session_id in self.ids}
        self.branches: dict[str, list[str]] = {session_id: ["main"] for session_id in self.ids}
        self.counter = [0]
        # Texts of the user messages added: what a content search looks for.
        self.said: list[str] = []

    def make_ours(self, session_id: str) -> DjangoSession:
        return DjangoSession(
            session_id, session_settings=SessionSettings(limit=self.settings_limit)
        )

    def make_pair(self, session_id: str) -> tuple[DjangoSession, AdvancedSQLiteSession]:
        theirs = AdvancedSQLiteSession(
            session_id=session_id,
            db_path=self.db_path,
            create_tables=True,
            session_settings=SessionSettings(limit=self.settings_limit),
        )
        return self.make_ours(session_id), theirs

    def close(self) -> None:
        for _, theirs in self.pairs.values():
            theirs.close()

    def a_branch(self, session_id: str) -> str:
        roll = self.rng.random()
        if roll < 0.08:
            return self.rng.choice(["", " ", "nowhere"])
        made = self.branches[session_id][1:]
        if made and roll < 0.75:
            return self.rng.choice(made)
        return self.rng.choice(self.branches[session_id])

    def a_branch_or_none(self, session_id: str) -> str | None:
        return None if self.rng.random() < 0.6 else self.a_branch(session_id)

    def a_name(self, session_id: str) -> str | None:
        roll = self.rng.random()
        if roll < 0.45:
            return None  # generated from the clock
        if roll < 0.55:
            return self.rng.choice([*self.branches[session_id], "main", "  "])
        return "b-" + "".join(self.rng.choice(string.ascii_lowercase) for _ in range(4))

    def a_term(self) -> str:
        roll = self.rng.random()
        if roll < 0.15:
            return self.rng.choice(["", "%", "_", "\\", '"', "ORDER", "zzz", "\x00"])
        word = self.rng.choice(self.said or WORDS)
        start = self.rng.randint(0, max(0, len(word) - 2))
        term = word[start : start + self.rng.randint(1, 5)]
        return term.swapcase() if self.rng.random() < 0.3 else term

    async def step(self, step: int) -> None:
        rng = self.rng
        # Mostly the conversation that started with a few turns; the other one beside it.
        session_id = self.ids[0] if rng.random() < 0.8 else self.ids[1]
        ours, theirs = self.pairs[session_id]
        op = rng.choices(
            [
                "add",
                "get",
                "pop",
                "clear",
                "from_turn",
                "from_content",
                "switch",
                "delete",
                "list",
                "current",
                "turns",
                "find",
                "by_turns",
                "tools",
                "store_usage",
                "session_usage",
                "turn_usage",
                "reopen",
                "tick",
            ],
            [10, 4, 2, 0.3, 4, 1.5, 2, 2, 1.5, 1, 1, 1, 1, 1, 2, 1, 1, 1, 0.5],
        )[0]
        where = f"seed {self.seed}, step {step}, {op} on {session_id}"

        async def both(name: str, *args: Any, normalize: Any = None) -> tuple[str, Any]:
            mine = await answer(getattr(ours, name)(*args))
            sdk = await answer(getattr(theirs, name)(*args))
            if normalize is not None:
                mine = (mine[0], normalize(mine[1]) if mine[0] == "ok" else mine[1])
                sdk = (sdk[0], normalize(sdk[1]) if sdk[0] == "ok" else sdk[1])
            assert mine == sdk, f"{where}: {name}{args!r}"
            return mine

        if op == "add":
            batch = random_batch(rng, self.counter)
            self.said.extend(texts_of(batch))
            await both("add_items", batch)
            if rng.random() < 0.5:  # as a run does when it ends
                await both("store_run_usage", fake_result(rng))
        elif op == "get":
            limit = rng.choice([None, 0, 1, 2, 5, 50, -1])
            if rng.random() < 0.3:
                await both("get_items", limit, self.a_branch(session_id))
            else:
                await both("get_items", limit)
        elif op == "pop":
            await both("pop_item")
        elif op == "clear":
            await both("clear_session")
        elif op == "from_turn":
            turn = rng.choice([1, 1, 2, 2, 2, 3, 3, 4, 5, 7, 0, -1])
            status, value = await both("create_branch_from_turn", turn, self.a_name(session_id))
            if status == "ok":
                self.branches[session_id].append(value)
        elif op == "from_content":
            status, value = await both(
                "create_branch_from_content", self.a_term(), self.a_name(session_id)
            )
            if status == "ok":
                self.branches[session_id].append(value)
        elif op == "switch":
            await both("switch_to_branch", self.a_branch(session_id))
        elif op == "delete":
            await both("delete_branch", self.a_branch(session_id), rng.random() < 0.5)
        elif op == "list":
            await both(
                "list_branches",
                normalize=lambda rows: sorted(
                    without_times(rows), key=lambda row: row["branch_id"]
                ),
            )
        elif op == "current":
            assert await ours.current_branch_id() == theirs._current_branch_id, where
        elif op == "turns":
            await both(
                "get_conversation_turns",
                self.a_branch_or_none(session_id),
                normalize=turns_compared,
            )
        elif op == "find":
            await both(
                "find_turns_by_content",
                self.a_term(),
                self.a_branch_or_none(session_id),
                normalize=turns_compared,
            )
        elif op == "by_turns":
            await both("get_conversation_by_turns", self.a_branch_or_none(session_id))
        elif op == "tools":
            await both("get_tool_usage", self.a_branch_or_none(session_id))
        elif op == "store_usage":
            await both("store_run_usage", fake_result(rng))
        elif op == "session_usage":
            await both("get_session_usage", self.a_branch_or_none(session_id))
        elif op == "turn_usage":
            usage_turn = rng.choice([None, None, 0, 1, 2, 3, 5])
            await both("get_turn_usage", usage_turn, self.a_branch_or_none(session_id))
        elif op == "reopen":
            # A new request or run opens a new object: it goes on on the conversation's branch.
            self.pairs[session_id] = (self.make_ours(session_id), theirs)
        else:
            CLOCK.now += rng.choice([0.3, 1.0, 2.5])

    async def finish(self) -> None:
        for session_id, (ours, theirs) in self.pairs.items():
            where = f"seed {self.seed}, final, {session_id}"
            assert await ours.get_items() == await theirs.get_items(), where
            assert await ours.current_branch_id() == theirs._current_branch_id, where
            for branch in self.branches[session_id]:
                assert await ours.get_items(None, branch) == await theirs.get_items(None, branch), (
                    f"{where}, branch {branch}"
                )
            assert await ours.get_turn_usage() == await theirs.get_turn_usage(), where
            assert await ours.get_session_usage() == await theirs.get_session_usage(), where


CLOCK = Clock()


async def run_sequence(seed: int, db_path: Path) -> None:
    run = Run(seed, db_path)
    try:
        # A conversation of a few turns first, so that most sequences branch.
        ours, theirs = run.pairs[run.ids[0]]
        for _ in range(run.rng.randint(1, 4)):
            batch = random_batch(run.rng, run.counter)
            run.said.extend(texts_of(batch))
            await ours.add_items(batch)
            await theirs.add_items(batch)
        for step in range(run.rng.randint(10, 30)):
            await run.step(step)
        await run.finish()
    finally:
        run.close()


async def test_it_answers_like_advanced_sqlite_session_over_random_sequences(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(advanced_sqlite_session, "time", CLOCK)
    monkeypatch.setattr(branches, "time", CLOCK)
    db_path = tmp_path / "sdk.sqlite3"
    for seed in range(SEQUENCES):
        await run_sequence(seed, db_path)
