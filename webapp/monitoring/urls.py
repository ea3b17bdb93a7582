"""Liveness, readiness and Prometheus metrics endpoints."""

from django.urls import path

from webapp.monitoring import views

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    path("metrics", views.metrics, name="metrics"),
]
