"""DjangoSession must answer exactly as the SDK's own SQLiteSession does.

The same random operation sequences run against both stores, over two interleaved session
ids, and every answer is compared. A failure names its seed, so it replays exactly.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from agents.memory import SQLiteSession
from agents.memory.session_settings import SessionSettings

from conversations.session import DjangoSession

pytestmark = pytest.mark.django_db(transaction=True)

SEQUENCES = 500
UNICODE = [
    "héllo",
    "日本語のテキスト",
    "emoji 🤖🚀",
    "مرحبا",
    "Ωμέγα",
    "tab\tand\nnewline",
    '"quoted" \\ slash',
    # What PostgreSQL's jsonb cannot hold, stored faithfully on both (agentsite/db/faithful.py).
    "nul\x00byte",
    "lone \udc80 low and \ud83d high surrogates",
]


def random_text(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.05:
        return ""
    if roll < 0.08:
        return "x" * 100_000  # a 100 KB payload
    return " ".join(rng.choice(UNICODE) for _ in range(rng.randint(1, 4)))


def random_item(rng: random.Random, n: int) -> dict[str, Any]:
    """One item of every shape the SDK stores in a session."""
    call_id = f"call_{n}"
    shapes = [
        lambda: {"role": "user", "content": random_text(rng)},
        lambda: {"role": "system", "content": random_text(rng)},
        lambda: {
            "role": "user",
            "content": [{"type": "input_text", "text": random_text(rng)}],
        },
        lambda: {
            "type": "message",
            "role": "assistant",
            "id": f"msg_{n}",
            "status": "completed",
            "content": [
                {"type": "output_text", "text": random_text(rng), "annotations": [], "logprobs": []}
            ],
        },
        lambda: {
            "type": "function_call",
            "call_id": call_id,
            "name": rng.choice(["lookup_order", "cancel_order", "transfer_to_billing"]),
            "arguments": json.dumps({"order_id": n, "note": "é"}),
            "id": f"fc_{n}",
            "status": "completed",
        },
        lambda: {"type": "function_call_output", "call_id": call_id, "output": random_text(rng)},
        lambda: {
            "type": "reasoning",
            "id": f"rs_{n}",
            "summary": [{"type": "summary_text", "text": random_text(rng)}],
        },
        lambda: {
            "type": "item_reference",
            "id": f"ref_{n}",
            "extra": {"nested": [1, 2.5, None, True]},
        },
    ]
    return rng.choice(shapes)()


def random_limit(rng: random.Random, size: int) -> int | None:
    return rng.choice([None, 0, 1, rng.randint(2, 5), size, size + rng.randint(1, 10), -1])


async def run_sequence(seed: int, db_path: Path) -> None:
    rng = random.Random(seed)
    ids = [f"seq{seed}-a", f"seq{seed}-b"]
    settings_limit = rng.choice([None, None, 3])

    def make_pair(session_id: str) -> tuple[DjangoSession, SQLiteSession]:
        session_settings = SessionSettings(limit=settings_limit)
        return (
            DjangoSession(session_id, session_settings=session_settings),
            SQLiteSession(session_id, db_path, session_settings=session_settings),
        )

    pairs = {session_id: make_pair(session_id) for session_id in ids}
    sizes = dict.fromkeys(ids, 0)
    counter = 0
    try:
        for step in range(rng.randint(5, 25)):
            session_id = rng.choice(ids)
            ours, theirs = pairs[session_id]
            op = rng.choices(["add", "get", "pop", "clear", "reopen"], [5, 5, 2, 1, 1])[0]
            where = f"seed {seed}, step {step}, {op} on {session_id}"
            if op == "add":
                batch = []
                for _ in range(rng.choice([0, 1, 1, 2, 3, 7])):
                    counter += 1
                    batch.append(random_item(rng, counter))
                await ours.add_items(batch)
                await theirs.add_items(batch)
                sizes[session_id] += len(batch)
            elif op == "get":
                limit = random_limit(rng, sizes[session_id])
                assert await ours.get_items(limit) == await theirs.get_items(limit), where
            elif op == "pop":
                popped = await ours.pop_item()
                assert popped == await theirs.pop_item(), where
                sizes[session_id] -= popped is not None
            elif op == "clear":
                await ours.clear_session()
                await theirs.clear_session()
                sizes[session_id] = 0
            else:  # a fresh object for an existing id
                theirs.close()
                pairs[session_id] = make_pair(session_id)
        for ours, theirs in pairs.values():
            assert await ours.get_items() == await theirs.get_items(), f"seed {seed}, final"
    finally:
        for _, theirs in pairs.values():
            theirs.close()


async def test_it_answers_like_sqlite_session_over_random_sequences(tmp_path: Path) -> None:
    db_path = tmp_path / "sdk.sqlite3"
    for seed in range(SEQUENCES):
        await run_sequence(seed, db_path)
