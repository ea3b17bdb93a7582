from django.urls import path

from webapp.console import metrics_views, views

app_name = "console"
urlpatterns = [
    path("workers/", views.workers_page, name="workers"),
    path("workers.json", views.workers_json, name="workers-json"),
    path("metrics.json", metrics_views.metrics_json, name="metrics-json"),
    path("usage/", views.usage_page, name="usage"),
    path("usage.csv", views.usage_csv, name="usage-csv"),
]

# The models page (webapp/console/model_views.py).
from webapp.console import model_views  # noqa: E402

urlpatterns += [
    path("models/", model_views.models_page, name="models"),
    path("models.json", model_views.models_json, name="models-json"),
    path("models/versions/<int:version_id>/<slug:action>/", model_views.version_action,
         name="version-action"),
]

# The keys page (webapp/console/keys_views.py).
from webapp.console import keys_views  # noqa: E402

urlpatterns += [
    path("keys/", keys_views.keys_page, name="keys"),
    path("keys/<int:key_id>/revoke/", keys_views.key_revoke, name="key-revoke"),
    path("keys/<int:key_id>/limits/", keys_views.key_limits, name="key-limits"),
]
