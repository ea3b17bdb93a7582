"""Every response carries the strict CSP and the other security headers, static files included,
and no template needs an exception from it (no inline script, style or event handler)."""

import re
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from webapp.keys.services import apikey_create

pytestmark = pytest.mark.django_db

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; "
       "connect-src 'self' ws://testserver wss://testserver; object-src 'none'; base-uri 'none'; "
       "form-action 'self'; frame-ancestors 'none'")


def directives(response) -> dict[str, str]:
    return dict(part.strip().split(" ", 1) for part in response["Content-Security-Policy"].split(";"))


def assert_secure_headers(response):
    assert response["Content-Security-Policy"] == CSP
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"


@pytest.fixture
def staff_client(client):
    client.force_login(get_user_model().objects.create_user("root", is_staff=True))
    return client


def test_the_policy_refuses_remote_images_inline_script_plugins_and_framing(client):
    policy = directives(client.get("/accounts/login/"))

    assert policy["img-src"] == "'self' data:"
    assert policy["script-src"] == "'self'" and policy["style-src"] == "'self'"
    assert policy["object-src"] == policy["base-uri"] == policy["frame-ancestors"] == "'none'"


def test_login_and_chat_pages_carry_the_policy_and_refuse_framing(client):
    login = client.get("/accounts/login/")
    assert login.status_code == 200
    assert_secure_headers(login)
    assert login["X-Frame-Options"] == "DENY"

    client.force_login(get_user_model().objects.create_user("alice"))
    chat = client.get("/")
    assert chat.status_code == 200 and b'id="composer"' in chat.content
    assert_secure_headers(chat)
    assert chat["X-Frame-Options"] == "DENY"


@pytest.mark.parametrize("url", ["/console/workers/", "/console/usage/", "/console/models/", "/console/keys/",
                                 "/admin/"])
def test_console_and_admin_pages_carry_the_policy(staff_client, url):
    response = staff_client.get(url)
    assert response.status_code == 200
    assert_secure_headers(response)
    assert response["X-Frame-Options"] == "DENY"


def test_api_and_probe_responses_carry_the_policy(client):
    raw = apikey_create(owner=get_user_model().objects.create_user("bob"), name="k")[1]
    for response in (client.get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {raw}"), client.get("/v1/models"),
                     client.get("/healthz")):
        assert response["Content-Type"].startswith("application/json")
        assert_secure_headers(response)


def test_static_files_are_served_with_debug_off_and_nosniff(client, settings):
    assert settings.DEBUG is False
    for url, kind in (("/static/chat/chat.js", "text/javascript"), ("/static/admin/css/base.css", "text/css")):
        response = client.get(url)
        assert response.status_code == 200 and response["Content-Type"].startswith(kind)
        assert_secure_headers(response)
    assert client.get("/static/no-such-file.js").status_code == 404


def test_templates_have_no_inline_script_style_or_event_handlers():
    for template in TEMPLATES.rglob("*.html"):
        text = template.read_text()
        inline_scripts = [tag for tag in re.findall(r"<script\b[^>]*>", text) if "src=" not in tag]
        assert inline_scripts == [], template
        assert not re.search(r"\son[a-z]+\s*=", text), template
        assert not re.search(r"<style\b|\sstyle\s*=", text), template
        assert "javascript:" not in text, template


@pytest.mark.asyncio
async def test_static_files_are_served_on_the_async_path_too(async_client):
    response = await async_client.get("/static/chat/chat.js")
    assert response.status_code == 200 and b"WebSocket" in response.content
    assert response["Content-Length"] == str(len(response.content))
    assert_secure_headers(response)
    assert (await async_client.get("/static/chat/chat.js", headers={"If-None-Match": response["ETag"]})).status_code == 304


def test_every_middleware_is_async_capable_so_asgi_requests_never_queue_on_the_sync_thread(settings):
    from django.utils.module_loading import import_string

    sync_only = [path for path in settings.MIDDLEWARE if not getattr(import_string(path), "async_capable", False)]
    assert sync_only == []
