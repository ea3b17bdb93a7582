from django.urls import path

from webapp.console import views

app_name = "console"
urlpatterns = [
    path("workers/", views.workers_page, name="workers"),
    path("workers.json", views.workers_json, name="workers-json"),
    path("usage/", views.usage_page, name="usage"),
    path("usage.csv", views.usage_csv, name="usage-csv"),
]
