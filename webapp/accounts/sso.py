"""Single sign-on with OpenID Connect: mozilla-django-oidc's code flow (with PKCE and a nonce),
narrowed to what Pagoda trusts.

- ``SsoBackend`` checks the id token's audience (and issuer, when PAGODA_OIDC_ISSUER is set),
  which the library leaves unchecked, and that userinfo speaks of the id token's subject; then
  webapp.accounts.services.sso_user_sync finds or creates the user and applies the group rules
  in one transaction.
- ``SsoStartView`` and ``SsoCallbackView`` are 404s while single sign-on is off. A provider that
  cannot be reached or answers garbage, or refuses, gives the login page with a message saying
  so (502 or 403), never a 500; since nothing is written before the provider's answers are all
  read and checked, and then in one transaction, a failed sign-in leaves nothing behind.
"""

from __future__ import annotations

import logging

import jwt
import requests
from django.conf import settings
from django.core.exceptions import SuspiciousOperation
from django.http import Http404
from django.views.generic import View
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from webapp.accounts.services import SsoRefused, sso_user_sync
from webapp.accounts.views import LoginView

log = logging.getLogger(__name__)


class SsoBackend(OIDCAuthenticationBackend):
    def authenticate(self, request, **kwargs):
        if "nonce" not in kwargs:  # only SsoCallbackView signs in through the provider (not a password form)
            return None
        return super().authenticate(request, **kwargs)

    def verify_token(self, token, **kwargs):
        if not isinstance(token, str):
            raise SuspiciousOperation(f"the provider sent no id token: {token!r:.80}")
        payload = super().verify_token(token, **kwargs)
        audience = payload.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if self.OIDC_RP_CLIENT_ID not in audiences:
            raise SuspiciousOperation(f"the id token is for {audience!r}, not for this client")
        issuer = settings.PAGODA_OIDC_ISSUER
        if not isinstance(payload.get("iss"), str) or (issuer and payload["iss"] != issuer):
            raise SuspiciousOperation(f"the id token's issuer {payload.get('iss')!r} is not {issuer or 'a string'}")
        return payload

    def get_or_create_user(self, access_token, id_token, payload):
        claims = self.get_userinfo(access_token, id_token, payload)
        if not isinstance(claims, dict) or claims.get("sub") != payload.get("sub"):
            raise ValueError("the provider's userinfo is not about the id token's subject")  # not caught by the library
        return sso_user_sync(issuer=payload["iss"], claims=claims, groups_claim=settings.PAGODA_OIDC_GROUPS_CLAIM,
                             username_claim=settings.PAGODA_OIDC_USERNAME_CLAIM,
                             create_users=settings.OIDC_CREATE_USER, ip=self.request.META.get("REMOTE_ADDR"))


class SsoOnlyMixin:
    def __init__(self, **kwargs):
        View.__init__(self, **kwargs)  # not the library's: it reads settings that are unset while SSO is off
        self.OIDC_OP_AUTH_ENDPOINT = getattr(settings, "OIDC_OP_AUTHORIZATION_ENDPOINT", "")
        self.OIDC_RP_CLIENT_ID = getattr(settings, "OIDC_RP_CLIENT_ID", "")

    def dispatch(self, request, *args, **kwargs):
        if not settings.PAGODA_SSO_ENABLED:
            raise Http404("single sign-on is not configured")
        return super().dispatch(request, *args, **kwargs)


class SsoStartView(SsoOnlyMixin, OIDCAuthenticationRequestView):
    """Sends the browser to the provider's authorization endpoint (``?next=`` kept for after)."""


class SsoCallbackView(SsoOnlyMixin, OIDCAuthenticationCallbackView):
    """Where the provider sends the browser back: the code is exchanged, the user signed in."""

    def get(self, request):
        provider = settings.PAGODA_OIDC_PROVIDER_NAME
        state = request.GET.get("state")
        if "code" in request.GET and state not in request.session.get("oidc_states", {}):
            return self.login_page(f"This sign-in with {provider} expired or began in another browser: "
                                   "start it again.", status=400)
        try:
            return super().get(request)
        except SsoRefused as error:
            return self.login_page(f"Sign-in with {provider} was refused: {error}.", status=403)
        except (requests.ConnectionError, requests.Timeout) as error:
            log.warning("sso: provider unreachable: %s", error)
            return self.login_page(f"{provider} could not be reached, so sign-in through it failed. "
                                   "Try again later.", status=502)
        except (requests.RequestException, ValueError, KeyError, TypeError, AttributeError, jwt.PyJWTError,
                SuspiciousOperation) as error:  # an HTTP error, non-JSON or JSON of another shape, a bad or forged token
            log.warning("sso: unusable answer from the provider: %s: %s", type(error).__name__, error, exc_info=True)
            return self.login_page(f"{provider} answered with something that is not a valid sign-in, "
                                   "so sign-in through it failed.", status=502)

    def login_failure(self):
        reason = self.request.GET.get("error_description") or self.request.GET.get("error") or ""
        detail = f" ({reason[:200]})" if reason else ""
        return self.login_page(f"Sign-in with {settings.PAGODA_OIDC_PROVIDER_NAME} did not complete{detail}.",
                               status=403)

    def login_page(self, message: str, *, status: int):
        response = LoginView.as_view(extra_context={"sso_error": message})(self.request)
        response.status_code = status
        return response
