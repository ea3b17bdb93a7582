"""Models and their versions in the Django admin."""

from django.contrib import admin

from webapp.audit.admin_mixin import AuditedAdmin
from webapp.registry.models import Model, ModelVersion


class ModelVersionInline(admin.TabularInline):
    model = ModelVersion
    extra = 0
    fields = ("number", "path", "format", "status", "engine_settings", "activated_at")
    readonly_fields = ("number", "format", "activated_at")


@admin.register(Model)
class ModelAdmin(AuditedAdmin, admin.ModelAdmin):
    list_display = ("slug", "name", "created_at")
    search_fields = ("slug", "name")
    inlines = [ModelVersionInline]


@admin.register(ModelVersion)
class ModelVersionAdmin(AuditedAdmin, admin.ModelAdmin):
    list_display = ("model", "number", "format", "status", "path", "activated_at")
    list_filter = ("status", "format")
    readonly_fields = ("tokenizer_dir", "error", "step", "progress", "validation", "created_at",
                       "activated_at")
