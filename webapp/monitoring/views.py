"""Liveness (/healthz), readiness (/readyz) and Prometheus metrics (/metrics)."""

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
    """200 when the database, Redis (if configured) and a worker per active model are there; else 503."""
    checks, reasons = readiness()
    if reasons:
        return JsonResponse({"status": "unavailable", "reasons": reasons, "checks": checks}, status=503)
    return JsonResponse({"status": "ready", "checks": checks})


@never_cache
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
