"""python manage.py register_model SLUG PATH [--engine-settings JSON] [--name NAME] [--no-activate]

Registers a .gguf file or a Hugging Face directory already on this machine as a version of
SLUG (created when new), exports its tokenizer and, unless --no-activate, activates it.
"""

import json

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError

from webapp.audit.commands import AuditedCommand
from webapp.registry.services import model_register


class Command(AuditedCommand):
    help = "Register (and activate) a model checkpoint on this machine under a slug."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("path")
        parser.add_argument("--engine-settings", default="{}",
                            help='EngineConfig settings as JSON, e.g. {"max_model_len": 2048}')
        parser.add_argument("--name", default="")
        parser.add_argument("--no-activate", action="store_true")

    def handle(self, *args, slug, path, engine_settings, name, no_activate, **options):
        try:
            settings = json.loads(engine_settings)
        except json.JSONDecodeError as exc:
            raise CommandError(f"--engine-settings is not JSON: {exc}") from exc
        try:
            version = model_register(slug=slug, path=path, engine_settings=settings, name=name,
                                     activate=not no_activate)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        self.stdout.write(f"{version} {version.status}: {version.path}")
