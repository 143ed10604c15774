"""The model service's API key, masked wherever a text may carry it.

A provider's error can quote the key it was sent: whole, or as OpenAI does, masked but for its
ends ("Incorrect API key provided: sk-proj-****…wxyz"). `mask_key` takes out the key itself, a
masked echo whose visible start or end is the key's, and the key's last characters wherever
they stand (for a key long enough that they cannot be a word). `MaskApiKey` does it to every
log line a handler writes.
"""

from __future__ import annotations

import logging
import re

from django.conf import settings

API_KEY_MASK = "[API key]"
# The end of a key that is a secret of its own (the canary tests look for it), for keys long
# enough that it is no common word.
TAIL = 8
MIN_KEY_WITH_TAIL = 20
# What a masked echo shows of the key's start or end, at least, to be taken for one.
MIN_SHOWN = 4

_MASKED_ECHO = re.compile(r"[A-Za-z0-9_\-]*\*{3,}[A-Za-z0-9_\-]*")


def api_key() -> str:
    try:
        return (getattr(settings, "OPENAI_API_KEY", "") or "").strip()
    except Exception:  # settings not configured yet: nothing to mask
        return ""


def mask_key(text: str, key: str) -> str:
    """`text` without `key`, its masked echoes or its tail."""
    if not key or not text:
        return text
    if key in text:
        text = text.replace(key, API_KEY_MASK)
    if "*" in text:
        text = _MASKED_ECHO.sub(lambda match: _echo(match.group(), key), text)
    if len(key) >= MIN_KEY_WITH_TAIL and key[-TAIL:] in text:
        text = text.replace(key[-TAIL:], API_KEY_MASK)
    return text


def _echo(token: str, key: str) -> str:
    shown_start = token.split("*", 1)[0]
    shown_end = token.rsplit("*", 1)[-1]
    if (len(shown_start) >= MIN_SHOWN and key.startswith(shown_start)) or (
        len(shown_end) >= MIN_SHOWN and key.endswith(shown_end)
    ):
        return API_KEY_MASK
    return token


def mask_api_key(text: str) -> str:
    """`text` without the configured OPENAI_API_KEY (`mask_key`)."""
    return mask_key(text, api_key())


class MaskApiKey(logging.Filter):
    """A handler's filter: the line it writes, traceback included, without the API key."""

    def filter(self, record: logging.LogRecord) -> bool:
        key = api_key()
        if not key:
            return True
        message = record.getMessage()
        masked = mask_key(message, key)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = mask_key(record.exc_text, key)
        if record.stack_info:
            record.stack_info = mask_key(record.stack_info, key)
        return True
