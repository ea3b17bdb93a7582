"""Audit entries in the Django admin: to read only (no one adds, changes or deletes one)."""

from django.contrib import admin

from webapp.audit.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    list_display = ("at", "actor_name", "source", "ip", "action", "target_type", "target_repr")
    list_filter = ("source", "action", "target_type")
    search_fields = ("actor_name", "action", "target_repr")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
