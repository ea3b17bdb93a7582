"""python manage.py ensure_bundled_model — register and activate the bundled SmolLM2 as `smollm2`.

Idempotent: a second run finds the same version and changes nothing. `make run` calls it.
"""

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError

from webapp.audit.commands import AuditedCommand
from webapp.registry.services import bundled_model_ensure


class Command(AuditedCommand):
    help = "Register and activate the bundled SmolLM2 model as 'smollm2' (idempotent)."

    def handle(self, *args, **options):
        try:
            version = bundled_model_ensure()
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        self.stdout.write(f"{version} {version.status}: {version.path}")
