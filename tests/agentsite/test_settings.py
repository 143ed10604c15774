"""Settings read from the environment: the helpers refuse what they do not understand, the
settings module imports with production's environment, and the README documents every
variable it reads."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from agentsite.settings import env_bool, env_float, env_int, env_json_list, env_mapping

ROOT = Path(__file__).resolve().parents[2]
NAME = "AGENTSITE_TEST_SETTING"
# Strong enough for DEBUG off (a weak key is refused: tests/agentsite/test_settings_deploy.py).
PRODUCTION_KEY = "a-production-secret-Xr4Tq9Lm2Vz7Kb1Nw8Hc5Jd3Pf6Gs0Ye-uA"


# --- env_bool -------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["1", "true", "True", "YES", "yes", "on", " On "])
def test_it_reads_on(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(NAME, value)
    assert env_bool(NAME, False) is True


@pytest.mark.parametrize("value", ["0", "false", "False", "NO", "no", "off", " Off "])
def test_it_reads_off(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(NAME, value)
    assert env_bool(NAME, True) is False


@pytest.mark.parametrize("default", [True, False])
def test_it_takes_the_default_for_an_empty_or_unset_switch(
    monkeypatch: pytest.MonkeyPatch, default: bool
) -> None:
    monkeypatch.delenv(NAME, raising=False)
    assert env_bool(NAME, default) is default
    monkeypatch.setenv(NAME, "  ")
    assert env_bool(NAME, default) is default


@pytest.mark.parametrize("value", ["maybe", "2", "enabled", "ture", "y"])
def test_it_refuses_a_switch_it_does_not_understand(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(NAME, value)
    with pytest.raises(ImproperlyConfigured) as caught:
        env_bool(NAME, True)
    message = str(caught.value)
    assert f"{NAME}={value!r}" in message
    for accepted in ("1/0", "true/false", "yes/no", "on/off"):
        assert accepted in message


# --- numbers --------------------------------------------------------------------------------


def test_it_reads_whole_numbers_and_takes_the_default_when_empty(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(NAME, " 42 ")
    assert env_int(NAME, 7) == 42
    monkeypatch.setenv(NAME, "-3")
    assert env_int(NAME, 7) == -3
    monkeypatch.setenv(NAME, "")
    assert env_int(NAME, 7) == 7
    monkeypatch.delenv(NAME)
    assert env_int(NAME, 7) == 7


@pytest.mark.parametrize("value", ["ten", "1.5", "60s", "1e3"])
def test_it_refuses_what_is_not_a_whole_number(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(NAME, value)
    with pytest.raises(ImproperlyConfigured, match=re.escape(f"{NAME}={value!r}")):
        env_int(NAME, 7)


def test_it_reads_numbers_and_takes_the_default_when_empty(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(NAME, "0.25")
    assert env_float(NAME, 1.0) == 0.25
    monkeypatch.setenv(NAME, "3")
    assert env_float(NAME, 1.0) == 3.0
    monkeypatch.setenv(NAME, " ")
    assert env_float(NAME, 1.0) == 1.0
    monkeypatch.delenv(NAME)
    assert env_float(NAME, 1.0) == 1.0


@pytest.mark.parametrize("value", ["fast", "0,5", "1.0s"])
def test_it_refuses_what_is_not_a_number(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(NAME, value)
    with pytest.raises(ImproperlyConfigured, match=re.escape(f"{NAME}={value!r}")):
        env_float(NAME, 1.0)


# --- lists and mappings ---------------------------------------------------------------------


def test_it_reads_a_mapping_as_pairs_or_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NAME, "support=demo.agents.support_desk, billing = demo.agents.billing")
    assert env_mapping(NAME, {}) == {
        "support": "demo.agents.support_desk",
        "billing": "demo.agents.billing",
    }
    monkeypatch.setenv(NAME, '{"support": "demo.agents.support_desk"}')
    assert env_mapping(NAME, {}) == {"support": "demo.agents.support_desk"}


@pytest.mark.parametrize("value", ["demo.agents.support_desk", "a=b,c", '{"support": '])
def test_it_refuses_a_mapping_it_does_not_understand(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(NAME, value)
    with pytest.raises(ImproperlyConfigured, match=NAME):
        env_mapping(NAME, {})


def test_it_refuses_a_list_that_is_not_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NAME, '["a", "b"')
    with pytest.raises(ImproperlyConfigured, match=f"{NAME} is not valid JSON"):
        env_json_list(NAME, [])


# --- the settings module --------------------------------------------------------------------


def import_settings(**env: str) -> subprocess.CompletedProcess[str]:
    """Import agentsite.settings in a new interpreter, in an environment that has `env` and
    none of the test run's own settings."""
    environ = {
        key: value for key, value in os.environ.items() if key not in ("DEBUG", "SECRET_KEY")
    }
    environ.pop("DJANGO_SETTINGS_MODULE", None)
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-c", "import agentsite.settings as s; print(s.DEBUG, s.SECRET_KEY)"],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_it_imports_with_debug_off_and_a_secret_key() -> None:
    imported = import_settings(DEBUG="off", SECRET_KEY=PRODUCTION_KEY)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.split() == ["False", PRODUCTION_KEY]


