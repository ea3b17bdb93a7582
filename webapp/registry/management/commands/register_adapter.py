"""python manage.py register_adapter BASE NAME ZIP

Uploads a zip of a PEFT LoRA adapter folder for the model BASE under NAME, as the console's
upload does: checked against BASE's active version, then served by its workers as NAME or BASE:NAME.
"""

from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.files import File
from django.core.management.base import BaseCommand, CommandError

from webapp.registry.adapters import adapter_upload


class Command(BaseCommand):
    help = "Upload a LoRA adapter (a zip of a PEFT folder) for an active model."

    def add_arguments(self, parser):
        parser.add_argument("base")
        parser.add_argument("name")
        parser.add_argument("zip")

    def handle(self, *args, base, name, zip, **options):
        try:
            with Path(zip).open("rb") as handle:
                adapter = adapter_upload(base_slug=base, name=name, uploaded_file=File(handle, name=Path(zip).name))
        except (OSError, ValidationError) as exc:
            raise CommandError("; ".join(getattr(exc, "messages", [str(exc)]))) from exc
        self.stdout.write(f"{adapter} r={adapter.rank} {','.join(adapter.target_modules)}: {adapter.path}")
