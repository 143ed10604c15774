"""The admin templates the site overrides stay Django's own but for what they change: a Django
release that changes its template fails here, so that the copy is taken again."""

from __future__ import annotations

from pathlib import Path

import django

ROOT = Path(__file__).resolve().parents[2]
DJANGOS = Path(django.__file__).parent / "contrib" / "admin" / "templates"


def without_comment(text: str) -> str:
    """`text` without the `{% comment %}` block that says why the site overrides it."""
    start, end = "{% comment %}", "{% endcomment %}\n"
    assert text.startswith(start)
    return text[text.index(end) + len(end) :]


def test_the_tabular_inline_is_djangos_but_for_its_scrolling_wrapper() -> None:
    path = "admin/edit_inline/tabular.html"
    ours = without_comment((ROOT / "templates" / path).read_text())
    djangos = (DJANGOS / path).read_text()
    wrapper = '  <div class="wrapper">\n'
    assert djangos.count(wrapper) == 1
    assert ours == djangos.replace(
        wrapper,
        '  <div class="wrapper" tabindex="0" role="region" '
        'aria-labelledby="{{ inline_admin_formset.formset.prefix }}-heading">\n',
    )
