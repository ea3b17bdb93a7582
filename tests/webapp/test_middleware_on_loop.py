"""Django's middleware under ASGI runs on the event loop (webapp/config/middleware.py).

The stock ``MiddlewareMixin`` moves each hook to the request's thread and back (``sync_to_async``).
These tests count the hops a request makes through the chain, with the stock chain as the
control, and check that what blocks still runs in the thread: the session saved at login, the
CSRF check of a form, and messages stored."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import SyncToAsync, sync_to_async
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.messages.storage.cookie import CookieStorage
from django.http import HttpResponse
from django.test import AsyncClient, override_settings
from django.test.client import AsyncRequestFactory

from webapp.config import middleware

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

STOCK = [
    "django.middleware.security.SecurityMiddleware",
    "webapp.config.security.ContentSecurityPolicyMiddleware",
    "webapp.config.static_files.StaticFilesMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "webapp.audit.context.AuditContextMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]


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


async def test_an_api_request_crosses_the_chain_without_a_thread_hop(hops):
    response = await AsyncClient().get("/v1/models", headers={"Authorization": "Bearer sk-not-a-key"})
    assert response.status_code == 401  # through every middleware and the view
    assert middleware_hops(hops) == []
    assert response["X-Frame-Options"] == "DENY" and "Content-Security-Policy" in response


async def test_the_stock_chain_hops_for_every_hook(hops):
    """The control: the same request through Django's own classes."""
    with override_settings(MIDDLEWARE=STOCK):
        response = await AsyncClient().get("/v1/models", headers={"Authorization": "Bearer sk-not-a-key"})
    assert response.status_code == 401
    assert len(middleware_hops(hops)) >= 10, hops


async def test_a_page_render_makes_no_middleware_hop(hops):
    response = await AsyncClient().get("/accounts/login/")
    assert response.status_code == 200
    assert middleware_hops(hops) == []
    assert "csrftoken" in response.cookies  # set on the loop, CSRF_USE_SESSIONS being off


async def test_login_saves_the_session_in_the_thread_and_the_next_request_is_the_user(hops):
    await sync_to_async(get_user_model().objects.create_user)("alice", password="pw-alice-123")
    client = AsyncClient(enforce_csrf_checks=True)
    page = await client.get("/accounts/login/")
    token = page.cookies["csrftoken"].value
    refused = await client.post("/accounts/login/", {"username": "alice", "password": "pw-alice-123"})
    assert refused.status_code == 403  # no token: the check ran (in the thread: a form body)

    hops.clear()
    login = await client.post("/accounts/login/", {"username": "alice", "password": "pw-alice-123",
                                                    "csrfmiddlewaretoken": token})
    assert login.status_code == 302, login.content[:300]
    assert {"django.middleware.csrf.CsrfViewMiddleware.process_view",
            "django.contrib.sessions.middleware.SessionMiddleware.process_response"} <= set(middleware_hops(hops))
    assert "sessionid" in login.cookies

    chat = await client.get("/")
    assert chat.status_code == 200 and b'id="composer"' in chat.content  # logged in: the session was saved


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


async def test_two_users_in_parallel_each_get_their_own_page():
    users = get_user_model().objects
    clients = {}
    for name in ("bob", "carol"):
        await sync_to_async(users.create_user)(name, password=f"pw-{name}-123")
        clients[name] = AsyncClient()
        assert await clients[name].alogin(username=name, password=f"pw-{name}-123")
    pages = await asyncio.gather(*(client.get("/") for client in clients.values()))
    for name, page in zip(clients, pages):
        assert page.status_code == 200
        assert name.encode() in page.content and (b"carol" if name == "bob" else b"bob") not in page.content
