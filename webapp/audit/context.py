"""Who is making the changes being made now, and from where: set once per request (the
middleware) or per management command (``audit_context``), read by webapp.audit.services.

A contextvar, so each request, thread and task sees its own; nothing set means source "code"
with no actor (a shell, a test calling a service directly).
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from dataclasses import dataclass

from asgiref.sync import iscoroutinefunction, markcoroutinefunction


@dataclass(frozen=True)
class AuditContext:
    source: str
    request: object | None = None  # an HttpRequest: its user is read when an entry is written
    actor: object | None = None  # a user, where there is no request
    actor_label: str = ""  # who, where no user is known: a command's operating-system account
    detail: str = ""


_current: contextvars.ContextVar[AuditContext | None] = contextvars.ContextVar("pagoda_audit", default=None)


def current() -> AuditContext | None:
    return _current.get()


@contextmanager
def audit_context(*, source: str, actor=None, actor_label: str = "", detail: str = ""):
    token = _current.set(AuditContext(source=source, actor=actor, actor_label=actor_label, detail=detail))
    try:
        yield
    finally:
        _current.reset(token)


def _source_of(path: str) -> str:
    return "admin" if path.startswith("/admin/") else "api" if path.startswith("/v1/") else "console"


class AuditContextMiddleware:
    """Names the request as the source of the changes its view makes (after AuthenticationMiddleware).

    Sync and async alike, so an ASGI request never queues on the sync thread for it: set in the
    async chain, the context var reaches a sync view through sync_to_async's copied context."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self._acall(request)
        token = _current.set(AuditContext(source=_source_of(request.path), request=request))
        try:
            return self.get_response(request)
        finally:
            _current.reset(token)

    async def _acall(self, request):
        token = _current.set(AuditContext(source=_source_of(request.path), request=request))
        try:
            return await self.get_response(request)
        finally:
            _current.reset(token)
