"""The production environment the README documents passes Django's deployment checks, and a
weak SECRET_KEY stops the site when DEBUG is off."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The README's "Production" paragraph, as an environment.
STRONG_KEY = "k7Vq2xR9mZ4tB8wL1nC6yH3pF0sD5gJ-aE_uW.iO!eT@rY#qU$zX%cN^vM&bK*"
PRODUCTION = {
    "DEBUG": "0",
    "SECRET_KEY": STRONG_KEY,
    "ALLOWED_HOSTS": "agents.example.com",
    "CSRF_TRUSTED_ORIGINS": "https://agents.example.com",
    "SECURE_SSL_REDIRECT": "1",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "1",
    "SECURE_HSTS_PRELOAD": "1",
    "SESSION_COOKIE_SECURE": "1",
    "CSRF_COOKIE_SECURE": "1",
    "SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https",
    # A real mail server: Django's deployment check refuses the console backend (mail.E001).
    "EMAIL_HOST": "smtp.example.com",
}
SECURITY_VARIABLES = [
    name for name in PRODUCTION if name.startswith(("SECURE_", "SESSION_", "CSRF_"))
]


def environment(**env: str) -> dict[str, str]:
    """This process's environment without the test run's settings or any security variable
    of the developer's shell, plus `env`."""
    skipped = {"DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "DJANGO_SETTINGS_MODULE", *PRODUCTION}
    environ = {key: value for key, value in os.environ.items() if key not in skipped}
    environ.update(env)
    return environ


def manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=environment(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def settings_of(**env: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import agentsite.settings as s; "
        "print(s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS, s.SECURE_HSTS_INCLUDE_SUBDOMAINS, "
        "s.SECURE_HSTS_PRELOAD, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, "
        "s.SECURE_PROXY_SSL_HEADER)"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=environment(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_documented_production_environment_passes_check_deploy() -> None:
    checked = manage("check", "--deploy", "--fail-level", "WARNING", **PRODUCTION)

    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "System check identified no issues" in checked.stdout
    assert "WARNING" not in checked.stdout + checked.stderr


def test_manage_py_says_in_one_line_what_the_settings_refuse() -> None:
    """Run without the deployment's environment (by hand, not through deploy/manage), a
    command stops on the settings' refusal, not on a traceback that ends with it."""
    checked = manage("check", "--deploy")

    assert checked.returncode == 1
    assert "Traceback" not in checked.stderr
    [said] = checked.stderr.strip().splitlines()
    assert said.startswith("manage.py: SECRET_KEY must be set when DEBUG is off. ")
    assert "deploy/manage" in said


def test_the_readme_documents_the_production_environment() -> None:
    readme = (ROOT / "README.md").read_text()
    production = readme.split("### Production", 1)[1].split("\n#", 1)[0]
    for name, value in PRODUCTION.items():
        written = "<50 or more random characters>" if name == "SECRET_KEY" else value
        assert f"\n{name}={written}\n" in production, name


def test_check_deploy_warns_without_the_secure_settings() -> None:
    """The check above passes because of the settings, not because the check says nothing."""
    env = {key: value for key, value in PRODUCTION.items() if key not in SECURITY_VARIABLES}
    checked = manage("check", "--deploy", "--fail-level", "WARNING", **env)

    assert checked.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in checked.stdout + checked.stderr, warning


def test_the_secure_settings_are_off_by_default_for_make_run() -> None:
    read = settings_of(DEBUG="1")
    assert read.returncode == 0, read.stderr
    assert read.stdout.split() == ["False", "0", "False", "False", "False", "False", "None"]


def test_it_reads_the_secure_settings_from_the_environment() -> None:
    read = settings_of(**PRODUCTION)
    assert read.returncode == 0, read.stderr
    assert read.stdout.strip() == (
        "True 31536000 True True True True ('HTTP_X_FORWARDED_PROTO', 'https')"
    )


@pytest.mark.parametrize("value", ["HTTP_X_FORWARDED_PROTO", "HTTP_X_FORWARDED_PROTO,https,x"])
def test_it_refuses_a_proxy_header_that_is_not_a_name_and_a_value(value: str) -> None:
    read = settings_of(**{**PRODUCTION, "SECURE_PROXY_SSL_HEADER": value})
    assert read.returncode != 0
    assert "ImproperlyConfigured: SECURE_PROXY_SSL_HEADER" in read.stderr


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("a-production-secret", "shorter than 50 characters"),
        ("ab" * 40, "fewer than 5 different characters"),
        ("django-insecure-" + STRONG_KEY, "starts with 'django-insecure-'"),
    ],
)
def test_it_refuses_a_weak_secret_key_when_debug_is_off(key: str, why: str) -> None:
    read = settings_of(**{**PRODUCTION, "SECRET_KEY": key})
    assert read.returncode != 0
    assert "django.core.exceptions.ImproperlyConfigured: SECRET_KEY" in read.stderr
    assert why in read.stderr
    assert key not in read.stderr  # the secret is not printed


def test_it_accepts_a_weak_secret_key_with_debug_on() -> None:
    assert settings_of(DEBUG="1", SECRET_KEY="a-production-secret").returncode == 0


def test_the_test_run_uses_a_strong_key() -> None:
    from django.conf import settings

    assert len(settings.SECRET_KEY) >= 50
    assert len(set(settings.SECRET_KEY)) >= 5
    assert not settings.SECRET_KEY.startswith("django-insecure-")
