"""Path converters of the site's URLs."""

from __future__ import annotations

from django.urls import register_converter
from django.urls.converters import StringConverter


class KeyConverter(StringConverter):
    """`<key:...>`: a string id (a session id, a trace or span id), like `<str:...>` but never
    with a NUL in it: no id has one, and PostgreSQL refuses NUL in text, so a lookup by one
    would be a 500 there rather than the 404 every other database gives."""

    regex = r"[^/\x00]+"


register_converter(KeyConverter, "key")
