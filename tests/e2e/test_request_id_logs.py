"""One request id from the client's X-Request-Id through the web process's log into the engine
worker process's log lines (Redis mode: two processes, one-line records with request_id=...)."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.e2e


def test_the_request_id_follows_a_request_from_the_web_process_into_the_workers_log(redis_site):
    response = httpx.post(f"{redis_site.url}/v1/completions", timeout=120,
                          headers={"Authorization": f"Bearer {redis_site.keys['all']}"},
                          json={"model": "tiny", "prompt": "Once upon a time", "max_tokens": 3, "temperature": 0})
    assert response.status_code == 200, response.text
    request_id = response.headers["X-Request-Id"]
    redis_site.usage(request_id)  # written as the request ends, after the worker's last line

    worker = [line for line in redis_site.log("worker").splitlines() if f"request_id={request_id}" in line]
    web = [line for line in redis_site.log("daphne").splitlines() if f"request_id={request_id}" in line]

    assert len(worker) == 2 and "claimed by worker" in worker[0] and "finished (length): 3 output tokens" in worker[1]
    assert len(web) == 1 and f"request {request_id} completions (tiny): ok" in web[0]
    assert response.json()["id"] == request_id
