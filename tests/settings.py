"""The test run's environment, applied before the one real settings module is read.

pytest-django imports settings before any conftest runs, so this is where a test run gets a
throwaway key and loses any model credentials the developer's shell holds.
"""

import os
import sys
import tempfile
from pathlib import Path

# Strong enough for the check the settings make with DEBUG off (long, varied, no
# "django-insecure-" prefix), and used by tests only.
os.environ.setdefault(
    "SECRET_KEY", "tests-only-secret-key-4f9c2b7e1d8a6053-Kq7Zr2Wm9Xv4Tn8Ls1Pb6Hd3Jg0Fc5"
)
# The browser tests' daphne server runs these settings too, with DEBUG on so that it serves
# static files straight from the source tree; the test process itself runs with DEBUG off.
os.environ["DEBUG"] = "1" if os.environ.get("AGENTSITE_LIVE_TEST_SERVER") else "0"
for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "AGENTSITE_SESSION_ENCRYPTION_KEY"):
    # A live test server's environment was built by tests/live.py::start_site, without the
    # shell's credentials: a base URL there is the test's local provider, a key its canary.
    live = os.environ.get("AGENTSITE_LIVE_TEST_SERVER")
    if not (name in ("OPENAI_BASE_URL", "OPENAI_API_KEY") and live):
        os.environ.pop(name, None)

from agentsite.settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# The tests' receivers (webhooks, a collector) listen on 127.0.0.1; the tests of the refusal
# (tests/common/test_destinations.py) take it away again.
AGENTSITE_OUTBOUND_ALLOWED_HOSTS = ["127.0.0.1"]

# Tests serve static files from the source tree (the live server's finders; the test process
# serves none), never from a `collectstatic` folder: WhiteNoise would scan it at start-up,
# while the cluster's tests, on the other test process, run their release's collectstatic
# into the checkout's staticfiles/ (a file listed, then replaced: FileNotFoundError).
STATIC_ROOT = Path(tempfile.gettempdir()) / "agentsite-tests-no-static-root"

if DATABASES["default"]["ENGINE"] == "agentsite.db.sqlite":  # noqa: F405
    # A file per test process, not SQLite's shared-cache memory database: the session store
    # is used from several threads at once, and shared-cache locking skips the busy timeout.
    DATABASES["default"]["TEST"] = {  # noqa: F405
        "NAME": str(Path(tempfile.gettempdir()) / f"agentsite-test-{os.getpid()}.sqlite3")
    }

# The test process itself keeps a connection per thread, as without a pool: tests drive the
# SDK on loops of their own, whose threads end holding a connection that a pool would never
# get back. The servers and workers the tests start (no pytest in them) pool as in production,
# and tests/agentsite/db/test_pool.py holds them to a connection budget.
if "pytest" in sys.modules and "pool" in DATABASES["default"].get("OPTIONS", {}):  # noqa: F405
    del DATABASES["default"]["OPTIONS"]["pool"]  # noqa: F405
    DATABASES["default"]["CONN_MAX_AGE"] = 60  # noqa: F405

# Agents on the demo model answer at once in tests; the browser tests' server streams at a
# visible pace, so its pages really receive a reply word by word.
AGENTSITE_DEMO_STREAM_DELAY = (
    float(os.environ.get("AGENTSITE_DEMO_STREAM_DELAY", "0.02"))
    if os.environ.get("AGENTSITE_LIVE_TEST_SERVER")
    else 0.0
)

# The executor tests start a real `db_worker` (AGENTSITE_EXECUTOR=tasks) beside the in-memory
# layer: they read the database, never a page, so the shared-layer check does not apply there.
SILENCED_SYSTEM_CHECKS = ["engine.E001"]

# The test process keeps no heartbeat (its runs have no owner; tests of the heartbeat turn it
# on): the servers and workers it starts beat as configured.
if not os.environ.get("AGENTSITE_LIVE_TEST_SERVER") and not os.environ.get(
    "AGENTSITE_HEARTBEAT_SECONDS"
):
    AGENTSITE_HEARTBEAT_SECONDS = 0.0

if os.environ.get("AGENTSITE_LIVE_TEST_SERVER"):
    # The site's URLs and the hook the test process calls after each test (tests/urls.py).
    ROOT_URLCONF = "tests.urls"

if os.environ.get("AGENTSITE_LIVE_TEST_SERVER"):
    # The server outlives each test's database (tests/server_middleware.py says why).
    MIDDLEWARE = [*MIDDLEWARE, "tests.server_middleware.forget_content_types"]  # noqa: F405
