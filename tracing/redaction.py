"""Masking of personal data and secrets before anything reaches the trace store.

`clean(value)` walks any JSON-like value and returns a JSON-safe copy in which every string is
masked, including strings that themselves hold JSON (a function span's `input` is one): those
are parsed, masked inside and written back. Dict values under secret-looking keys (`api_key`,
`token`, `password`, ...) are masked whole.

What is masked (`AGENTSITE_TRACE_REDACTION`, on by default):
- email addresses -> `[email]`
- phone numbers, international (`+44 20 7946 0958`) and US (`(415) 555-2671`, `415-555-2671`)
  -> `[phone]`, also two in a row; a bare run of digits (or several, space-separated) is never
  taken for a phone number, so order ids, amounts, dates and timestamps stay readable
- card numbers: 13-19 digits, together or in a card's groups (4-4-4-4, 4-6-5, one separator),
  only when they pass the Luhn check -> `[card]`, also right after another number
- IBANs, only when they pass the mod-97 check -> `[iban]`
- API keys (`sk-...`, `sk-proj-...` and a few well-known token prefixes), values after
  `api_key=` / `token=` / `password=`-like names, `Bearer ...` -> `[secret]`
- every match of the regexes in `AGENTSITE_TRACE_REDACT_PATTERNS` -> `[redacted]`
"""

from __future__ import annotations

import functools
import json
import logging
import math
import re
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings

from common import secrets

logger = logging.getLogger(__name__)

EMAIL = "[email]"
PHONE = "[phone]"
CARD = "[card]"
IBAN = "[iban]"
SECRET = "[secret]"
CUSTOM = "[redacted]"

_SECRET_NAMES = (
    r"api[_-]?key|apikey|access[_-]?token|refresh[_-]?token|auth[_-]?token|id[_-]?token|"
    r"client[_-]?secret|secret[_-]?key|secret|token|password|passwd|pwd|authorization"
)
# A dict key that names a secret: its (string) value is masked whole.
_SECRET_KEY = re.compile(rf"^(?:{_SECRET_NAMES})$", re.IGNORECASE)

_BEARER = re.compile(r"\b(Bearer|Basic)\s+[A-Za-z0-9\-._~+/]{8,}=*", re.IGNORECASE)
_API_KEY = re.compile(
    r"(?<![\w-])(?:"
    # OpenAI, Anthropic, Stripe
    r"sk-(?:proj-|ant-|live-|test-|svcacct-|admin-)?[A-Za-z0-9_\-]{16,}"
    r"|(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}"  # GitHub
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"  # Slack
    r"|AKIA[0-9A-Z]{16}"  # AWS access key id
    r")"
)
# `api_key=abc...`, `"token": "abc..."`, `password: hunter22`: the name stays, the value goes.
_ASSIGNED_SECRET = re.compile(
    rf"""(?P<name>["']?\b(?:{_SECRET_NAMES})\b["']?\s*[:=]\s*["']?)"""
    r"""(?P<value>(?!(?:Bearer|Basic)\b)[^\s"'&,;<>\[\]]{6,})""",
    re.IGNORECASE,
)
# Bounded parts (RFC 5321 limits): unbounded ones make the scan quadratic in a long string.
_EMAIL = re.compile(
    r"[A-Za-z0-9._%+\-]{1,64}@[A-Za-z0-9\-]{1,63}(?:\.[A-Za-z0-9\-]{1,63}){0,8}\.[A-Za-z]{2,24}\b"
)
# 13-19 digits, printed as a card is: all together, in groups of four (the last one shorter,
# 19 digits as 4-4-4-4-3) or as 4-6-5 / 4-6-4 (Amex, Diners), one separator throughout; Luhn
# decides. Numbers spaced any other way (ids, amounts, dates in a row) are not taken for a
# card, and a card right after another number is found where it starts.
_CARD = re.compile(
    r"(?<![\w\-.])(?:\d{13,19}"
    r"|\d{4}(?P<sep>[ \-])\d{4}(?P=sep)\d{4}(?P=sep)\d{1,4}(?:(?P=sep)\d{1,3})?"
    r"|\d{4}(?P<amex>[ \-])\d{6}(?P=amex)\d{4,5})(?![\w])"
)
# Country code, check digits, then up to 30 letters/digits, single spaces allowed; mod-97 decides.
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b", re.IGNORECASE)
# A country code, then two to five groups; only the first group after the country code may
# stand in parentheses (`+44 (0)20 ...`, `+1 (415) ...`), so that a number written right
# after this one, `(415) 555-2671`, is not taken for more of it. 8-15 digits (E.164).
_PHONE_INTERNATIONAL = re.compile(
    r"(?<![\w+])\+\d{1,3}(?:[ .\-]?(?:\(\d{1,4}\)|\d{1,4}))(?:[ .\-]?\d{1,4}){1,4}(?![\w])",
)
# `(415) 555-2671`, `415-555-2671`, `415.555.2671`; not `415 555 2671`, which is as likely
# three numbers in a row (amounts, ids) as a phone number.
_PHONE_US = re.compile(
    r"(?<![\w\-.+])(?:1[ .\-])?(?:\(\d{3}\) ?\d{3}[ .\-]|\d{3}(?P<sep>[.\-])\d{3}(?P=sep))\d{4}"
    r"(?![\w\-])",
)
_PHONE_DIGITS = range(8, 16)


