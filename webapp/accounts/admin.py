"""Single sign-on in the Django admin: staff set the group rules (audited); identities are shown,
and deleting one unlinks the provider account (its next sign-in creates a new user)."""

from django.contrib import admin

from webapp.accounts.models import SsoGroupRule, SsoIdentity
from webapp.audit.admin_mixin import AuditedAdmin


@admin.register(SsoGroupRule)
class SsoGroupRuleAdmin(AuditedAdmin, admin.ModelAdmin):
    list_display = ("group", "team", "role", "created_at")
    list_filter = ("role", "team")
    search_fields = ("group",)


@admin.register(SsoIdentity)
class SsoIdentityAdmin(AuditedAdmin, admin.ModelAdmin):
    list_display = ("user", "subject", "issuer", "created_at")
    search_fields = ("user__username", "subject")
    readonly_fields = ("user", "issuer", "subject", "created_at")

    def has_add_permission(self, request):
        return False
