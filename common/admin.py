"""What every app's admin shares: view-only mixins and how stored JSON is shown.

Nothing is registered here (the project package is not an app); each app's `admin.py`
imports what it needs, and nothing here imports the project.
"""

from __future__ import annotations

import json
from typing import Any

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


def pretty_json(value: Any, *, sort_keys: bool = True) -> SafeString | str:
    """A stored JSON value, indented in a <pre>; "-" for none."""
    if value is None:
        return "-"
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=sort_keys, default=str)
    return format_html('<pre class="pretty-json">{}</pre>', text)
