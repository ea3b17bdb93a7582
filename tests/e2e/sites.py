"""A real Pagoda behind a real Daphne on a loopback port: the machinery the e2e tests share.

A plain module (fixtures live in tests/e2e/conftest.py) so that a test module that builds a site
of its own imports from here rather than from a conftest.

A site is a temporary SQLite database migrated and filled through the management commands a
person would use (register_model, ensure_bundled_model, create_api_key), and a settings module
written next to it that points MEDIA_ROOT (the tokenizer exports) into the temporary folder.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY_SETTINGS = {"num_kv_blocks": 64, "max_model_len": 512, "max_num_seqs": 8}
START_TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Site:
    root: Path
    env: dict
    port: int = field(default_factory=free_port)
    procs: list = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def db_path(self) -> Path:
        return self.root / "db.sqlite3"

    def manage(self, *args: str, timeout: float = 300) -> str:
        result = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO_ROOT, env=self.env,
                                capture_output=True, text=True, timeout=timeout)
        assert result.returncode == 0, f"manage.py {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
        return result.stdout

    def create_key(self, name: str, *models: str) -> str:
        args = ["create_api_key", "--name", name] + (["--models", ",".join(models)] if models else [])
        return self.manage(*args).strip().splitlines()[-1]

    def spawn(self, name: str, args: list[str], extra_env: dict | None = None) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "wb")
        proc = subprocess.Popen(args, cwd=REPO_ROOT, env={**self.env, **(extra_env or {})}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def start_daphne(self, extra_env: dict | None = None) -> subprocess.Popen:
        return self.spawn("daphne", [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port),
                                     "webapp.config.asgi:application"], extra_env)

    def start_embedded(self, what: str, extra_env: dict | None = None) -> subprocess.Popen:
        """Daphne with the engine workers in its own process, once /readyz says they serve (``what``
        names them in the failure); the caller stops the site whether or not they came up."""
        daphne = self.start_daphne({"PAGODA_EMBEDDED_WORKERS": "1", **(extra_env or {})})
        self.wait_until(lambda: readyz_ok(self), what)
        return daphne

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def wait_until(self, ready, what: str, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if ready():
                    return
            except httpx.HTTPError:
                pass
            dead = [p for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.name}\n{self.log(p.stem)}" for p in self.root.glob("*.log"))
                pytest.fail(f"{what} did not happen:\n{logs}")
            time.sleep(0.25)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    # ------------------------------------------------------------- reading the site's state
    def usage(self, request_id: str, timeout: float = 10.0) -> dict:
        """The usage record of a request once ended, waiting for it (a request that reached a worker
        has a ``running`` record from then until it ends)."""
        return self._ended("SELECT * FROM usage_usagerecord WHERE request_id = ?", (request_id,), timeout,
                           f"no ended usage record for {request_id}")

    def last_usage(self, timeout: float = 10.0) -> dict:
        """The newest usage record once ended."""
        return self._ended("SELECT * FROM usage_usagerecord ORDER BY id DESC LIMIT 1", (), timeout,
                           "no ended usage record")

    def _ended(self, query: str, params: tuple, timeout: float, failure: str) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            with sqlite3.connect(self.db_path) as db:
                db.row_factory = sqlite3.Row
                row = db.execute(query, params).fetchone()
            if (row is not None and row["status"] != "running") or time.monotonic() > deadline:
                assert row is not None and row["status"] != "running", failure
                return dict(row)
            time.sleep(0.1)

    def metric(self, name: str, **labels) -> float | None:
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return sample.value
        return None


READYZ_TOKEN = "e2e-readyz-token"  # /readyz shows its checks to callers sending it (X-Readyz-Token)


def make_site(root: Path, extra_env: dict | None = None) -> Site:
    root.mkdir(parents=True, exist_ok=True)
    (root / "e2e_settings.py").write_text(
        "from webapp.config.settings.test import *  # noqa: F403\n"
        f"MEDIA_ROOT = {str(root / 'media')!r}\n")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "e2e_settings", "PAGODA_READYZ_TOKEN": READYZ_TOKEN,
           "PYTHONPATH": os.pathsep.join([str(root), str(REPO_ROOT)]),
           "DATABASE_URL": f"sqlite:///{root / 'db.sqlite3'}", "LOG_LEVEL": "INFO", **(extra_env or {})}
    for name in ("REDIS_URL", "PAGODA_EMBEDDED_WORKERS"):
        if name not in (extra_env or {}):
            env.pop(name, None)
    site = Site(root, env)
    site.manage("migrate", "-v", "0")
    return site


def readyz_ok(site: Site) -> bool:
    return httpx.get(f"{site.url}/readyz", timeout=5).status_code == 200


def open_stream_then_disconnect(site: Site, key: str, body: dict, *, wait_running: bool = True) -> str:
    """Start a streamed completion, read a few events, then hang up; returns the request id.

    With ``wait_running`` the hang-up waits until the worker reports the request as running
    (heartbeats come every second, so only for a model slow enough to still be generating).
    """
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{site.url}/v1/completions", json={**body, "stream": True},
                         headers={"Authorization": f"Bearer {key}"}) as response:
            assert response.status_code == 200
            # Not `for ... break`: closing httpx's line iterator closes the connection too early.
            lines = response.iter_lines()
            while not (line := next(lines)).startswith("data: {"):
                pass
            request_id = json.loads(line[6:])["id"]
            if wait_running:
                site.wait_until(lambda: site.metric("pagoda:num_requests_running", model_name=body["model"]) == 1,
                                "the worker reporting the streamed request as running")
    return request_id


def post_then_hang_up(site: Site, key: str, body: dict) -> None:
    """Send a non-streamed completion on a bare socket; close it once the worker runs the request."""
    payload = json.dumps(body).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{site.port}\r\n"
            f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", site.port), timeout=10) as sock:
        sock.sendall(head + payload)
        site.wait_until(lambda: site.metric("pagoda:num_requests_running", model_name=body["model"]) == 1,
                        "the worker reporting the request as running")
