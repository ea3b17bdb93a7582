from django.contrib import admin

from webapp.sharing.models import SharedConversation, SharingSettings


@admin.register(SharingSettings)
class SharingSettingsAdmin(admin.ModelAdmin):
    list_display = ("__str__", "allow_anonymous", "updated_at")


@admin.register(SharedConversation)
class SharedConversationAdmin(admin.ModelAdmin):
    list_display = ("title", "owner", "created_at", "revoked_at")
    readonly_fields = ("token", "owner", "conversation", "title", "messages", "created_at")
    list_filter = ("revoked_at",)
