"""Staff edit the chat page's per-model defaults and the shared system prompt presets here."""

from django.contrib import admin

from webapp.audit.admin_mixin import AuditedAdmin
from webapp.chat.models import ModelChatDefaults, SystemPromptPreset


@admin.register(ModelChatDefaults)
class ModelChatDefaultsAdmin(AuditedAdmin, admin.ModelAdmin):
    list_display = ("model", "sampling", "system_prompt")


@admin.register(SystemPromptPreset)
class SystemPromptPresetAdmin(AuditedAdmin, admin.ModelAdmin):
    list_display = ("name", "user", "is_prefix_shared")
    list_filter = ("user", "is_prefix_shared")
