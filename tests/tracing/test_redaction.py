"""Masking before storage: each kind of personal data and secret, and what must stay readable."""

from __future__ import annotations

import collections
import enum
import json
import math
import time
from typing import Any

import pytest

from tracing import redaction
from tracing.redaction import Cleaner, clean, iban_valid, luhn_valid, mask_text

VISA = "4111 1111 1111 1111"
MASTERCARD = "5555-5555-5555-4444"
AMEX = "378282246310005"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("write to jane.doe+shop@example.co.uk today", "write to [email] today"),
        ("call +1 415 555 2671 now", "call [phone] now"),
        ("call +44 20 7946 0958", "call [phone]"),
        ("call +33 1 42 68 53 00.", "call [phone]."),
        ("E.164: +14155552671", "E.164: [phone]"),
        ("call (415) 555-2671", "call [phone]"),
        ("call 415-555-2671 or 415.555.2671", "call [phone] or [phone]"),
        ("call 1-800-555-0199", "call [phone]"),
        (f"card {VISA} exp 12/29", "card [card] exp 12/29"),
        (f"card {MASTERCARD}", "card [card]"),
        (f"amex {AMEX}.", "amex [card]."),
        ("IBAN DE89 3704 0044 0532 0130 00 please", "IBAN [iban] please"),
        ("iban GB82WEST12345698765432", "iban [iban]"),
        ("key sk-proj-abcdefghijklmnopqrstuvwxyz0123", "key [secret]"),
        ("key sk-abcdefghijklmnopqrstuvwx", "key [secret]"),
        (
            "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig",
            "Authorization: Bearer [secret]",
        ),
        (
            "https://api.example.com/x?api_key=abcd1234efgh5678&q=1",
            "https://api.example.com/x?api_key=[secret]&q=1",
        ),
        ("token=ghijklmnopqrstu", "token=[secret]"),
        ('{"password": "hunter2hunter2"} in text', '{"password": "[secret]"} in text'),
        ("github ghp_abcdefghijklmnopqrstuvwxyz0123456789", "github [secret]"),
    ],
)
def test_it_masks_each_kind(text: str, expected: str) -> None:
    assert mask_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "where is order 42",
        "order #1234567 shipped",
        "refund 120.00 on order 7",
        "total $1,234.56",
        "2026-11-30T16:59:51.326814+00:00",
        "started 2026-11-30 16:59:51, ended 2026-11-30 17:01:02",
        "4111 1111 1111 1112",  # fails the Luhn check
        "1234567890123",  # 13 digits, fails the Luhn check
        "DE89 3704 0044 0532 0130 02",  # fails the mod-97 check (and Luhn)
        "span_62654f5249c5475f823f03d3 trace_70626ac8e60b4b09a90d22b8739a0628",
        "call_4bf54cf6c0ce499db8404c024e491586",
        "version 0.24.0, 3 requests, 54 tokens, total_tokens=54, max_tokens: 4096",
        "room 101, floor 3, +2 more",
        "ids 12345678 and 87654321",
        "sk-short",
    ],
)
def test_it_leaves_ordinary_numbers_and_ids_alone(text: str) -> None:
    assert mask_text(text) == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Two phone numbers in a row: the first must not swallow the second's area code.
        ("+44 20 7946 0958 (415) 555-2671", "[phone] [phone]"),
        ("call +44 20 7946 0958 (415) 555-2671 today", "call [phone] [phone] today"),
        ("+44 20 7946 0958 415-555-2671", "[phone] [phone]"),
        ("+1 (415) 555-2671 +44 20 7946 0958", "[phone] [phone]"),
        ("+44 (0)20 7946 0958", "[phone]"),
        # A card right after another number: the card is found where it starts.
        ("ref 12 4015 0616 9717 8447", "ref 12 [card]"),
        ("ref 1234 4015 0616 9717 8447", "ref 1234 [card]"),
        ("order 42 4015-0616-9717-8447 paid", "order 42 [card] paid"),
        ("4015 0616 9717 8447 ref 12", "[card] ref 12"),
        (f"{VISA} {MASTERCARD}", "[card] [card]"),
        ("ref 12 4015061697178447", "ref 12 [card]"),
    ],
)
def test_it_masks_numbers_next_to_other_numbers(text: str, expected: str) -> None:
    assert mask_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "orders 12 34 56 78 90 12 34 56",  # ids in a row: no phone, no card
        "amounts 120 45 80 135 990 1200 15",
        "dates 2026-11-30 2026-12-01 2026-12-02",
        "ref 12 4111 1111 1111 1112",  # the number after 12 fails Luhn: nothing to mask
        "12345678901234567890123456789012",  # one bare run of digits is never a card
        "41111111111111112",  # 17 digits: their first 16 pass Luhn, but a number ends at its end
    ],
)
def test_numbers_in_a_row_that_are_not_cards_or_phones_stay_readable(text: str) -> None:
    assert mask_text(text) == text


