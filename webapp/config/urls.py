"""Top-level URL map: one include per app."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("", include("webapp.monitoring.urls")),
    path("", include("webapp.batches.urls")),  # before openai_api's v1/ catch-all
    path("", include("webapp.usage.urls")),  # GET v1/usage, before openai_api's v1/ catch-all
    path("", include("webapp.openai_api.urls")),
    path("account/", include("webapp.orgs.urls")),  # members' own keys, usage, budgets and teams
    path("admin/", admin.site.urls),
    path("sso/", include("webapp.accounts.urls")),  # single sign-on (OpenID Connect), 404s while off
    path("console/", include("webapp.console.urls")),
    path("", include("webapp.search.urls")),
    path("", include("webapp.rag.urls")),
    path("", include("webapp.sharing.urls")),
    path("", include("webapp.chat.urls")),
]
