"""The staff console's pages: workers, metrics, usage, jobs, models (one URL per version operation), chat defaults and keys."""

from django.urls import path

from webapp.console import chat_defaults_views, jobs, keys_views, metrics_views, model_views, views

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
    path("models/versions/<int:version_id>/estimate.json", model_views.version_estimate,
         name="version-estimate"),
    path("chat-defaults/", chat_defaults_views.chat_defaults_page, name="chat-defaults"),
    path("chat-defaults/<int:model_id>/", chat_defaults_views.chat_defaults_save, name="chat-defaults-save"),
    path("keys/", keys_views.keys_page, name="keys"),
    path("keys/<int:key_id>/revoke/", keys_views.key_revoke, name="key-revoke"),
    path("keys/<int:key_id>/limits/", keys_views.key_limits, name="key-limits"),
    path("chat-limits/", keys_views.chat_limits_page, name="chat-limits"),
    path("chat-limits/<int:user_id>/", keys_views.chat_limits_save, name="chat-limits-save"),
]
