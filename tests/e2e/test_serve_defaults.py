"""What `make run` serves with when nothing is configured: manage.py and asgi.py default to the
self-hosting settings (DEBUG off), Daphne serves /static/ itself with the security headers, and the
secret key is generated once outside the repository and reused across restarts."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import httpx
import pytest

from tests.e2e.sites import REPO_ROOT, Site

pytestmark = pytest.mark.e2e

USERNAME, PASSWORD = "serve-tester", "serve-tester-pw-77"


def manage(env: dict, *args: str, extra_env: dict | None = None) -> str:
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO_ROOT, env={**env, **(extra_env or {})},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve_defaults")
    env = {k: v for k, v in os.environ.items()
           if k not in ("DJANGO_SETTINGS_MODULE", "SECRET_KEY", "REDIS_URL", "PAGODA_EMBEDDED_WORKERS", "DEBUG")}
    env.update({"PAGODA_DATA_DIR": str(root / "data"), "DATABASE_URL": f"sqlite:///{root / 'db.sqlite3'}",
                "PYTHONPATH": str(REPO_ROOT)})
    manage(env, "migrate", "-v", "0")
    manage(env, "createsuperuser", "--noinput", "--username", USERNAME, "--email", "s@example.com",
           extra_env={"DJANGO_SUPERUSER_PASSWORD": PASSWORD})
    site = Site(root, env)
    site.start_daphne()
    site.wait_until(lambda: httpx.get(f"{site.url}/healthz", timeout=5).status_code == 200, "Daphne answering")
    try:
        yield site
    finally:
        site.stop()


def test_the_secret_key_is_generated_once_outside_the_repository_owner_only(served):
    key_file = served.root / "data" / "secret_key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert len(key_file.read_text().strip()) >= 50


def test_daphne_serves_static_files_with_debug_off_and_security_headers(served):
    for path, kind in (("/static/chat/chat.js", "text/javascript"), ("/static/admin/css/base.css", "text/css"),
                       ("/static/vendor/dompurify/purify.min.js", "text/javascript")):
        response = httpx.get(served.url + path, timeout=10)
        assert response.status_code == 200 and response.headers["content-type"].startswith(kind), path
        assert response.headers["x-content-type-options"] == "nosniff"
        assert "img-src 'self' data:" in response.headers["content-security-policy"]
        assert int(response.headers["content-length"]) == len(response.content) > 0

    missing = httpx.get(served.url + "/no-such-page/", timeout=10)
    assert missing.status_code == 404 and "DEBUG = True" not in missing.text  # no debug page
    login = httpx.get(served.url + "/accounts/login/", timeout=10)
    assert login.status_code == 200 and "connect-src 'self' ws://127.0.0.1" in login.headers["content-security-policy"]
    assert login.headers["x-frame-options"] == "DENY"


def test_a_session_survives_a_restart_because_the_key_is_reused(served):
    key_before = (served.root / "data" / "secret_key").read_text()
    with httpx.Client(base_url=served.url, timeout=10) as http:
        form = http.get("/accounts/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
        response = http.post("/accounts/login/", data={"username": USERNAME, "password": PASSWORD, "next": "/",
                                                       "csrfmiddlewaretoken": token})
        assert response.status_code == 302 and response.headers["location"] == "/"
        cookies = dict(http.cookies)

    served.stop()
    served.procs.clear()
    served.start_daphne()
    served.wait_until(lambda: httpx.get(f"{served.url}/healthz", timeout=5).status_code == 200, "Daphne restarting")

    page = httpx.get(served.url + "/", cookies=cookies, timeout=10)
    assert page.status_code == 200 and 'id="composer"' in page.text  # still logged in
    assert (served.root / "data" / "secret_key").read_text() == key_before
