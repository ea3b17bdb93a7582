"""Organisations, teams and memberships in the Django admin (audited; the console's pages are the
everyday tool)."""

from django.contrib import admin

from webapp.audit.admin_mixin import AuditedAdmin
from webapp.orgs.models import Membership, Organisation, Team


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Organisation)
class OrganisationAdmin(AuditedAdmin, admin.ModelAdmin):
    list_display = ("name", "created_at")
    search_fields = ("name",)


@admin.register(Team)
class TeamAdmin(AuditedAdmin, admin.ModelAdmin):
    list_display = ("name", "organisation", "max_requests_per_minute", "max_tokens_per_minute",
                    "max_concurrent_requests")
    list_filter = ("organisation",)
    search_fields = ("name",)
    filter_horizontal = ("models",)


@admin.register(Membership)
class MembershipAdmin(AuditedAdmin, admin.ModelAdmin):
    list_display = ("user", "team", "role")
    list_filter = ("role", "team")
