from django.contrib import admin

from webapp.audit.admin_mixin import AuditedAdmin
from webapp.sharing.models import SharedConversation, SharingSettings


@admin.register(SharingSettings)
class SharingSettingsAdmin(AuditedAdmin, admin.ModelAdmin):
    """One row (pk 1), the one selectors read; also editable at /shared/settings."""

    list_display = ("__str__", "allow_anonymous", "updated_at")

    def has_add_permission(self, request) -> bool:
        return not SharingSettings.objects.exists() and super().has_add_permission(request)

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def save_model(self, request, obj, form, change):
        obj.pk = 1  # the row the site reads, whatever the admin's add form would have numbered it
        super().save_model(request, obj, form, change)


@admin.register(SharedConversation)
class SharedConversationAdmin(admin.ModelAdmin):
    list_display = ("title", "owner", "created_at", "revoked_at")
    readonly_fields = ("token", "owner", "conversation", "title", "messages", "created_at")
    list_filter = ("revoked_at",)
