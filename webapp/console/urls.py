"""The staff console's pages: workers, metrics, usage, jobs, models (one URL per version operation), chat defaults and keys."""

from django.urls import path

from webapp.console import (adapter_views, audit_views, billing_views, chat_defaults_views, jobs, keys_views,
                            metrics_views, model_views, org_views, views)

app_name = "console"
urlpatterns = [
    path("workers/", views.workers_page, name="workers"),
    path("workers.json", views.workers_json, name="workers-json"),
    path("metrics.json", metrics_views.metrics_json, name="metrics-json"),
    path("usage/", views.usage_page, name="usage"),
    path("usage.csv", views.usage_csv, name="usage-csv"),
    # Validations and batches with live progress (webapp/console/jobs.py).
    path("jobs/", jobs.jobs_page, name="jobs"),
    path("jobs.json", jobs.jobs_json, name="jobs-json"),
    path("models/", model_views.models_page, name="models"),
    path("models.json", model_views.models_json, name="models-json"),
    path("models/versions/<int:version_id>/activate/", model_views.version_activate, name="version-activate"),
    path("models/versions/<int:version_id>/deactivate/", model_views.version_deactivate,
         name="version-deactivate"),
    path("models/versions/<int:version_id>/delete/", model_views.version_delete, name="version-delete"),
    path("models/versions/<int:version_id>/settings/", model_views.version_update_settings,
         name="version-update-settings"),
    path("models/versions/<int:version_id>/chat-template/", model_views.version_chat_template,
         name="version-chat-template"),
    path("models/versions/<int:version_id>/estimate.json", model_views.version_estimate,
         name="version-estimate"),
    path("models/adapters/", adapter_views.adapter_upload_view, name="adapter-upload"),
    path("models/adapters/<int:adapter_id>/toggle/", adapter_views.adapter_toggle, name="adapter-toggle"),
    path("chat-defaults/", chat_defaults_views.chat_defaults_page, name="chat-defaults"),
    path("chat-defaults/<int:model_id>/", chat_defaults_views.chat_defaults_save, name="chat-defaults-save"),
    path("keys/", keys_views.keys_page, name="keys"),
    path("keys/<int:key_id>/revoke/", keys_views.key_revoke, name="key-revoke"),
    path("keys/<int:key_id>/limits/", keys_views.key_limits, name="key-limits"),
    path("chat-limits/", keys_views.chat_limits_page, name="chat-limits"),
    path("chat-limits/<int:user_id>/", keys_views.chat_limits_save, name="chat-limits-save"),
    # Organisations, teams and members (webapp/console/org_views.py).
    path("orgs/", org_views.orgs_page, name="orgs"),
    path("orgs/add/", org_views.organisation_add, name="organisation-add"),
    path("teams/add/", org_views.team_add, name="team-add"),
    path("teams/<int:team_id>/", org_views.team_edit, name="team-edit"),
    path("teams/<int:team_id>/delete/", org_views.team_remove, name="team-delete"),
    path("teams/<int:team_id>/members/", org_views.member_set, name="member-set"),
    path("teams/<int:team_id>/members/<int:user_id>/remove/", org_views.member_remove, name="member-remove"),
    # Prices and money budgets (webapp/console/billing_views.py).
    path("prices/", billing_views.prices_page, name="prices"),
    path("prices/add/", billing_views.price_add, name="price-add"),
    path("budgets/", billing_views.budgets_page, name="budgets"),
    path("budgets/set/", billing_views.budget_add, name="budget-set"),
    path("budgets/<int:budget_id>/delete/", billing_views.budget_remove, name="budget-delete"),
    path("audit/", audit_views.audit_page, name="audit"),
    path("audit.csv", audit_views.audit_csv, name="audit-csv"),
]
