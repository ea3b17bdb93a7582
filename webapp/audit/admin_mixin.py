"""``AuditedAdmin``: a ModelAdmin whose adds, changes and deletes through /admin/ each leave one
audit entry with the values before and after (many-to-many included: the entry is written after
the admin has saved them). The admin's own transaction holds the change and its entry together."""

from __future__ import annotations

from webapp.audit.services import audit_record, snapshot


class AuditedAdmin:
    def save_model(self, request, obj, form, change):
        before = snapshot(type(obj).objects.get(pk=obj.pk)) if change and obj.pk is not None else None
        request._audit_before = before  # read in save_related, once the many-to-many are saved too
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        obj = form.instance
        audit_record(action=f"admin.{'change' if change else 'add'}", target=obj,
                     before=getattr(request, "_audit_before", None), after=snapshot(obj))

    def delete_model(self, request, obj):
        audit_record(action="admin.delete", target=obj, before=snapshot(obj))
        super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            audit_record(action="admin.delete", target=obj, before=snapshot(obj))
        super().delete_queryset(request, queryset)
