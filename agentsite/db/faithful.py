"""JSON that both databases store faithfully, whatever text it holds.

PostgreSQL's jsonb refuses a string holding U+0000 ("unsupported Unicode escape sequence") or a
lone surrogate (what a model or a tool may emit, and Python's `json` reads and writes), and
SQLite's JSON check refuses the latter: a session item, a saved run state or an approval's
arguments holding one failed the run. A value that holds either is stored wrapped, as its own
JSON text (ASCII, the odd characters as `\\u` escapes) inside a one-key object, and unwrapped
when read: `{"__agentsite_json__": "<json text>"}`. Every other value is stored as it is, so
queries into the JSON keep working for them (not for the rare wrapped rows).

The cost for an ordinary value: two substring scans of the JSON text it is written as anyway
(`encode_text`); only a value whose text holds `\\u0000` or a `\\ud…` escape is looked at again.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import models

WRAP_KEY = "__agentsite_json__"


def _holds_odd_text(text: str, value: Any) -> bool:
    """Whether the ASCII JSON `text` of `value` holds U+0000 or a lone surrogate (a valid pair,
    an emoji, is escaped as `\\ud83d\\ude00` too: it is told apart by encoding as UTF-8)."""
    if "\\u0000" in text:
        return True
    if "\\ud" not in text:
        return False
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _is_wrapper(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get(WRAP_KEY), str)


def encode(value: Any, *, allow_nan: bool = True) -> Any:
    """`value` as it can be stored: itself, or wrapped (see the module). A value shaped like
    a wrapper is wrapped too, so that reading it back gives it unchanged. With `allow_nan`
    off, NaN and Infinity raise `ValueError`; on, such a value is wrapped (JSON has no
    literal for them, but Python's reads its own `NaN` back)."""
    try:
        text = json.dumps(value, allow_nan=False)
    except ValueError:
        if not allow_nan:
            raise
        return {WRAP_KEY: json.dumps(value)}
    if _is_wrapper(value) or _holds_odd_text(text, value):
        return {WRAP_KEY: text}
    return value


def encode_text(value: Any) -> str:
    """`value` as JSON text to store (see `encode`), for plain SQL; NaN and Infinity raise
    `ValueError`."""
    text = json.dumps(value, allow_nan=False)
    if _is_wrapper(value) or _holds_odd_text(text, value):
        return json.dumps({WRAP_KEY: text})
    return text


def decode(value: Any) -> Any:
    """A stored value as it was before `encode`."""
    if _is_wrapper(value):
        return json.loads(value[WRAP_KEY])
    return value


class FaithfulJSONField(models.JSONField):
    """A JSONField that stores any value `json` can write, on both databases (see the module)."""

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        if value is not None and not hasattr(value, "as_sql"):
            value = encode(value)
        return super().get_db_prep_value(value, connection, prepared)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        return decode(super().from_db_value(value, expression, connection))
