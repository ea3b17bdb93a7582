"""The Batch API's limits, read from the environment (a Django setting of the same name wins, so
tests and deployments can set them either way)."""

from __future__ import annotations

import os

from django.conf import settings

DEFAULTS = {
    # An input file: at most this many bytes and lines (OpenAI's: 200 MB, 50,000 requests).
    "PAGODA_BATCH_MAX_FILE_BYTES": 100 * 1024 * 1024,
    "PAGODA_BATCH_MAX_LINES": 50_000,
    # Lines of one batch sent to the engine at once, and, while other requests (interactive ones)
    # run on the same model, at most this many: by default none, the running lines are preempted
    # (aborted and queued again), so a batch only fills idle capacity.
    "PAGODA_BATCH_MAX_IN_FLIGHT": 4,
    "PAGODA_BATCH_MAX_IN_FLIGHT_BUSY": 0,
    # A batch held off so, with none of its lines running, for this long gets one line in anyway
    # (its minimum share under interactive traffic that never stops), then steps aside again.
    "PAGODA_BATCH_MAX_STARVATION_S": 10.0,
    # A line refused for a reason that passes (a rate limit, no worker yet, a worker lost) is
    # tried again this many times in all before it fails.
    "PAGODA_BATCH_MAX_ATTEMPTS": 5,
    # A runner beats this often; a batch whose beat is older than STALE is taken over.
    "PAGODA_BATCH_HEARTBEAT_S": 2.0,
    "PAGODA_BATCH_STALE_S": 30.0,
}


def batch_setting(name: str):
    default = DEFAULTS[name]
    if hasattr(settings, name):
        return getattr(settings, name)
    raw = os.environ.get(name)
    return default if raw in (None, "") else type(default)(raw)
