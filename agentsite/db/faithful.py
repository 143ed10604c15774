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

The session store writes and reads many small values at a time (`TextEncoder`,
`decode_texts`): `json.dumps` and `json.loads` pay per call, for setting up the encoder and for
their checks, about as much as the C code takes to write or read a small item, so the writer
sets its encoder up once for a batch and the reader calls the decoder's C part directly.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from json.encoder import encode_basestring_ascii
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
    `ValueError`. Many values: `TextEncoder`."""
    text = json.dumps(value, allow_nan=False)
    if _is_wrapper(value) or _holds_odd_text(text, value):
        return json.dumps({WRAP_KEY: text})
    return text


def decode(value: Any) -> Any:
    """A stored value as it was before `encode`."""
    if _is_wrapper(value):
        return json.loads(value[WRAP_KEY])
    return value


class TextEncoder:
    """`encode_text` for a batch of values: the same text, the same errors, with one encoder
    set up for the whole batch (`json.dumps` sets one up per call, which cost as much as
    writing a session item itself). One per batch: not for several threads at once."""

    def __init__(self) -> None:
        self._encode = _strict_encoder()

    def __call__(self, value: Any) -> str:
        try:
            text = self._encode(value)
        except BaseException:
            # The encoder's record of the containers it is inside may be left half full.
            self._encode = _strict_encoder()
            raise
        # Substring scans first: a wrapper's text names its key, an odd text its escape.
        odd = WRAP_KEY in text or "\\u0000" in text or "\\ud" in text
        if odd and (_is_wrapper(value) or _holds_odd_text(text, value)):
            return json.dumps({WRAP_KEY: text})
        return text


def _strict_encoder() -> Callable[[Any], str]:
    """What `json.dumps(value, allow_nan=False)` does for one value, set up once: the C
    encoder it makes on each call (the same arguments), else (no C accelerator) its own."""
    # The module's own name for its C accelerator (None without it); not in typeshed.
    c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
    if c_make_encoder is None:
        return json.JSONEncoder(allow_nan=False).encode
    base = json.JSONEncoder(allow_nan=False)
    encode = c_make_encoder(
        {},  # the markers of containers being written: a circular value is refused
        base.default,
        encode_basestring_ascii,
        None,
        base.key_separator,
        base.item_separator,
        base.sort_keys,
        base.skipkeys,
        base.allow_nan,
    )
    return lambda value: "".join(encode(value, 0))


def decode_texts(values: Sequence[Any]) -> list[Any]:
    """Stored values read by plain SQL (JSON text, or already parsed) as the values they hold:
    each as `decode(json.loads(text))` reads it, raising as it does (ValueError or TypeError)
    when one cannot be read.

    `json.loads` pays per call, beside the C code that reads the text, for its checks of the
    text's type and of what follows the value (a regular expression), as much as reading a
    small item takes: here the decoder's `raw_decode` reads a text that is one value and
    nothing more (what our columns hold), and `json.loads` the rest, which then reads or
    raises as before. Only a text that may name the wrapper's key is looked at for one."""
    loaded = []
    for value in values:
        if isinstance(value, str):
            try:
                item, end = _raw_decode(value)
            except ValueError:
                end = -1
            if end != len(value):
                item = json.loads(value)
            if WRAP_KEY in value or "\\u" in value:  # (its key may be written escaped)
                item = decode(item)
        else:
            item = decode(json.loads(value) if isinstance(value, bytes) else value)
        loaded.append(item)
    return loaded


_raw_decode = json.JSONDecoder().raw_decode


class FaithfulJSONField(models.JSONField):
    """A JSONField that stores any value `json` can write, on both databases (see the module)."""

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        if value is not None and not hasattr(value, "as_sql"):
            value = encode(value)
        return super().get_db_prep_value(value, connection, prepared)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        return decode(super().from_db_value(value, expression, connection))
