"""python manage.py create_api_key --name NAME [--models slug,...] [--user USERNAME] [--expires-in-days N]

Prints the new key alone on the last line (scripts take ``| tail -n 1``); it is not stored and
cannot be shown again. Without --user the key belongs to the service user "pagoda", created on
first use with no usable password; a named --user must already exist.
"""

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import CommandError
from django.utils import timezone

from webapp.audit.commands import AuditedCommand
from webapp.keys.services import apikey_create
from webapp.registry.models import Model

SERVICE_USERNAME = "pagoda"


class Command(AuditedCommand):
    help = "Create an API key and print it (last line of the output)."

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True)
        parser.add_argument("--models", default="", help="comma-separated model slugs; empty: every model")
        parser.add_argument("--user", default=None, help=f"owner's username (default: {SERVICE_USERNAME})")
        parser.add_argument("--expires-in-days", type=float, default=None)

    def handle(self, *args, name, models, user, expires_in_days, **options):
        owner = self._owner(user)
        slugs = [s.strip() for s in models.split(",") if s.strip()]
        found = list(Model.objects.filter(slug__in=slugs))
        missing = sorted(set(slugs) - {m.slug for m in found})
        if missing:
            raise CommandError(f"unknown model(s): {', '.join(missing)}")
        expires_at = None if expires_in_days is None else timezone.now() + timedelta(days=expires_in_days)
        try:
            api_key, raw_key = apikey_create(owner=owner, name=name, models=found, expires_at=expires_at)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        scope = ", ".join(sorted(m.slug for m in found)) or "all models"
        self.stdout.write(f"API key {api_key.name!r} ({api_key.prefix}…) for {owner.get_username()}, "
                          f"scope: {scope}. Shown once:")
        self.stdout.write(raw_key)

    @staticmethod
    def _owner(username):
        User = get_user_model()
        if username is None:
            user, created = User.objects.get_or_create(username=SERVICE_USERNAME)
            if created:
                user.set_unusable_password()
                user.save(update_fields=["password"])
            return user
        try:
            return User.objects.get(username=username)
        except User.DoesNotExist as exc:
            raise CommandError(f"no user named {username!r}") from exc
