"""The session store's batch encoder and reader (`faithful.TextEncoder`, `decode_texts`)
write and read exactly what `encode_text` and `decode(json.loads(...))` do, one by one."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentsite.db import faithful

ODD = "a\x00b\udc80c\ud83dd 😀"


class Tuple(tuple):  # noqa: SLOT001
    pass


VALUES: list[Any] = [
    {"role": "user", "content": "Where is my order 7?"},
    {"type": "function_call", "arguments": '{"order_id":7}', "n": [1, 2.5, -0.0, 1e300, 10**30]},
    {"nested": {"a": [None, True, False, {"b": []}], "é": "ü → 😀", "": {}}},
    {"odd": ODD, ODD: [ODD]},
    {faithful.WRAP_KEY: "looks like a wrapper"},
    {faithful.WRAP_KEY: "x", "other": 1},
    "a string",
    "\\u0000 as text, not a NUL",
    7,
    3.25,
    None,
    True,
    [1, "two", {"three": 3}],
    {1: "int key", 2.5: "float key", False: "bool key", None: "none key"},
    Tuple((1, 2)),
]


def test_the_batch_encoder_writes_what_encode_text_writes() -> None:
    encode = faithful.TextEncoder()
    assert [encode(value) for value in VALUES] == [faithful.encode_text(v) for v in VALUES]


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ({"x": float("nan")}, ValueError),
        ([float("inf")], ValueError),
        ({"x": object()}, TypeError),
        ({"when": b"bytes"}, TypeError),
    ],
)
def test_the_batch_encoder_refuses_what_encode_text_refuses_and_goes_on(
    bad: Any, error: type[Exception]
) -> None:
    encode = faithful.TextEncoder()
    shared = {"shared": [1, 2]}
    assert encode(shared) == faithful.encode_text(shared)
    with pytest.raises(error) as raised:
        encode({"before": shared, "bad": bad})
    with pytest.raises(error) as expected:
        faithful.encode_text({"before": shared, "bad": bad})
    assert str(raised.value) == str(expected.value)
    # A value met inside the failed one is not taken for a circular reference afterwards.
    assert encode(shared) == faithful.encode_text(shared)
    assert encode([shared, shared]) == faithful.encode_text([shared, shared])


def test_the_batch_encoder_refuses_a_circular_value() -> None:
    circular: dict[str, Any] = {}
    circular["self"] = circular
    with pytest.raises(ValueError, match="Circular reference"):
        faithful.TextEncoder()(circular)


def test_a_batch_reads_back_as_each_text_alone() -> None:
    texts = [faithful.encode_text(value) for value in VALUES]
    one_by_one = [faithful.decode(json.loads(text)) for text in texts]
    assert faithful.decode_texts(texts) == one_by_one
    assert faithful.decode_texts(texts[:1]) == one_by_one[:1]
    assert faithful.decode_texts([]) == []
    # What json.loads reads around a value is read too.
    assert faithful.decode_texts([' {"a": 1}\n', "\t2 "]) == [{"a": 1}, 2]


def test_a_wrapper_whose_key_is_written_escaped_is_read_as_one() -> None:
    escaped = json.dumps({faithful.WRAP_KEY: json.dumps("x")}).replace("_", "\\u005f", 1)
    assert faithful.decode_texts([escaped]) == [faithful.decode(json.loads(escaped))] == ["x"]


def test_a_batch_of_parsed_values_is_read_one_by_one() -> None:
    wrapped = faithful.encode({"odd": ODD})
    assert faithful.decode_texts([{"a": 1}, wrapped, '{"b": 2}']) == [
        {"a": 1},
        {"odd": ODD},
        {"b": 2},
    ]


@pytest.mark.parametrize(
    "texts",
    [
        ['{"a": 1}', '{"cut off'],
        ['{"a": 1}', ""],
        # Not whole values (no column of ours holds them), which an array made of them would
        # hide: "[[1,2],3, 4]".
        ["[1", "2]", "3, 4"],
        ["1, 2"],
        [json.dumps({faithful.WRAP_KEY: "{cut off"})],
    ],
)
def test_a_batch_with_a_text_that_cannot_be_read_raises_as_reading_it_alone(
    texts: list[str],
) -> None:
    with pytest.raises(ValueError):
        faithful.decode_texts(texts)
