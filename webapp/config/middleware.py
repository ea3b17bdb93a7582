"""Django's stock middleware, run on the event loop under ASGI.

Under ASGI, Django's ``MiddlewareMixin`` runs each ``process_request``, ``process_view`` and
``process_response`` through ``sync_to_async``: a hop to the request's thread and back for each.
That made 14 hops for a request through this project's chain, before and after its view. Each
hop waits for the thread and then for the event loop, which also carries every stream in flight.
Under a flood of 200 streams, another user's request took 12-326 ms to reach its view (5 ms idle).

None of these methods does I/O in the common case. Each class here runs its methods inline on the
loop. It hops to the thread only where the stock method would reach the database or read a
request body:
- a session that must be saved;
- messages that were read or added (their session storage);
- a CSRF check that reads a form body (a POST to a view that is not exempt).

Settings keep naming Django's classes by their dotted paths: its deploy checks (``check --deploy``:
HSTS, the HTTPS redirect, X-Frame-Options, CSRF) look for those exact strings and stay silent
about the rest when they are missing. The ASGI handler here, ``ASGIHandler``, loads each one's
subclass from ``ON_THE_LOOP`` in its place. The sync path (WSGI, the test client) runs the stock
classes, which make no hop there. The project's own middleware is written to run on the loop
(webapp/config/security.py's policy header, webapp/config/static_files.py, webapp/audit/context.py).
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware as _Authentication
from django.contrib.messages.middleware import MessageMiddleware as _Message
from django.contrib.sessions.middleware import SessionMiddleware as _Session
from django.core.handlers.asgi import ASGIHandler as _ASGIHandler
from django.middleware.clickjacking import XFrameOptionsMiddleware as _XFrameOptions
from django.middleware.common import CommonMiddleware as _Common
from django.middleware.csrf import CsrfViewMiddleware as _Csrf
from django.middleware.security import SecurityMiddleware as _Security

from webapp.config.on_the_loop import OnTheLoop, run_hook

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


class SecurityMiddleware(OnTheLoop, _Security):
    """Headers and the HTTPS redirect: no I/O."""


class CommonMiddleware(OnTheLoop, _Common):
    """User agents, the slash redirect (a URL resolution), Content-Length: no I/O."""


class XFrameOptionsMiddleware(OnTheLoop, _XFrameOptions):
    """A header: no I/O."""


class AuthenticationMiddleware(OnTheLoop, _Authentication):
    """``request.user`` is lazy: the session and the user are read where the view reads them."""


class SessionMiddleware(OnTheLoop, _Session):
    """A lazy session store in; saved in the request's thread only when it must be."""

    def response_in_thread(self, request, response) -> bool:
        session = getattr(request, "session", None)
        if session is None:
            return False
        # The stock method saves (database) exactly when modified or saving every request, and
        # not empty; is_empty() reads only what is loaded already.
        return (session.modified or settings.SESSION_SAVE_EVERY_REQUEST) and not session.is_empty()


class MessageMiddleware(OnTheLoop, _Message):
    """A lazy storage in; stored in the request's thread when messages were read or added (the
    fallback storage may reach the session)."""

    def response_in_thread(self, request, response) -> bool:
        storage = getattr(request, "_messages", None)
        return storage is not None and (storage.used or storage.added_new)


class CsrfViewMiddleware(OnTheLoop, _Csrf):
    """The token cookie in and out on the loop (CSRF_USE_SESSIONS would read the session: then in
    the thread). The view check reads ``request.POST`` for unsafe methods, a form body that may be
    a large upload: in the thread unless the view is exempt or the method safe."""

    def __init__(self, get_response):
        super().__init__(get_response)
        if self.async_mode:  # the handler awaits a coroutine function as it is, no hop
            self.process_view = self._process_view_on_loop

    def request_in_thread(self, request) -> bool:
        return settings.CSRF_USE_SESSIONS

    def response_in_thread(self, request, response) -> bool:
        return settings.CSRF_USE_SESSIONS

    async def _process_view_on_loop(self, request, callback, callback_args, callback_kwargs):
        in_thread = not (request.method in SAFE_METHODS or getattr(callback, "csrf_exempt", False)
                         or getattr(request, "csrf_processing_done", False))
        return await run_hook(super().process_view, in_thread or settings.CSRF_USE_SESSIONS,
                          request, callback, callback_args, callback_kwargs)


ON_THE_LOOP = {
    "django.middleware.security.SecurityMiddleware": f"{__name__}.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware": f"{__name__}.SessionMiddleware",
    "django.middleware.common.CommonMiddleware": f"{__name__}.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware": f"{__name__}.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware": f"{__name__}.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware": f"{__name__}.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware": f"{__name__}.XFrameOptionsMiddleware",
}


class ASGIHandler(_ASGIHandler):
    """Django's ASGI handler with ``settings.MIDDLEWARE``'s stock classes replaced by their
    subclasses above as the chain is built (once, when the ASGI module is imported)."""

    def load_middleware(self, is_async=False):
        named = settings.MIDDLEWARE
        settings.MIDDLEWARE = [ON_THE_LOOP.get(path, path) for path in named]
        try:
            super().load_middleware(is_async=is_async)
        finally:
            settings.MIDDLEWARE = named
