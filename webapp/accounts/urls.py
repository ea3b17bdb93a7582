"""Single sign-on's two routes: off to the provider, and back from it."""

from django.urls import path

from webapp.accounts.sso import SsoCallbackView, SsoStartView

app_name = "sso"
urlpatterns = [
    path("start/", SsoStartView.as_view(), name="start"),
    path("callback/", SsoCallbackView.as_view(), name="callback"),
]
