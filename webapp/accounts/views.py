"""The site's login page: Django's LoginView with the throttled form; 429 while locked. It shows
the "Sign in with <provider>" button when single sign-on is on (webapp/accounts/sso.py), and the
password form only while local login is (PAGODA_LOCAL_LOGIN)."""

from django.conf import settings
from django.contrib.auth import views as auth_views

from webapp.accounts.forms import ThrottledAuthenticationForm


class LoginView(auth_views.LoginView):
    authentication_form = ThrottledAuthenticationForm
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), "local_login": settings.PAGODA_LOCAL_LOGIN,
                "sso_provider": settings.PAGODA_OIDC_PROVIDER_NAME if settings.PAGODA_SSO_ENABLED else None}

    def form_invalid(self, form):
        response = super().form_invalid(form)
        if form.is_throttled:
            response.status_code = 429
        return response
