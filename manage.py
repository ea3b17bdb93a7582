#!/usr/bin/env python
"""Django's command-line utility for Pagoda.

Without DJANGO_SETTINGS_MODULE, ``runserver`` gets the development settings (DEBUG on) and
every other command the self-hosting ones that ``make run`` serves with (DEBUG off, generated
secret key): nothing but the development server ever falls back to DEBUG or a public key.
"""

import os
import sys

DEVELOPMENT_COMMANDS = ("runserver",)


def default_settings(argv: list[str]) -> str:
    command = argv[1] if len(argv) > 1 else ""
    return "webapp.config.settings.local" if command in DEVELOPMENT_COMMANDS else "webapp.config.settings.serve"


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", default_settings(sys.argv))
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
