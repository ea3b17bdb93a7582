"""API keys in the Django admin (the console's keys page is the everyday tool)."""

from django.contrib import admin

from webapp.audit.admin_mixin import AuditedAdmin
from webapp.keys.models import ApiKey


@admin.register(ApiKey)
class ApiKeyAdmin(AuditedAdmin, admin.ModelAdmin):
    list_display = ("name", "prefix", "owner", "is_revoked", "expires_at", "max_requests_per_minute",
                    "max_tokens_per_minute", "max_concurrent_requests", "token_budget", "fair_share_weight",
                    "tokens_used", "last_used_at")
    list_filter = ("is_revoked",)
    search_fields = ("name", "prefix", "owner__username")
    # Keys are created with `create_api_key` (or the console) so that the secret is shown once.
    readonly_fields = ("prefix", "key_hash", "created_at", "last_used_at", "tokens_used")

    def has_add_permission(self, request):
        return False
