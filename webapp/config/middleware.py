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

On the sync path (WSGI, the test client) nothing changes: ``__call__`` is ``MiddlewareMixin``'s.
The project's own middleware is written the same way (webapp/config/security.py's policy header,
webapp/config/static_files.py, webapp/audit/context.py).
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware as _Authentication
from django.contrib.messages.middleware import MessageMiddleware as _Message
from django.contrib.sessions.middleware import SessionMiddleware as _Session
from django.middleware.clickjacking import XFrameOptionsMiddleware as _XFrameOptions
from django.middleware.common import CommonMiddleware as _Common
from django.middleware.csrf import CsrfViewMiddleware as _Csrf
from django.middleware.security import SecurityMiddleware as _Security
from django.utils.deprecation import MiddlewareMixin

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


async def _run(method, in_thread: bool, *args):
    if in_thread:
        return await sync_to_async(method, thread_sensitive=True)(*args)
    return method(*args)


class OnTheLoop(MiddlewareMixin):
    """``MiddlewareMixin`` whose hooks run on the event loop unless ``request_in_thread`` or
    ``response_in_thread`` says the stock method would block (then in the request's thread, as
    Django does)."""

    def request_in_thread(self, request) -> bool:
        return False

    def response_in_thread(self, request, response) -> bool:
        return False

    async def __acall__(self, request):
        response = None
        if hasattr(self, "process_request"):
            response = await _run(self.process_request, self.request_in_thread(request), request)
        response = response or await self.get_response(request)
        if hasattr(self, "process_response"):
            response = await _run(self.process_response, self.response_in_thread(request, response),
                                  request, response)
        return response


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
        return await _run(super().process_view, in_thread or settings.CSRF_USE_SESSIONS,
                          request, callback, callback_args, callback_kwargs)
