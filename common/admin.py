"""What every app's admin shares: view-only mixins and how stored JSON is shown.

Nothing is registered here (the project package is not an app); each app's `admin.py`
imports what it needs, and nothing here imports the project.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString


class NoEditAdminMixin:
    """Rows the site writes itself: viewable by staff with the view permission, never added
    or changed here (a saved form would write back every column it loaded over what the site
    wrote meanwhile). Staff allowed to may still delete them."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyAdminMixin(NoEditAdminMixin):
    """As `NoEditAdminMixin`, and never deleted here either."""

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ValuesListFilter(admin.AllValuesFieldListFilter):
    """Django's filter by each value a text column holds, where the empty text is named
    "(empty)": Django's own lists it as a link with no text, which nobody can read (a screen
    reader finds no name for it, anybody else nothing to click). For `list_filter` entries
    `("column", ValuesListFilter)` of a column that may be blank."""

    EMPTY = "(empty)"

    def choices(self, changelist: Any) -> Any:
        for choice in super().choices(changelist):
            display = str(choice["display"])
            # With facets on, the empty value's text is its count alone: " (3)".
            if display == "" or (changelist.add_facets and display.startswith(" (")):
                choice = {**choice, "display": self.EMPTY + display}
            yield choice


def pretty_json(value: Any, *, sort_keys: bool = True) -> SafeString | str:
    """A stored JSON value, indented in a <pre>; "-" for none."""
    if value is None:
        return "-"
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=sort_keys, default=str)
    return format_html('<pre class="pretty-json">{}</pre>', text)
