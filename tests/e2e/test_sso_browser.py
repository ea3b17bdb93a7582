"""Single sign-on end to end: a real OpenID Connect provider (tests/oidc_provider: django-oauth-
toolkit in its own process, with its own SQLite database and an RSA key made here) and a real
Pagoda behind Daphne configured for it through the PAGODA_OIDC_* environment, as a deployment is.

In headless Chromium a person opens Pagoda's login page (screenshotted into
test-artifacts/sso-login.png), presses "Sign in with Test IdP", logs in on the provider's page,
and lands back on Pagoda's chat page signed in as a new user, a member of the team whose group
rule matches their provider group; their account page names the team. A second sign-in keeps
the same user. Then the provider is stopped: the callback answers the login page saying the
provider could not be reached, no user is added, and the password login still works."""

from __future__ import annotations

import sqlite3
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from playwright.sync_api import expect

from tests.e2e.sites import free_port, make_site
from tests.oidc_provider.process import pagoda_env, start_provider

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

TIMEOUT_MS = 60_000
ANN = {"username": "ann", "password": "ann-provider-pw-77", "email": "ann@example.com", "groups": ["ml-team", "staff"]}
LOCAL_PASSWORD = "local-admin-pw-3141"
SETUP = f"""
from django.contrib.auth import get_user_model
from webapp.accounts.models import SsoGroupRule
from webapp.orgs.models import Organisation, Team
acme = Organisation.objects.create(name="acme")
ml, ops = Team.objects.create(organisation=acme, name="ml"), Team.objects.create(organisation=acme, name="ops")
SsoGroupRule.objects.create(group="ml-team", team=ml, role="admin")
SsoGroupRule.objects.create(group="ops", team=ops, role="member")
get_user_model().objects.create_user("local-admin", password={LOCAL_PASSWORD!r})
"""


@pytest.fixture(scope="module")
def sso_site(tmp_path_factory):
    """Pagoda (no model: signing in needs none) and the provider, each on a free loopback port."""
    root = tmp_path_factory.mktemp("sso_site")
    provider_port = free_port()
    site = make_site(root / "pagoda", pagoda_env(f"http://127.0.0.1:{provider_port}/o"))
    site.manage("shell", "-c", SETUP)
    site.provider = start_provider(root / "provider", port=provider_port,
                                   redirect_uri=f"{site.url}/sso/callback/", users=[ANN])
    try:
        site.start_daphne()
        site.wait_until(lambda: httpx.get(f"{site.url}/healthz", timeout=5).status_code == 200, "Daphne answering")
        yield site
    finally:
        site.stop()
        site.provider.stop()


def rows(site, query: str) -> list[tuple]:
    with sqlite3.connect(site.db_path) as db:
        return db.execute(query).fetchall()


MEMBERSHIPS = ("SELECT u.username, t.name, m.role FROM orgs_membership m JOIN auth_user u ON u.id = m.user_id "
               "JOIN orgs_team t ON t.id = m.team_id ORDER BY t.name")


def test_a_person_signs_in_through_the_provider_and_gets_the_team_of_their_group(browser, sso_site, artifacts_dir):
    context = browser.new_context(viewport={"width": 1100, "height": 760})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(f"{sso_site.url}/accounts/login/")
        button = page.locator("#sso-login")
        expect(button).to_have_text("Sign in with Test IdP")
        expect(page.locator("#id_password")).to_be_visible()  # local login stays on beside it
        page.screenshot(path=str(artifacts_dir / "sso-login.png"), full_page=True)

        button.click()
        page.wait_for_url(f"{sso_site.provider.url.rsplit('/o', 1)[0]}/accounts/login/**")
        page.fill("#provider-username", ANN["username"])
        page.fill("#provider-password", ANN["password"])
        page.click("#provider-submit")

        page.wait_for_url(f"{sso_site.url}/")  # Pagoda's chat page, signed in
        expect(page.locator("#composer")).to_be_visible()
        page.goto(f"{sso_site.url}/account/")
        expect(page.locator("p.lead")).to_contain_text("acme / ml (admin)")
        page.screenshot(path=str(artifacts_dir / "sso-account.png"), full_page=True)

        # Signing in again (the provider remembers the person) finds the same user.
        context.clear_cookies(name="sessionid")
        page.goto(f"{sso_site.url}/sso/start/?next=/account/")
        page.wait_for_url(f"{sso_site.url}/account/")
    finally:
        context.close()
    assert errors == []
    assert rows(sso_site, "SELECT username, email FROM auth_user WHERE username = 'ann'") == [("ann", "ann@example.com")]
    assert rows(sso_site, MEMBERSHIPS) == [("ann", "ml", "admin")]
    assert rows(sso_site, "SELECT action, actor_name FROM audit_auditentry ORDER BY id") == [
        ("sso.user_create", "ann"), ("membership.set", "ann")]


def test_with_the_provider_down_the_login_page_says_so_and_local_login_still_works(sso_site):
    sso_site.provider.stop()
    users_before = rows(sso_site, "SELECT count(*) FROM auth_user")
    with httpx.Client(base_url=sso_site.url, timeout=30) as http:
        state = parse_qs(urlsplit(http.get("/sso/start/").headers["location"]).query)["state"][0]
        page = http.get(f"/sso/callback/?code=any&state={state}")
        assert page.status_code == 502
        assert "Test IdP could not be reached, so sign-in through it failed." in page.text
        assert rows(sso_site, "SELECT count(*) FROM auth_user") == users_before

        login = http.get("/accounts/login/")
        token = login.cookies.get("csrftoken") or http.cookies.get("csrftoken")
        signed_in = http.post("/accounts/login/", data={"username": "local-admin", "password": LOCAL_PASSWORD,
                                                        "csrfmiddlewaretoken": token, "next": "/account/"},
                              headers={"Referer": f"{sso_site.url}/accounts/login/"})
        assert signed_in.status_code == 302 and signed_in.headers["location"] == "/account/"
