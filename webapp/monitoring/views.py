"""Liveness (/healthz), readiness (/readyz) and Prometheus metrics (/metrics)."""

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from webapp.monitoring.checks import readiness
from webapp.monitoring.metrics import REGISTRY


@never_cache
@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    """Answers as long as the web process can serve a request."""
    return JsonResponse({"status": "ok"})


@never_cache
@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    """200 when the database, Redis (if configured) and a worker per active model are there; else 503.

    Anyone learns only "ready" or "unavailable"; which check failed is for staff, or for a probe
    sending the configured PAGODA_READYZ_TOKEN in an X-Readyz-Token header.
    """
    checks, reasons = readiness()
    body = {"status": "unavailable" if reasons else "ready"}
    if _may_see_details(request):
        body.update({"reasons": reasons, "checks": checks} if reasons else {"checks": checks})
    return JsonResponse(body, status=503 if reasons else 200)


def _may_see_details(request: HttpRequest) -> bool:
    user = getattr(request, "user", None)
    if user is not None and user.is_active and user.is_staff:
        return True
    token, sent = getattr(settings, "PAGODA_READYZ_TOKEN", ""), request.headers.get("X-Readyz-Token", "")
    return bool(token) and hmac.compare_digest(token.encode(), sent.encode("latin-1", "replace"))


@never_cache
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