def test_the_checks_are_the_real_ones() -> None:
    assert luhn_valid("4111111111111111")
    assert not luhn_valid("4111111111111112")
    assert iban_valid("DE89 3704 0044 0532 0130 00")
    assert not iban_valid("DE89 3704 0044 0532 0130 02")


def test_it_masks_every_string_of_a_nested_value_and_json_inside_strings() -> None:
    span_data = {
        "type": "function",
        "name": "lookup_customer",
        "input": json.dumps({"email": "jane@example.com", "order_id": 42}),
        "output": [{"text": f"Jane pays with {VISA}", "amount": "120.00"}],
        "nested": {"deeper": ["+44 20 7946 0958", 7, 3.5, None, True]},
        "api_key": "anything-at-all",
        "total_tokens": 54,
    }

    cleaned = clean(span_data)

    assert json.loads(cleaned["input"]) == {"email": "[email]", "order_id": 42}
    assert cleaned["output"] == [{"text": "Jane pays with [card]", "amount": "120.00"}]
    assert cleaned["nested"] == {"deeper": ["[phone]", 7, 3.5, None, True]}
    assert cleaned["api_key"] == "[secret]"
    assert cleaned["total_tokens"] == 54
    assert cleaned["name"] == "lookup_customer"


def test_it_leaves_json_strings_byte_for_byte_when_nothing_is_masked() -> None:
    arguments = '{"order_id":42}'
    assert clean({"input": arguments})["input"] == arguments


def test_it_masks_a_card_number_sent_as_a_json_number() -> None:
    assert clean({"card": 4111111111111111, "order": 42, "ts": 1733000000}) == {
        "card": "[card]",
        "order": 42,
        "ts": 1733000000,
    }


def test_it_makes_any_value_storable() -> None:
    class Opaque:
        def __str__(self) -> str:
            return "opaque jane@example.com"

    value: dict[Any, Any] = {
        1: float("nan"),
        "set": {1},
        "obj": Opaque(),
        "nul": "a\x00b",
        "surrogate": "x\ud800y",
    }

    cleaned = clean(value)

    assert cleaned == {
        "1": None,
        "set": [1],
        "obj": "opaque [email]",
        "nul": "ab",
        "surrogate": "x?y",
    }
    json.dumps(cleaned, allow_nan=False).encode("utf-8")


def test_it_stores_as_is_when_masking_is_off(settings: Any) -> None:
    settings.AGENTSITE_TRACE_REDACTION = False
    assert clean({"text": "jane@example.com"}) == {"text": "jane@example.com"}


def test_it_applies_the_custom_patterns_of_the_setting(settings: Any) -> None:
    settings.AGENTSITE_TRACE_REDACT_PATTERNS = [
        r"\bCUST-\d{4,}\b",
        r"(?i)project (?:falcon|osprey)",
    ]
    assert mask_text("customer CUST-004211 asked about Project Falcon") == (
        "customer [redacted] asked about [redacted]"
    )
    assert mask_text("order 42") == "order 42"


def test_it_ignores_a_custom_pattern_that_is_not_a_regex_and_the_check_reports_it(
    settings: Any,
) -> None:
    from tracing.apps import check_redact_patterns

    settings.AGENTSITE_TRACE_REDACT_PATTERNS = ["(unclosed", r"secret-\d+"]
    assert mask_text("secret-42 stays out") == "[redacted] stays out"
    [error] = check_redact_patterns()
    assert error.id == "tracing.E001"
    assert "(unclosed" in error.msg