def luhn_valid(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = int(char)
        if index % 2 == 1:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return total % 10 == 0


def iban_valid(candidate: str) -> bool:
    code = candidate.replace(" ", "").upper()
    if not 15 <= len(code) <= 34 or not code[:2].isalpha() or not code[2:4].isdigit():
        return False
    rearranged = code[4:] + code[:4]
    number = "".join(str(int(char, 36)) for char in rearranged)
    return int(number) % 97 == 1


def _longest_valid_prefix(
    raw: str, is_valid: Callable[[str], bool], keep: Callable[[str], str], min_length: int
) -> int:
    """The length of the longest prefix of `raw` whose kept characters pass `is_valid`, or 0.

    Greedy regexes may swallow a following word or digit group; the number is its start.
    A number ends where a group of its characters ends, never inside one."""
    for end in range(len(raw), 0, -1):
        if not raw[end - 1].isalnum() or (end < len(raw) and raw[end].isalnum()):
            continue
        kept = keep(raw[:end])
        if len(kept) < min_length:
            return 0
        if is_valid(kept):
            return end
    return 0


def _checked(
    pattern: re.Pattern[str],
    text: str,
    is_valid: Callable[[str], bool],
    keep: Callable[[str], str],
    min_length: int,
    label: str,
) -> str:
    def replace(match: re.Match[str]) -> str:
        raw = match.group(0)
        end = _longest_valid_prefix(raw, is_valid, keep, min_length)
        return label + raw[end:] if end else raw

    return pattern.sub(replace, text)


def _cards(text: str) -> str:
    """`text` with its card numbers masked. A match that fails Luhn is tried again from its
    next group: `ref 1234 4015 0616 9717 8447` holds a card that starts at 4015."""
    parts: list[str] = []
    done = searched = 0
    while match := _CARD.search(text, searched):
        raw = match.group(0)
        end = _longest_valid_prefix(raw, luhn_valid, _digits, 13)
        if end:
            parts += [text[done : match.start()], CARD]
            done = searched = match.start() + end
            continue
        separator = next((i for i, char in enumerate(raw) if not char.isdigit()), None)
        searched = match.start() + separator + 1 if separator is not None else match.end()
    return "".join([*parts, text[done:]]) if parts else text


def contains_card(text: str) -> bool:
    """Whether `text` holds a card number, as masking finds them (Luhn-checked)."""
    return _cards(text) != text


def _digits(text: str) -> str:
    return "".join(char for char in text if char.isdigit())


def _alnum(text: str) -> str:
    return "".join(char for char in text if char.isalnum())


def _phone(match: re.Match[str]) -> str:
    """An international number; one with too many digits is two numbers in a row, the first
    of them cut at the end of a group: where a US number follows if one does, else as late
    as E.164 allows. What follows the cut is read again by `_PHONE_US`."""
    raw = match.group(0)
    if len(_digits(raw)) in _PHONE_DIGITS:
        return PHONE
    text, start = match.string, match.start()
    cuts = [
        end
        for end in range(len(raw), 0, -1)
        if raw[end - 1].isdigit()
        and end < len(raw)
        and not raw[end].isalnum()
        and len(_digits(raw[:end])) in _PHONE_DIGITS
    ]
    if not cuts:
        return raw
    for end in cuts:
        rest = start + end
        while rest < len(text) and text[rest] in " .-":
            rest += 1
        if rest > start + end and _PHONE_US.match(text, rest):
            return PHONE + raw[end:]
    return PHONE + raw[cuts[0] :]


def mask_text(text: str) -> str:
    """`text` with personal data and secrets replaced by markers (custom patterns included)."""
    custom = custom_patterns()
    if len(text) <= _CACHED_LENGTH:
        return _mask_cached(text, custom)
    return _mask(text, custom)


# Traces repeat themselves (each generation span carries the conversation so far), so the
# same strings come back again and again; short ones are remembered.
_CACHED_LENGTH = 4096


@functools.lru_cache(maxsize=4096)
def _mask_cached(text: str, custom: tuple[re.Pattern[str], ...]) -> str:
    return _mask(text, custom)


def _mask(text: str, custom: tuple[re.Pattern[str], ...]) -> str:
    if _MIGHT_HOLD_DATA.search(text):
        text = _BEARER.sub(lambda m: f"{m.group(1)} {SECRET}", text)
        text = _API_KEY.sub(SECRET, text)
        text = _ASSIGNED_SECRET.sub(lambda m: m.group("name") + SECRET, text)
        if "@" in text:
            text = _EMAIL.sub(EMAIL, text)
        text = _checked(_IBAN, text, iban_valid, _alnum, 15, IBAN)
        text = _cards(text)
        text = _PHONE_INTERNATIONAL.sub(_phone, text)
        text = _PHONE_US.sub(PHONE, text)
    for pattern in custom:
        text = pattern.sub(CUSTOM, text)
    return text


# Every built-in pattern needs one of these; most strings in a trace (names, ids, short
# words) have none and skip the regexes.
_MIGHT_HOLD_DATA = re.compile(
    rf"@|\d\d\d|\+\d|\b(?:{_SECRET_NAMES}|bearer|basic)\b|sk-|gh[pousr]_|github_pat_|xox|AKIA",
    re.IGNORECASE,
)


def custom_patterns() -> tuple[re.Pattern[str], ...]:
    return _compile(tuple(getattr(settings, "AGENTSITE_TRACE_REDACT_PATTERNS", ()) or ()))


@functools.lru_cache(maxsize=8)
def _compile(sources: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    compiled = []
    for source in sources:
        try:
            compiled.append(re.compile(source))
        except re.error as exc:
            logger.error(
                "AGENTSITE_TRACE_REDACT_PATTERNS: %r is not a regex (%s); ignored.", source, exc
            )
    return tuple(compiled)


def invalid_patterns(sources: Iterable[str]) -> list[tuple[str, str]]:
    """The patterns that do not compile, with the reason (for the system check)."""
    invalid = []
    for source in sources:
        try:
            re.compile(source)
        except re.error as exc:
            invalid.append((source, str(exc)))
    return invalid


def enabled() -> bool:
    return bool(getattr(settings, "AGENTSITE_TRACE_REDACTION", True))


def clean(value: Any, *, mask: bool | None = None) -> Any:
    """A JSON-safe copy of `value`, masked when `mask` (default: the setting) is on.

    Never raises for odd values: objects JSON cannot hold become their `str()`, non-finite
    floats become null, and strings lose NUL characters and unpaired surrogates (PostgreSQL's
    jsonb refuses both).
    """
    return Cleaner(mask=mask).clean(value)


_MAX_DEPTH = 64


class Cleaner:
    """`clean` for many values in a row (the exporter makes one per batch): the settings are
    read once, and each distinct string is cleaned once; traces repeat the same strings (each
    generation span carries the conversation so far, a tool's arguments come back as its
    span's input) again and again.

    What a string becomes depends on the string alone, except for one that may hold JSON:
    that one is parsed and cleaned inside, to a depth limit, so it is remembered per depth.
    """

    __slots__ = ("_api_key", "_custom", "_json", "_keys", "_strings", "mask")

    def __init__(self, *, mask: bool | None = None) -> None:
        self.mask = enabled() if mask is None else mask
        # Masked whatever `mask` says: a provider's error may quote the key it was sent.
        self._api_key = secrets.api_key()
        self._custom = custom_patterns() if self.mask else ()
        self._strings: dict[str, str] = {}  # a string that cannot hold JSON -> cleaned
        self._json: dict[tuple[str, int], str] = {}  # (a string that may, depth) -> cleaned
        self._keys: dict[str, tuple[str, bool]] = {}  # a dict key -> (cleaned, names a secret)

    def clean(self, value: Any) -> Any:
        return self._clean(value, 0)

    def _clean(self, value: Any, depth: int) -> Any:
        kind = type(value)
        if kind is str:
            cleaned = self._strings.get(value)
            return self._string(value, depth) if cleaned is None else cleaned
        if value is None or kind is bool:
            return value
        if kind is int:
            # A card number sent as a JSON number.
            if self.mask and 10**12 <= abs(value) < 10**19 and luhn_valid(str(abs(value))):
                return CARD
            return value
        if kind is float:
            return value if math.isfinite(value) else None
        if kind is dict and depth < _MAX_DEPTH:
            return self._dict(value, depth)
        if kind is list and depth < _MAX_DEPTH:
            return self._list(value, depth)
        return self._other(value, depth)

    def _dict(self, value: dict[Any, Any], depth: int) -> dict[str, Any]:
        # Always a copy: the SDK's span data holds the runs' own objects, and what was masked
        # must be what is stored, even if one of them changes before the batch is written.
        cleaned: dict[str, Any] = {}
        keys = self._keys
        strings = self._strings
        below = depth + 1
        for key, item in value.items():
            entry = keys.get(key) if type(key) is str else None
            if entry is None:
                entry = self._key(key)
            name, secret = entry
            if type(item) is str:  # `_clean`'s first case, inlined: most values are strings
                if secret and item:
                    cleaned[name] = SECRET
                else:
                    text = strings.get(item)
                    cleaned[name] = self._string(item, below) if text is None else text
            elif item is None:
                cleaned[name] = None
            elif secret and isinstance(item, str) and item:
                cleaned[name] = SECRET
            else:
                cleaned[name] = self._clean(item, below)
        return cleaned

    def _list(self, value: list[Any], depth: int) -> list[Any]:
        strings = self._strings
        below = depth + 1
        cleaned: list[Any] = []
        for item in value:
            if type(item) is str:
                text = strings.get(item)
                cleaned.append(self._string(item, below) if text is None else text)
            else:
                cleaned.append(self._clean(item, below))
        return cleaned

    def _key(self, key: Any) -> tuple[str, bool]:
        text = key if isinstance(key, str) else str(key)
        name = self._text(text)
        entry = (name, bool(self.mask and _SECRET_KEY.match(name)))
        if type(key) is str:
            self._keys[key] = entry
        return entry

    def _other(self, value: Any, depth: int) -> Any:
        """What the fast paths of `_clean` leave: subclasses, containers at the depth limit,
        tuples and sets, objects."""
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):
            if self.mask and 10**12 <= abs(value) < 10**19 and luhn_valid(str(abs(value))):
                return CARD
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else None
        if isinstance(value, str):
            return self._compute_string(value, depth)
        if depth >= _MAX_DEPTH:
            return "[too deep]"
        if isinstance(value, dict):
            return self._dict(value, depth)
        if isinstance(value, list | tuple | set | frozenset):
            return [self._clean(item, depth + 1) for item in value]
        if hasattr(value, "model_dump"):
            try:
                return self._clean(value.model_dump(mode="json"), depth + 1)
            except Exception:
                pass
        return self._compute_string(str(value), depth)

    def _string(self, text: str, depth: int) -> str:
        """A `str` value (not a dict key), remembered: by itself when it cannot hold JSON,
        else with its depth."""
        key = (text, depth)
        cleaned = self._json.get(key)
        if cleaned is not None:
            return cleaned
        cleaned = self._compute_string(text, depth)
        if self.mask and _may_be_json(_storable(text)):
            self._json[key] = cleaned
        else:
            self._strings[text] = cleaned
        return cleaned

    def _compute_string(self, text: str, depth: int) -> str:
        text = secrets.mask_key(_storable(text), self._api_key)
        if not self.mask:
            return text
        if depth < _MAX_DEPTH and _may_be_json(text):
            inner = _json_inside(text)
            if inner is not None:
                cleaned = self._clean(inner, depth + 1)
                if cleaned == inner:
                    return text
                return json.dumps(cleaned, ensure_ascii=False)
        return self._masked(text)

    def _text(self, text: str) -> str:
        """A string never read as JSON (a dict key)."""
        text = secrets.mask_key(_storable(text), self._api_key)
        return self._masked(text) if self.mask else text

    def _masked(self, text: str) -> str:
        if len(text) <= _CACHED_LENGTH:
            return _mask_cached(text, self._custom)
        return _mask(text, self._custom)


def _may_be_json(text: str) -> bool:
    """False for a string `_json_inside` certainly refuses: its first character that
    `str.strip` keeps is not `{` or `[` (`isspace` is what `strip` removes)."""
    return bool(text) and (text[0] in "{[" or text[0].isspace())


def _json_inside(text: str) -> Any:
    stripped = text.strip()
    if len(stripped) < 2 or stripped[0] not in "{[" or stripped[-1] not in "}]":
        return None
    try:
        parsed = json.loads(stripped)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict | list) else None


def _storable(text: str) -> str:
    if "\x00" in text:
        text = text.replace("\x00", "")
    if text.isascii():  # no surrogate: nothing to replace
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text
