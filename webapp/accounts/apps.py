"""The accounts app: hands the admin site the throttled login form once apps are loaded."""

from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "webapp.accounts"

    def ready(self) -> None:
        from django.contrib import admin

        from webapp.accounts.forms import ThrottledAdminAuthenticationForm

        admin.site.login_form = ThrottledAdminAuthenticationForm  # /admin/login/ is throttled as the site's is