def test_the_patterns_setting_reads_a_json_list_or_commas(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentsite.settings import env_json_list

    monkeypatch.setenv("PATTERNS", r'["\\d{2,4}-x", "b"]')
    assert env_json_list("PATTERNS", []) == [r"\d{2,4}-x", "b"]
    monkeypatch.setenv("PATTERNS", "a+, b+")
    assert env_json_list("PATTERNS", []) == ["a+", "b+"]


@pytest.mark.parametrize(
    "text",
    [
        "a" * 100_000 + " 123",
        "1" * 100_000,
        "a." * 50_000 + "123",
        "+1" * 50_000,
        "a@" * 50_000,
        "1 " * 50_000,
        "1234 " * 20_000,
        "+44 20 " * 15_000,
    ],
)
def test_it_masks_long_strings_in_linear_time(text: str) -> None:
    # An unbounded email pattern took a minute on each of these.
    started = time.perf_counter()
    mask_text(text)
    assert time.perf_counter() - started < 2


# --- the fast paths change nothing ----------------------------------------------------------
# `clean` remembers each distinct string once per `Cleaner`, tests the first character before
# trying JSON, and returns unchanged containers as they are. `reference_clean` is the plain
# walk it replaced: each value must come out the same, one at a time or many in one Cleaner.


def reference_clean(value: Any, mask: bool = True, depth: int = 0) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if mask and 10**12 <= abs(value) < 10**19 and luhn_valid(str(abs(value))):
            return "[card]"
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return reference_string(value, mask, depth)
    if depth >= 64:
        return "[too deep]"
    if isinstance(value, dict):
        cleaned: dict[str, Any] = {}
        for key, item in value.items():
            name = reference_string(key if isinstance(key, str) else str(key), mask, depth, False)
            if mask and isinstance(item, str) and item and redaction._SECRET_KEY.match(name):
                cleaned[name] = "[secret]"
            else:
                cleaned[name] = reference_clean(item, mask, depth + 1)
        return cleaned
    if isinstance(value, list | tuple | set | frozenset):
        return [reference_clean(item, mask, depth + 1) for item in value]
    if hasattr(value, "model_dump"):
        try:
            return reference_clean(value.model_dump(mode="json"), mask, depth + 1)
        except Exception:
            pass
    return reference_string(str(value), mask, depth)


def reference_string(text: str, mask: bool, depth: int, nested: bool = True) -> str:
    text = text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    if not mask:
        return text
    if nested and depth < 64:
        stripped = text.strip()
        if len(stripped) >= 2 and stripped[0] in "{[" and stripped[-1] in "}]":
            try:
                inner = json.loads(stripped)
            except ValueError:
                inner = None
            if isinstance(inner, dict | list):
                cleaned = reference_clean(inner, mask, depth + 1)
                if cleaned == inner:
                    return text
                return json.dumps(cleaned, ensure_ascii=False)
    return mask_text(text)


class Colour(enum.StrEnum):
    RED = "red jane@example.com"


class Dumps:
    def model_dump(self, mode: str) -> dict[str, Any]:
        return {"email": "jane@example.com", "n": 1}


def nested(levels: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


DEEP_JSON = json.dumps(nested(8, {"email": "jane@example.com"}))
TRICKY_STRINGS = [
    "",
    " ",
    "plain words",
    "jane@example.com",
    VISA,
    "[email]",
    "[phone] and more]",
    "{not json}",
    "[1, 2",
    '{"order_id":42}',
    '  {"email": "jane@example.com"}  ',
    '\n\t[1, "call +44 20 7946 0958"]',
    '\u2003{"email": "jane@example.com"}',  # whitespace to str.strip, not to JSON
    '\x00{"email": "jane@example.com"}',  # JSON once the NUL is gone
    '\x00 [ "jane@example.com" ]',
    '{"password": "hunter2hunter2"}',
    '{"token": ""}',
    '{"nested": "{\\"email\\": \\"jane@example.com\\"}"}',
    "x\ud800y",
    "\ud800{}",
    "ünïcödé jane@example.com",
    DEEP_JSON,
    "sk-proj-abcdefghijklmnopqrstuvwxyz0123",
    "Bearer abcdefgh12345678",
]


def tricky_values() -> list[Any]:
    strings = TRICKY_STRINGS
    values: list[Any] = [*strings]
    values.append({text: text for text in strings})  # each string as a key and as a value
    values.extend({"api_key": text} for text in strings)  # a secret key's value, masked whole
    values.append(dict.fromkeys(("token", "Password", "apikey", "name", "[email]"), "abc"))
    values.append({"token": 4111111111111111, "password": None, "secret": ["x"], "pwd": ""})
    values.append({"[email]": 1, "jane@example.com": 2, "joe@example.com": 3})  # keys collide
    values.append({1: "a", False: "b", None: "c", 2.5: "d", ("t",): "e"})
    values.append(
        {
            "card": 4111111111111111,
            "order": 42,
            "big": 10**30,
            "nan": float("nan"),
            "inf": float("-inf"),
            "ok": 1.5,
            "flags": [True, False, None],
        }
    )
    values.append(("tuple", "jane@example.com", (1, 2)))
    values.append({"set": {"jane@example.com"}, "frozen": frozenset({"a"})})
    values.append(collections.OrderedDict(a="jane@example.com", b="b"))
    values.append(collections.UserString("user jane@example.com"))
    values.append([Colour.RED, {Colour.RED: Colour.RED}])
    values.append({"model": Dumps(), "object": object.__new__(Dumps)})
    values.append(nested(70, "jane@example.com"))
    values.append(nested(70, {"a": 1}))
    for levels in (0, 1, 55, 60, 62, 63, 64, 65):  # a JSON string near the depth limit
        values.append(nested(levels, DEEP_JSON))
        values.append(nested(levels, {"input": '{"email": "jane@example.com"}'}))
    values.append([["unchanged", 1, None], ["changed", "jane@example.com"], []])
    values.append({"a": {"b": {"c": "unchanged"}}, "d": {"e": VISA}})
    return values


def same(left: Any, right: Any) -> bool:
    """Equal, and stored alike (a tuple and a list are equal in JSON, not in Python)."""
    return json.dumps(left, sort_keys=False) == json.dumps(right, sort_keys=False)


@pytest.mark.parametrize("mask", [True, False])
def test_cleaning_is_the_plain_walk_value_by_value_and_in_one_cleaner(mask: bool) -> None:
    values = tricky_values()
    expected = [reference_clean(value, mask) for value in values]
    one_by_one = [clean(value, mask=mask) for value in values]
    cleaner = Cleaner(mask=mask)
    together = [cleaner.clean(value) for value in values]
    again = [cleaner.clean(value) for value in reversed(values)][::-1]  # remembered strings
    for value, want, *got in zip(values, expected, one_by_one, together, again, strict=True):
        for result in got:
            assert same(result, want), value


def test_cleaning_leaves_its_input_as_it_was() -> None:
    values = tricky_values()
    before = repr(values)
    Cleaner().clean(values)
    assert repr(values) == before


def test_what_is_cleaned_is_a_copy_that_later_changes_to_the_input_do_not_reach() -> None:
    # The SDK's span data holds the runs' own lists and dicts: what was masked must be what
    # is stored, even if one of them changes before the batch is written.
    messages = [{"role": "user", "content": "where is order 7"}]
    value = {"input": messages, "model": "m"}
    cleaned = clean(value)
    messages.append({"role": "user", "content": "jane@example.com"})
    messages[0]["content"] = "jane@example.com"
    assert cleaned == {"input": [{"role": "user", "content": "where is order 7"}], "model": "m"}


@pytest.mark.parametrize(
    "text",
    [
        '\u2003{"email": "jane@example.com"}',
        '\r\n[ "jane@example.com" ]',
        '\x00{"email": "jane@example.com"}',
    ],
)
def test_json_after_whitespace_or_a_nul_is_still_read_as_json(text: str) -> None:
    # The JSON check looks at the first character: one that str.strip or the NUL removal
    # takes away must not hide the JSON behind it.
    assert json.loads(clean(text)) in ({"email": "[email]"}, ["[email]"])


def test_a_cleaner_reads_the_settings_once(settings: Any) -> None:
    settings.AGENTSITE_TRACE_REDACT_PATTERNS = [r"\bCUST-\d{4,}\b"]
    cleaner = Cleaner()
    settings.AGENTSITE_TRACE_REDACTION = False
    assert cleaner.clean({"text": "CUST-004211 jane@example.com"}) == {"text": "[redacted] [email]"}
    assert Cleaner().clean("CUST-004211") == "CUST-004211"
