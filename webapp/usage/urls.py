"""The usage API's path (before openai_api's v1/ catch-all)."""

from django.urls import path

from webapp.usage import api

urlpatterns = [path("v1/usage", api.usage_retrieve, name="usage-retrieve")]
