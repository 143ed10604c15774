"""The live test server's URLs: the site's, and one the test process calls between tests.

Only `tests/settings.py` names this module, for a server `tests/live.py` started
(`AGENTSITE_LIVE_TEST_SERVER`); the site itself never serves it.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, HttpResponse
from django.urls import path

from agentsite.urls import urlpatterns as site_urlpatterns
from tracing import exporter


@login_not_required
def flush_traces(request: HttpRequest) -> HttpResponse:
    """Store the traces this server's processor holds, now: a test's runs are written while
    its database is still its own, not a moment later into the next test's (the processor
    exports every second)."""
    processor = exporter.installed()
    if processor is not None:
        processor.force_flush()
    return HttpResponse(status=204)


urlpatterns = [*site_urlpatterns, path("__tests__/flush-traces/", flush_traces)]
