"""The operator's pages share one row of tabs (`templates/tracing/_tabs.html`), each page
marking its own."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from tests.factories import make_viewer

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "name, current",
    [
        ("trace_list", "Traces"),
        ("trace_conversations", "Conversations"),
        ("trace_dashboard", "Dashboard"),
        ("trace_costs", "Costs"),
    ],
)
def test_each_operator_page_has_the_tabs_and_marks_its_own(
    client: Client, name: str, current: str
) -> None:
    client.force_login(make_viewer())
    html = client.get(reverse(name)).content.decode()
    nav = re.search(r'<nav class="tabs" aria-label="Operations">(.*?)</nav>', html, re.S)
    assert nav is not None
    links = re.findall(r'<a href="([^"]+)"( aria-current="page")?>([^<]+)</a>', nav.group(1))
    assert [text for _, _, text in links] == ["Traces", "Conversations", "Dashboard", "Costs"]
    assert [text for _, marked, text in links if marked] == [current]
    assert {href for href, _, _ in links} == {
        reverse(n) for n in ("trace_list", "trace_conversations", "trace_dashboard", "trace_costs")
    }
