"""Single sign-on without a provider process: the settings, the login page, the group rules at
sign-in, and a provider that cannot be reached (a closed loopback port). The real provider and
Chromium: tests/e2e/test_sso_browser.py; a provider answering garbage: tests/e2e/test_sso_faults.py."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from tests.conftest import free_port
from tests.oidc_provider.process import pagoda_env, sso_on
from tests.webapp.orgs_fixtures import member, team
from webapp.accounts.models import SsoGroupRule, SsoIdentity
from webapp.accounts.services import SsoRefused, sso_user_sync
from webapp.audit.models import AuditEntry
from webapp.config.env import oidc_settings
from webapp.orgs.models import Membership

pytestmark = pytest.mark.django_db
ISSUER = "https://idp.example"
PASSWORD = "local-pw-5512"


def sign_in(claims: dict, create_users: bool = True):
    return sso_user_sync(issuer=ISSUER, claims=claims, groups_claim="groups", username_claim="preferred_username",
                         create_users=create_users)


def test_sso_settings_are_off_unset_and_refuse_half_a_configuration():
    assert oidc_settings({}) == {"PAGODA_SSO_ENABLED": False, "PAGODA_LOCAL_LOGIN": True}
    with pytest.raises(ImproperlyConfigured, match="PAGODA_OIDC_TOKEN_ENDPOINT"):
        oidc_settings({**pagoda_env(ISSUER), "PAGODA_OIDC_TOKEN_ENDPOINT": ""})
    with pytest.raises(ImproperlyConfigured, match="PAGODA_LOCAL_LOGIN=off needs single sign-on"):
        oidc_settings({"PAGODA_LOCAL_LOGIN": "off"})
    on = oidc_settings(pagoda_env(ISSUER, PAGODA_LOCAL_LOGIN="off"))
    assert on["PAGODA_SSO_ENABLED"] and not on["PAGODA_LOCAL_LOGIN"]
    assert on["OIDC_OP_TOKEN_ENDPOINT"] == f"{ISSUER}/token/" and on["OIDC_RP_SIGN_ALGO"] == "RS256"


def test_without_sso_the_login_page_has_no_button_and_the_sso_routes_are_404():
    page = Client().get("/accounts/login/")
    assert page.status_code == 200 and b"Sign in with" not in page.content and b'name="password"' in page.content
    assert Client().get("/sso/start/").status_code == 404
    assert Client().get("/sso/callback/?code=x&state=y").status_code == 404


def test_with_sso_the_login_page_offers_the_provider_and_start_goes_there_with_pkce(settings):
    sso_on(settings, ISSUER)
    page = Client().get("/accounts/login/?next=/account/")
    assert b"Sign in with Test IdP" in page.content and b'name="password"' in page.content
    assert b'href="/sso/start/?next=/account/"' in page.content

    start = Client().get("/sso/start/?next=/account/")
    target = urlsplit(start["Location"])
    query = parse_qs(target.query)
    assert start.status_code == 302 and f"{target.scheme}://{target.netloc}{target.path}" == f"{ISSUER}/authorize/"
    assert query["client_id"] == ["pagoda-test"] and query["redirect_uri"] == ["http://testserver/sso/callback/"]
    assert query["code_challenge_method"] == ["S256"] and query["nonce"] and query["state"]


def test_with_local_login_off_the_password_form_is_gone_and_a_password_is_refused(settings):
    sso_on(settings, ISSUER, PAGODA_LOCAL_LOGIN="off")
    get_user_model().objects.create_user("alice", password=PASSWORD)
    page = Client().get("/accounts/login/")
    assert b"Sign in with Test IdP" in page.content and b'name="password"' not in page.content

    client = Client()
    refused = client.post("/accounts/login/", {"username": "alice", "password": PASSWORD})
    assert b"Password login is turned off on this site: sign in with Test IdP." in refused.content
    assert "_auth_user_id" not in client.session


def test_first_sign_in_creates_the_user_and_puts_them_in_the_teams_of_their_groups():
    ml, ops, hand_made = team("ml"), team("ops"), team("research")
    SsoGroupRule.objects.create(group="ml-team", team=ml, role="member")
    SsoGroupRule.objects.create(group="ml-leads", team=ml, role="admin")
    SsoGroupRule.objects.create(group="ops", team=ops, role="member")

    ann = sign_in({"sub": "u-1", "email": "ann@example.com", "preferred_username": "ann",
                   "groups": ["ml-team", "ml-leads", "unrelated"]})

    assert (ann.username, ann.email, ann.has_usable_password()) == ("ann", "ann@example.com", False)
    assert SsoIdentity.objects.get(user=ann).subject == "u-1"
    assert {(m.team.name, m.role) for m in ann.memberships.all()} == {("ml", "admin")}  # the highest role
    actions = list(AuditEntry.objects.order_by("id").values_list("action", "actor_name"))
    assert actions == [("sso.user_create", "ann"), ("membership.set", "ann")]

    member(hand_made, "ann")  # a team without rules is managed by hand: sign-in leaves it alone
    again = sign_in({"sub": "u-1", "email": "ann@example.com", "preferred_username": "ann", "groups": ["ops"]})
    assert again == ann and get_user_model().objects.count() == 1
    assert {(m.team.name, m.role) for m in ann.memberships.all()} == {("ops", "member"), ("research", "member")}


def test_a_provider_account_never_takes_over_a_local_user_of_the_same_name():
    admin = get_user_model().objects.create_superuser("admin", email="admin@example.com", password=PASSWORD)
    newcomer = sign_in({"sub": "u-9", "email": "admin@example.com", "preferred_username": "admin"})
    assert newcomer != admin and newcomer.username == "admin-2" and not newcomer.is_staff


def test_bad_claims_or_no_creation_leave_nothing_behind():
    SsoGroupRule.objects.create(group="ml-team", team=team("ml"), role="member")
    for claims in ({"sub": "u-2", "preferred_username": "bo", "groups": {"ml-team": 1}},
                   {"sub": "", "preferred_username": "bo"}, {"preferred_username": "bo", "sub": ["u-2"]}):
        with pytest.raises(SsoRefused):
            sign_in(claims)
    with pytest.raises(SsoRefused, match="not created on sign-in"):
        sign_in({"sub": "u-2", "preferred_username": "bo"}, create_users=False)
    assert not get_user_model().objects.exists() and not Membership.objects.exists()
    assert not AuditEntry.objects.exists()


def test_a_provider_that_cannot_be_reached_gives_the_login_page_saying_so_and_local_login_works(settings):
    sso_on(settings, f"http://127.0.0.1:{free_port()}/o")  # nothing listens there
    get_user_model().objects.create_user("alice", password=PASSWORD)
    client = Client()
    state = parse_qs(urlsplit(client.get("/sso/start/")["Location"]).query)["state"][0]

    page = client.get(f"/sso/callback/?code=some-code&state={state}")

    assert page.status_code == 502
    assert b"Test IdP could not be reached, so sign-in through it failed." in page.content
    assert b'name="password"' in page.content and get_user_model().objects.count() == 1
    assert client.post("/accounts/login/", {"username": "alice", "password": PASSWORD}).status_code == 302
    assert client.session["_auth_user_id"] == str(get_user_model().objects.get(username="alice").pk)


def test_a_callback_with_a_stranger_state_or_a_provider_error_gives_the_login_page(settings):
    sso_on(settings, ISSUER)
    client = Client()
    client.get("/sso/start/")
    stale = client.get("/sso/callback/?code=c&state=not-ours")
    assert stale.status_code == 400 and b"expired or began in another browser" in stale.content
    denied = client.get("/sso/callback/?error=access_denied&error_description=The+user+said+no")
    assert denied.status_code == 403 and b"Sign-in with Test IdP did not complete (The user said no)." in denied.content
