"""The workers page's charts: metric snapshot series as JSON (staff only)."""

from __future__ import annotations

from django.conf import settings
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from webapp.console.access import staff_required
from webapp.monitoring.selectors import WINDOWS, metric_series


@never_cache
@require_safe
@staff_required
def metrics_json(request):
    """``?window=1h|1d`` (default 1h), ``&model=<slug>`` to keep one model; see metric_series."""
    window = request.GET.get("window", "1h")
    if window not in WINDOWS:
        return JsonResponse({"error": f"window must be one of {', '.join(WINDOWS)}, got {window!r}"}, status=400)
    model = request.GET.get("model") or None
    data = metric_series(window=window, model=model)
    data["interval_s"] = settings.PAGODA_METRICS_INTERVAL_S
    return JsonResponse(data)
