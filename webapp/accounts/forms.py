"""Login forms (the site's and the admin's) that refuse attempts while throttle.py holds a lock."""

from __future__ import annotations

import math

from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm

from webapp.accounts.throttle import login_failure_record, login_locked_for, login_success_record


class ThrottledLoginMixin:
    throttled_message = ("Too many failed login attempts for this account or from this address. "
                         "Try again in %(minutes)s minute(s).")

    local_login_off_message = "Password login is turned off on this site: sign in with %(provider)s."

    def clean(self):
        if not settings.PAGODA_LOCAL_LOGIN:
            raise forms.ValidationError(self.local_login_off_message, code="local_login_off",
                                        params={"provider": getattr(settings, "PAGODA_OIDC_PROVIDER_NAME", "")})
        username = self.cleaned_data.get("username") or ""
        ip = self.request.META.get("REMOTE_ADDR") if self.request is not None else None
        wait = login_locked_for(username=username, ip=ip)
        if wait > 0:
            raise forms.ValidationError(self.throttled_message, code="throttled",
                                        params={"minutes": math.ceil(wait / 60)})
        try:
            cleaned = super().clean()
        except forms.ValidationError as error:
            # Wrong credentials only: a right password refused for another reason (an inactive
            # account, a non-staff user on the admin login) is no guess.
            if username and self.cleaned_data.get("password") and self.user_cache is None:
                login_failure_record(username=username, ip=ip)
            raise
        login_success_record(username=username)
        return cleaned

    @property
    def is_throttled(self) -> bool:
        return any(e.code == "throttled" for e in self.errors.as_data().get("__all__", []))


class ThrottledAuthenticationForm(ThrottledLoginMixin, AuthenticationForm):
    pass


class ThrottledAdminAuthenticationForm(ThrottledLoginMixin, AdminAuthenticationForm):
    pass
