"""``AuditedCommand``: a management command whose changes are audited as source "command", by the
operating-system account that ran it, with its command line."""

from __future__ import annotations

import getpass
import shlex
import sys

from django.core.management.base import BaseCommand

from webapp.audit.context import audit_context


def _account() -> str:
    try:
        return f"os:{getpass.getuser()}"
    except (KeyError, OSError):  # no name for this uid (a container)
        return "os:?"


class AuditedCommand(BaseCommand):
    def execute(self, *args, **options):
        name = self.__module__.rsplit(".", 1)[-1]
        line = shlex.join(sys.argv[1:]) if len(sys.argv) > 1 and sys.argv[1] == name else name
        with audit_context(source="command", actor_label=_account(), detail=f"manage.py {line}"):
            return super().execute(*args, **options)
