"""A provider answering garbage: a small HTTP server in this process plays the provider's token,
JWKS and userinfo endpoints with whatever each test sets, and Pagoda's callback (in-process,
through Django's test client) must answer its login page saying sign-in failed, create nothing,
and leave the password login working. What a real provider does: test_sso_browser.py."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from django.contrib.auth import get_user_model
from django.test import Client

from tests.oidc_provider.process import CLIENT_ID, sso_on
from tests.webapp.orgs_fixtures import team
from webapp.accounts.models import SsoGroupRule, SsoIdentity
from webapp.audit.models import AuditEntry
from webapp.orgs.models import Membership

pytestmark = [pytest.mark.e2e, pytest.mark.django_db]
PASSWORD = "local-pw-8080"


class FakeProvider(BaseHTTPRequestHandler):
    answers: dict = {}  # path -> (status, content type, body)

    def _answer(self):
        status, content_type, body = self.answers.get(urlsplit(self.path).path, (404, "text/plain", "no"))
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def provider(settings):
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeProvider)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    issuer = f"http://127.0.0.1:{server.server_address[1]}/o"
    sso_on(settings, issuer)
    FakeProvider.answers = {}
    try:
        yield issuer
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def rsa_key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def jwks(key) -> dict:
    return {"keys": [{**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key())), "kid": "k1", "alg": "RS256"}]}


def id_token(key, issuer: str, nonce: str, **claims) -> str:
    now = int(time.time())
    payload = {"iss": issuer, "aud": CLIENT_ID, "sub": "u-7", "iat": now, "exp": now + 300, "nonce": nonce, **claims}
    return jwt.encode(payload, key, algorithm="RS256", headers={"kid": "k1"})


def callback(client: Client) -> tuple[object, str]:
    """Start a sign-in, then come back with a code: the callback's answer, and the nonce sent."""
    query = parse_qs(urlsplit(client.get("/sso/start/")["Location"]).query)
    return client.get(f"/sso/callback/?code=the-code&state={query['state'][0]}"), query["nonce"][0]


def assert_login_page_and_nothing_created(response, status: int, message: str) -> None:
    assert response.status_code == status and message in response.content.decode()
    assert b'name="password"' in response.content
    assert list(get_user_model().objects.values_list("username", flat=True)) == ["alice"]
    assert not SsoIdentity.objects.exists() and not Membership.objects.exists()
    assert not AuditEntry.objects.filter(action__in=["sso.user_create", "membership.set"]).exists()
    client = Client()
    assert client.post("/accounts/login/", {"username": "alice", "password": PASSWORD}).status_code == 302


@pytest.fixture(autouse=True)
def local_user():
    get_user_model().objects.create_user("alice", password=PASSWORD)


GARBAGE = "answered with something that is not a valid sign-in"


@pytest.mark.parametrize("token_answer", [
    (200, "text/html", "<html><body>Gateway says hello</body></html>"),  # not JSON
    (500, "text/html", "Internal Server Error"),
    (200, "application/json", {"access_token": "a", "id_token": "not-a-jwt"}),
    (200, "application/json", {"access_token": "a"}),  # no id token at all
    (200, "application/json", ["a", "list"]),
])
def test_a_token_endpoint_answering_garbage_gives_the_login_page_and_creates_nothing(provider, token_answer):
    FakeProvider.answers = {"/o/token/": token_answer}
    response, _ = callback(Client())
    assert_login_page_and_nothing_created(response, 502, GARBAGE)


def test_a_forged_or_misaddressed_token_is_refused(provider, rsa_key):
    forger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    FakeProvider.answers = {"/o/.well-known/jwks.json": (200, "application/json", jwks(rsa_key))}
    client = Client()
    for token in (lambda nonce: id_token(forger, provider, nonce),  # signed by a key not in the JWKS
                  lambda nonce: id_token(rsa_key, provider, nonce, aud="another-client"),
                  lambda nonce: id_token(rsa_key, "http://evil.example/o", nonce),
                  lambda nonce: id_token(rsa_key, provider, "another-nonce"),
                  lambda nonce: id_token(rsa_key, provider, nonce, exp=int(time.time()) - 60)):
        query = parse_qs(urlsplit(client.get("/sso/start/")["Location"]).query)
        FakeProvider.answers["/o/token/"] = (200, "application/json",
                                             {"access_token": "a", "id_token": token(query["nonce"][0])})
        response = client.get(f"/sso/callback/?code=c&state={query['state'][0]}")
        assert_login_page_and_nothing_created(response, 502, GARBAGE)


def good_token_then(client: Client, issuer: str, key, userinfo: tuple):
    """A sign-in whose token is right (a rule maps ml-team to team ml), with ``userinfo`` as the
    userinfo endpoint's answer: the callback's response."""
    SsoGroupRule.objects.create(group="ml-team", team=team("ml"), role="member")
    query = parse_qs(urlsplit(client.get("/sso/start/")["Location"]).query)
    token = id_token(key, issuer, query["nonce"][0])
    FakeProvider.answers = {"/o/.well-known/jwks.json": (200, "application/json", jwks(key)),
                            "/o/token/": (200, "application/json", {"access_token": "a", "id_token": token}),
                            "/o/userinfo/": userinfo}
    return client.get(f"/sso/callback/?code=c&state={query['state'][0]}")


@pytest.mark.parametrize("userinfo, status, message", [
    ((200, "text/html", "<html>login required</html>"), 502, GARBAGE),
    ((200, "application/json", {"sub": "someone-else", "groups": ["ml-team"]}), 502, GARBAGE),
    ((200, "application/json", {"sub": "u-7", "preferred_username": "bo", "groups": 42}), 403,
     "Sign-in with Test IdP was refused: the provider&#x27;s &#x27;groups&#x27; claim is not a list"),
])
def test_garbage_userinfo_after_a_good_token_creates_nothing(provider, rsa_key, userinfo, status, message):
    response = good_token_then(Client(), provider, rsa_key, userinfo)
    assert_login_page_and_nothing_created(response, status, message)


def test_the_same_fake_provider_answering_well_signs_in(provider, rsa_key):
    """The fault tests' harness is sound: right answers sign in."""
    client = Client()
    response = good_token_then(client, provider, rsa_key, (200, "application/json",
                               {"sub": "u-7", "preferred_username": "bo", "groups": ["ml-team"]}))
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.session["_auth_user_id"] == str(get_user_model().objects.get(username="bo").pk)
    assert list(Membership.objects.values_list("user__username", "team__name")) == [("bo", "ml")]
