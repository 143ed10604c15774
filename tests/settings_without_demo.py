"""The test settings less the demo app: what a deployment with its own agents looks like."""

from tests.settings import *  # noqa: F403

INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "demo"]  # noqa: F405
AGENTSITE_AGENTS = {"plain": "tests.agentsite.test_architecture.PLAIN_AGENT"}
