"""The README's JSON API examples, run as written against a real server of a fresh demo: only
its address and the two tokens (made on /account/tokens/ by people) are put in."""

from __future__ import annotations

import io
import re
import subprocess
import time
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from api.models import ApiToken, Scope
from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from demo.models import Order
from engine.models import AgentRun, RunStatus
from tests.live import LiveSite

pytestmark = [pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
ADDRESS = "http://127.0.0.1:8000"
# Every curl the block runs says how it was answered, on stderr (its output stays as it was);
# the first command that fails (a python3 that cannot read its answer included) stops it.
SAYS = r"%{stderr}HTTP %{http_code} %{method} %{url_effective}\n"
PROLOGUE = f"""curl() {{ command curl -sS --write-out '{SAYS}' "$@"; }}
set -eu
"""


def api_block() -> str:
    """The shell block of the README's "JSON API" section."""
    section = (ROOT / "README.md").read_text().split("\n## JSON API\n", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```sh\n(.*?)```", section, re.S)
    return str(block)


def with_tokens(block: str, secrets: dict[str, str]) -> str:
    """`block` with each `NAME="... agt_..."` placeholder holding NAME's token."""

    def put_in(match: re.Match[str]) -> str:
        return match.group(1) + secrets[match.group(2)]

    return re.sub(r"^((\w+)=\"?(?:Authorization: Bearer )?)agt_\.\.\.", put_in, block, flags=re.M)


def wait_for(run: AgentRun, status: str, within: float = 30) -> AgentRun:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.status == status:
            return run
        time.sleep(0.2)
    raise AssertionError(f"run {run.pk} is {run.status}, not {status}: {run.error}")


def test_the_readme_s_api_examples_run_against_a_fresh_demo(live_site: LiveSite) -> None:
    call_command("seed_demo", stdout=io.StringIO())
    users = get_user_model().objects
    alice, rita = users.get(username="alice"), users.get(username="rita")
    # What the README asks of people first: alice opened a conversation on /chats/, and each
    # made a "read and decide" token on /account/tokens/.
    browser = Client()
    browser.force_login(alice)
    assert browser.post(reverse("chat_new")).status_code == 302
    secrets = {
        "ALICE": ApiToken.issue(alice, "curl", Scope.DECIDE)[1],
        "RITA": ApiToken.issue(rita, "curl", Scope.DECIDE)[1],
    }
    script = with_tokens(api_block(), secrets).replace(ADDRESS, live_site.url)
    assert "agt_..." not in script and ADDRESS not in script

    done = subprocess.run(
        ["bash", "-c", PROLOGUE + script], capture_output=True, text=True, timeout=120
    )

    assert done.returncode == 0, done.stdout + done.stderr
    answers: list[tuple[int, str, str]] = [
        (int(status), method, url)
        for status, method, url in re.findall(r"^HTTP (\d{3}) (\w+) (\S+)$", done.stderr, re.M)
    ]
    refused = [answer for answer in answers if answer[0] >= 400]
    # The one refusal the README announces: the second decision, on a decided request.
    [(status, method, url)] = refused
    assert (status, method) == (409, "POST") and url.endswith("/decide"), answers
    assert "Already approved by rita at " in done.stdout
    assert '"status": "waiting"' in done.stdout
    # Every curl of the block was answered (the wait for the pause may ask more than once).
    assert len(answers) >= 13, answers

    request = ApprovalRequest.objects.get()
    assert request.status == ApprovalStatus.APPROVED and request.decided_by == rita
    [decision] = ApprovalDecision.objects.all()
    assert decision.approved and decision.reviewer == rita
    run = wait_for(AgentRun.objects.get(), RunStatus.COMPLETED)
    assert run.requested_by == alice
    assert Order.objects.get(number=42).status == Order.Status.CANCELLED


def test_the_readme_s_api_examples_use_no_fixed_id() -> None:
    """Ids are read from the answers before: a fresh demo has none the README could know."""
    block = api_block()
    assert not re.search(r"/(?:requests|runs)/\d", block), block
    assert not re.search(r"/conversations/conv_", block), block
