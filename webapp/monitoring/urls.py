from django.urls import path

from webapp.monitoring import views

urlpatterns = [
    path("healthz", views.healthz, name="healthz"),
]
