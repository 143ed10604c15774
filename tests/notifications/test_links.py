"""The link each email carries (`notifications/links.py`, its landing in `views.py`): a link
tampered with, expired or another person's is refused and changes nothing."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.core import signing
from django.test import Client

from notifications import links
from tests.agentsite.test_csp import inline_code
from tests.factories import (
    make_request,
    make_reviewer,
    make_user,
)
from tests.notifications import unchanged

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]


def test_a_tampered_expired_or_another_persons_link_is_refused_and_changes_nothing(
    client: Client, settings: Any
) -> None:
    rita = make_reviewer("rita")
    ines = make_reviewer("ines")
    request = make_request()
    client.force_login(rita)

    good = links.token(request.pk, rita.pk)
    assert client.get("/notifications/open/", {"t": good})["Location"] == f"/inbox/{request.pk}/"

    tampered = good[:-3] + ("aaa" if not good.endswith("aaa") else "bbb")
    other_request = links.token(request.pk + 1, rita.pk).split(":")[0] + good[good.index(":") :]
    for bad in (tampered, other_request, "", "not-a-token", good + "x"):
        answer = client.get("/notifications/open/", {"t": bad})
        assert answer.status_code == 400, bad
        assert "This link is not valid" in answer.content.decode()
        assert inline_code(answer.content.decode()) == []

    # Another reviewer's link: refused for rita, whatever she is allowed to see.
    answer = client.get("/notifications/open/", {"t": links.token(request.pk, ines.pk)})
    assert answer.status_code == 403
    assert "sent to another person" in answer.content.decode()

    # Made with another salt (another signed thing of the site) is not a link.
    other = signing.TimestampSigner(salt="another").sign_object({"r": request.pk, "u": rita.pk})
    assert client.get("/notifications/open/", {"t": other}).status_code == 400

    settings.AGENTSITE_EMAIL_LINK_SECONDS = 60
    signer = signing.TimestampSigner(salt=links.SALT)
    old = signer.sign_object({"r": request.pk, "u": rita.pk}, compress=True)
    original_time = time.time
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time", lambda: original_time() + 61)
        answer = client.get("/notifications/open/", {"t": old})
    assert answer.status_code == 410
    assert "This link has expired" in answer.content.decode()
    client.logout()
    assert client.get("/notifications/open/", {"t": tampered}).status_code == 400
    unchanged(request)


def test_someone_who_may_not_review_is_told_the_link_is_for_reviewers_and_offered_her_chats(
    client: Client,
) -> None:
    rita = make_reviewer("rita")
    alice = make_user(username="alice")  # the demo customer: chats, no inbox
    request = make_request()
    client.force_login(alice)

    forwarded = links.token(request.pk, rita.pk)  # rita's email, forwarded to her
    hers = links.token(request.pk, alice.pk)  # sent while she still was a reviewer
    for token in (forwarded, hers, "not-a-token"):
        answer = client.get("/notifications/open/", {"t": token})
        assert answer.status_code == 403, token
        html = answer.content.decode()
        card = html.split('class="card error-page"', 1)[1]
        assert "This request is for reviewers" in card
        assert 'href="/chats/"' in card
        assert "inbox" not in card.lower()
        assert inline_code(html) == []
    unchanged(request)