def test_it_refuses_to_start_on_a_debug_value_it_does_not_understand() -> None:
    imported = import_settings(DEBUG="maybe", SECRET_KEY="a-production-secret")
    assert imported.returncode != 0
    assert "django.core.exceptions.ImproperlyConfigured: DEBUG='maybe'" in imported.stderr


def test_it_refuses_to_start_without_a_secret_key_when_debug_is_off() -> None:
    imported = import_settings(DEBUG="0")
    assert imported.returncode != 0
    assert "SECRET_KEY must be set when DEBUG is off" in imported.stderr
    assert import_settings(DEBUG="1").returncode == 0  # a development key then


# --- the README -----------------------------------------------------------------------------


def variables_read() -> dict[str, object]:
    """The names agentsite/settings.py reads through its env_* helpers, each with its default
    (`...` where the default is not a constant expression)."""
    tree = ast.parse((ROOT / "agentsite" / "settings.py").read_text())
    read: dict[str, object] = {}
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id.startswith("env_")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            continue
        default: object = "" if node.func.id == "env_str" else False
        if len(node.args) > 1:
            try:  # literals and arithmetic on them, such as 24 * 3600
                default = eval(compile(ast.Expression(node.args[1]), "settings", "eval"), {})
            except NameError:
                default = ...
        read[str(node.args[0].value)] = default
    return read


def variables_documented() -> dict[str, str]:
    """The README's configuration table: variable -> its default as written."""
    section = (ROOT / "README.md").read_text().split("## Configuration", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([A-Z0-9_]+)` \| ([^|]*) \|", section, flags=re.MULTILINE)
    return {name: default.strip() for name, default in rows}


def test_it_documents_every_variable_the_settings_read() -> None:
    read = variables_read()
    documented = variables_documented()
    assert {"DEBUG", "DATABASE_CONN_MAX_AGE", "AGENTSITE_OFFLINE_MODEL"} <= set(read)
    assert set(read) - set(documented) == set()
    # PORT is the Makefile's (`make run`), not a Django setting.
    assert set(documented) - set(read) == {"PORT"}


def written(default: object) -> str:
    """How the README's table writes a default."""
    if isinstance(default, bool):
        return "on" if default else "off"
    if default in ("", [], {}):
        return "empty"
    if isinstance(default, dict):
        return "`" + ",".join(f"{name}={value}" for name, value in default.items()) + "`"
    if isinstance(default, list):
        return "`" + ",".join(default) + "`"
    return f"`{default}`"


def test_the_readme_gives_the_defaults_the_settings_use() -> None:
    documented = variables_documented()
    checked = []
    for name, default in variables_read().items():
        # SECRET_KEY's empty default is refused, or replaced by a development key with DEBUG.
        if default is ... or name == "SECRET_KEY":
            continue
        # The default comes first in its cell, perhaps followed by a note: "`0` (no expiry)".
        assert documented[name].split(" (")[0] == written(default), name
        checked.append(name)
    assert {"DEBUG", "DATABASE_CONN_MAX_AGE", "AGENTSITE_AGENTS", "ALLOWED_HOSTS"} <= set(checked)
