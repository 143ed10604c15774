"""The test run's environment, applied before the one real settings module is read.

pytest-django imports settings before any conftest runs, so this is where a test run gets a
throwaway key and loses any model credentials the developer's shell holds.
"""

import os

os.environ.setdefault("SECRET_KEY", "tests-only-secret-key")
os.environ["DEBUG"] = "0"
for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "AGENTSITE_SESSION_ENCRYPTION_KEY"):
    os.environ.pop(name, None)

from agentsite.settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
