"""The site's login page: Django's LoginView with the throttled form; 429 while locked."""

from django.contrib.auth import views as auth_views

from webapp.accounts.forms import ThrottledAuthenticationForm


class LoginView(auth_views.LoginView):
    authentication_form = ThrottledAuthenticationForm
    redirect_authenticated_user = True

    def form_invalid(self, form):
        response = super().form_invalid(form)
        if form.is_throttled:
            response.status_code = 429
        return response
