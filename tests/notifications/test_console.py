"""Email in development (DEBUG on, no EMAIL_HOST) is printed on the server's console as a
person reads it (`notifications/console.py`): the review link whole, on one line, to click or
copy. With DEBUG off it is Django's own console backend, which Django's deployment check
refuses."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from django.utils.module_loading import import_string

from notifications import mail
from notifications.models import Notification
from tests.agentsite.test_settings import ROOT
from tests.factories import make_request
from tests.notifications import announce, link_of, opted_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]

BACKEND = "notifications.console.EmailBackend"


def test_it_prints_the_review_link_whole_on_one_line() -> None:
    rita = opted_in()
    request = make_request(agent_name="Café support desk")
    announce(request)
    message = mail.message(rita, [mail.item(Notification.objects.get(), rita)])
    stream = io.StringIO()

    assert import_string(BACKEND)(stream=stream).send_messages([message]) == 1

    printed = stream.getvalue()
    lines = printed.splitlines()
    link = link_of(message)
    assert len(link) > 78  # longer than a mail line: Django would encode it
    assert any(link in line for line in lines), printed
    assert "Café support desk" in printed  # not =C3=A9
    assert "Subject: [agentsite] cancel_order (Café support desk) waits for your review" in lines
    assert "To: rita@example.com" in lines
    assert lines[-1] == "-" * 79  # between emails, as Django's console backend writes


def mail_backend(**env: str) -> str:
    """The default mailer's backend of agentsite.settings, read in a new interpreter whose
    environment has `env` and no SMTP server."""
    environ = {
        name: value
        for name, value in os.environ.items()
        if name not in ("DEBUG", "SECRET_KEY", "EMAIL_HOST", "DJANGO_SETTINGS_MODULE")
    }
    environ.update(env)
    imported = subprocess.run(
        [sys.executable, "-c", "import agentsite.settings as s; print(s.MAILERS)"],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert imported.returncode == 0, imported.stderr
    return imported.stdout.strip()


def test_it_prints_the_emails_of_development_and_djangos_own_the_rest() -> None:
    assert mail_backend(DEBUG="1") == str({"default": {"BACKEND": BACKEND}})
    # Django's deployment check (mail.E001) refuses this one by its name.
    assert mail_backend(
        DEBUG="0", SECRET_KEY="a-production-secret-Xr4Tq9Lm2Vz7Kb1Nw8Hc5Jd3Pf6Gs0Ye-uA"
    ) == str({"default": {"BACKEND": "django.core.mail.backends.console.EmailBackend"}})
