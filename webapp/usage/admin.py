"""Usage records (read-only) and their daily roll-ups in the Django admin."""

from django.contrib import admin

from webapp.usage.models import UsageDaily, UsageRecord


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = ("created_at", "model_name", "api_key", "endpoint", "status", "prompt_tokens",
                    "completion_tokens", "time_to_first_token", "latency")
    list_filter = ("status", "endpoint", "model")
    search_fields = ("request_id", "model_name")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(UsageDaily)
class UsageDailyAdmin(admin.ModelAdmin):
    list_display = ("day", "model_slug", "api_key", "user", "requests", "errors", "prompt_tokens",
                    "completion_tokens", "cached_prompt_tokens")
    list_filter = ("day", "model_slug")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
