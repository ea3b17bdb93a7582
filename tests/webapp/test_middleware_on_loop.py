"""Django's middleware under ASGI runs on the event loop (webapp/config/middleware.py).

The stock ``MiddlewareMixin`` moves each hook to the request's thread and back (``sync_to_async``).
These tests drive the project's ASGI handler as Daphne does (scope, receive, send), count the hops
a request makes through the chain with Django's own handler as the control, and check that what
blocks still runs in the thread: the session saved at login, the CSRF check of a form, messages
stored. Settings keep Django's dotted paths, so that ``check --deploy`` finds them."""

from __future__ import annotations

import asyncio
from http.cookies import SimpleCookie
from urllib.parse import urlencode

import pytest
from asgiref.sync import SyncToAsync, sync_to_async
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.messages.storage.cookie import CookieStorage
from django.core.handlers.asgi import ASGIHandler as StockASGIHandler
from django.http import HttpResponse
from django.test.client import AsyncRequestFactory

from webapp.config import middleware

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def hops(monkeypatch):
    """The qualified names of the functions sent to a thread by ``sync_to_async`` meanwhile."""
    seen: list[str] = []
    init = SyncToAsync.__init__

    def counting(self, func, *args, **kwargs):
        seen.append(f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}")
        init(self, func, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__init__", counting)
    return seen


def middleware_hops(seen: list[str]) -> list[str]:
    return [name for name in seen if ".process_" in name]


class Browser:
    """Requests through an ASGI application as Daphne makes them, keeping cookies."""

    def __init__(self, app):
        self.app, self.cookies = app, SimpleCookie()

    async def request(self, method: str, path: str, form: dict | None = None,
                      headers: dict | None = None) -> tuple[int, dict[str, str], bytes]:
        body = urlencode(form).encode() if form is not None else b""
        raw = [(b"host", b"testserver")]
        raw += [(name.lower().encode(), value.encode()) for name, value in (headers or {}).items()]
        if form is not None:
            raw.append((b"content-type", b"application/x-www-form-urlencoded"))
        if self.cookies:
            raw.append((b"cookie", "; ".join(f"{k}={m.value}" for k, m in self.cookies.items()).encode()))
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
                 "root_path": "", "headers": raw, "client": ("127.0.0.1", 5000), "server": ("testserver", 80)}
        sent = [{"type": "http.request", "body": body, "more_body": False}]
        messages_out, hang_up = [], asyncio.Event()  # the client stays until the response is read

        async def receive():
            if sent:
                return sent.pop(0)
            await hang_up.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            messages_out.append(message)

        await self.app(scope, receive, send)
        start = next(m for m in messages_out if m["type"] == "http.response.start")
        response_headers: dict[str, str] = {}
        for name, value in start["headers"]:
            name, value = name.decode().lower(), value.decode()
            if name == "set-cookie":
                self.cookies.load(value)
            response_headers[name] = value
        return start["status"], response_headers, b"".join(m.get("body", b"") for m in messages_out
                                                            if m["type"] == "http.response.body")


async def test_an_api_request_crosses_the_chain_without_a_thread_hop(hops):
    status, headers, _ = await Browser(middleware.ASGIHandler()).request(
        "GET", "/v1/models", headers={"Authorization": "Bearer sk-not-a-key"})
    assert status == 401  # through every middleware and the view
    assert middleware_hops(hops) == []
    assert headers["x-frame-options"] == "DENY" and "content-security-policy" in headers


async def test_djangos_own_handler_hops_for_every_hook(hops):
    """The control: the same request through Django's handler and its stock classes."""
    status, _, _ = await Browser(StockASGIHandler()).request(
        "GET", "/v1/models", headers={"Authorization": "Bearer sk-not-a-key"})
    assert status == 401
    assert len(middleware_hops(hops)) >= 10, hops


async def test_settings_keep_djangos_dotted_paths_for_its_deploy_checks():
    assert "django.middleware.security.SecurityMiddleware" in settings.MIDDLEWARE
    assert "django.middleware.csrf.CsrfViewMiddleware" in settings.MIDDLEWARE
    assert "django.middleware.clickjacking.XFrameOptionsMiddleware" in settings.MIDDLEWARE
    handler = middleware.ASGIHandler()
    assert settings.MIDDLEWARE[0] == "django.middleware.security.SecurityMiddleware"  # restored after loading
    chain, names = handler._middleware_chain, []
    while chain is not None:  # each middleware (wrapped by Django's exception handling) holds the next
        chain = getattr(chain, "__wrapped__", chain)
        names.append(f"{type(chain).__module__}.{type(chain).__name__}")
        chain = getattr(chain, "get_response", None)
    assert sorted(set(names) & set(middleware.ON_THE_LOOP.values())) == sorted(middleware.ON_THE_LOOP.values()), names


async def test_a_page_render_makes_no_middleware_hop(hops):
    browser = Browser(middleware.ASGIHandler())
    status, _, _ = await browser.request("GET", "/accounts/login/")
    assert status == 200
    assert middleware_hops(hops) == []
    assert "csrftoken" in browser.cookies  # set on the loop, CSRF_USE_SESSIONS being off


async def test_login_saves_the_session_in_the_thread_and_the_next_page_is_the_users(hops):
    await sync_to_async(get_user_model().objects.create_user)("alice", password="pw-alice-123")
    browser = Browser(middleware.ASGIHandler())
    await browser.request("GET", "/accounts/login/")
    form = {"username": "alice", "password": "pw-alice-123"}
    refused, _, _ = await browser.request("POST", "/accounts/login/", form)
    assert refused == 403  # no token: the check ran (in the thread: a form body)

    hops.clear()
    status, _, body = await browser.request(
        "POST", "/accounts/login/", {**form, "csrfmiddlewaretoken": browser.cookies["csrftoken"].value})
    assert status == 302, body[:300]
    assert {"django.middleware.csrf.CsrfViewMiddleware.process_view",
            "django.contrib.sessions.middleware.SessionMiddleware.process_response"} <= set(middleware_hops(hops))
    assert "sessionid" in browser.cookies

    status, _, page = await browser.request("GET", "/")
    assert status == 200 and b'id="composer"' in page and b"alice" in page  # the session was saved


async def test_messages_added_by_a_view_are_stored_from_the_thread(hops):
    """A view that adds a message (the knowledge views do): the storage is written in the thread."""
    async def view(request):
        await sync_to_async(messages.info)(request, "kept")
        return HttpResponse("ok")

    chain = middleware.SessionMiddleware(middleware.MessageMiddleware(view))
    assert chain.async_mode
    response = await chain(AsyncRequestFactory().get("/"))
    assert response.status_code == 200
    request = AsyncRequestFactory().get("/")
    kept = CookieStorage(request)._decode(response.cookies["messages"].value)  # the fallback's cookie
    assert [m.message for m in kept] == ["kept"]
    assert "django.contrib.messages.middleware.MessageMiddleware.process_response" in middleware_hops(hops)
