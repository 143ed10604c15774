#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import importlib
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentsite.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    # The settings are read from the environment, and refuse one they cannot run on (no
    # SECRET_KEY with DEBUG off, a switch that is neither on nor off). Read them here first,
    # so that such a refusal is its one line, not the end of a traceback through Django.
    try:
        importlib.import_module(os.environ["DJANGO_SETTINGS_MODULE"])
    except ImproperlyConfigured as error:
        sys.exit(f"manage.py: {error}")
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
