"""One audit entry per change: who, when, from where, what, and the values before and after.

Append-only for everyone, staff included: saving an existing entry, deleting one and bulk
updates or deletes raise AuditImmutable here; the database refuses them too (triggers made by the
migration: UPDATE and DELETE on PostgreSQL, UPDATE on SQLite, whose test flush must empty the
table with DELETE). Nothing links to an entry and an entry links to nothing (ids and names are
copied in), so deleting a user, a key or a team never touches the log.
"""

from django.db import models
from django.utils import timezone


class AuditImmutable(Exception):
    """An attempt to change or delete an audit entry."""


class AuditQuerySet(models.QuerySet):
    def update(self, **kwargs):
        raise AuditImmutable("audit entries are append-only: they cannot be updated")

    def delete(self):
        raise AuditImmutable("audit entries are append-only: they cannot be deleted")

    def bulk_update(self, objs, fields, batch_size=None):
        raise AuditImmutable("audit entries are append-only: they cannot be updated")


class AuditEntry(models.Model):
    class Source(models.TextChoices):
        CONSOLE = "console"  # a page of Pagoda's (the staff console, a member's or team admin's page)
        ADMIN = "admin"  # Django's /admin/
        COMMAND = "command"  # a management command
        API = "api"
        CODE = "code"  # anything else (a shell, a test)

    at = models.DateTimeField(default=timezone.now, db_index=True)
    actor_id = models.BigIntegerField(null=True, blank=True, db_index=True)  # the user's id, no link
    actor_name = models.CharField(max_length=150, blank=True)  # as they were called then
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.CODE)
    ip = models.GenericIPAddressField(null=True, blank=True)
    action = models.CharField(max_length=64, db_index=True)  # "apikey.create", "price.set", "denied"...
    target_type = models.CharField(max_length=64, blank=True, db_index=True)  # "apikey", "team"...
    target_id = models.CharField(max_length=64, blank=True)
    target_repr = models.CharField(max_length=300, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    detail = models.TextField(blank=True)  # a refusal's reason, a command line

    objects = AuditQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_name or '-'} {self.action} {self.target_repr}"

    def save(self, *args, **kwargs):
        if self.pk is not None or not self._state.adding:
            raise AuditImmutable("audit entries are append-only: an existing one cannot be saved again")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AuditImmutable("audit entries are append-only: they cannot be deleted")
