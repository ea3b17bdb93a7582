"""docker-compose.yml as shipped: Debian's docker-compose 1.29 validates it, and what it wires
(shared models volume, one-shot bootstrap, health-gated starts, pinned images, mounted
monitoring files) holds in the configuration compose itself resolves. The bootstrap script runs
for real against a fresh SQLite database, twice. No Docker engine is needed (there is none here).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
COMPOSE = shutil.which("docker-compose")
needs_compose = pytest.mark.skipif(COMPOSE is None, reason="docker-compose not installed (make system-deps "
                                                            "installs Debian's docker-compose)")
PAGODA_SERVICES = ("bootstrap", "web", "engine-worker", "engine-worker-gpu", "celery-worker", "celery-beat")


def compose(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "COMPOSE_FILE", "COMPOSE_PROFILES")}
    return subprocess.run([COMPOSE, "-f", "docker-compose.yml", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60, env={**env, "SECRET_KEY": "compose-test"})


@pytest.fixture(scope="module")
def resolved() -> dict:
    result = compose("config")
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


@pytest.mark.slow
@needs_compose
def test_docker_compose_validates_the_file_as_shipped():
    result = compose("config", "-q")
    assert (result.returncode, result.stderr) == (0, "")


@pytest.mark.e2e
@needs_compose
def test_the_stack_refuses_to_start_without_a_secret_key():
    env = {k: v for k, v in os.environ.items() if k != "SECRET_KEY"}
    result = subprocess.run([COMPOSE, "-f", "docker-compose.yml", "config", "-q"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode != 0 and "set SECRET_KEY" in result.stderr


@pytest.mark.slow
@needs_compose
def test_web_workers_and_validation_job_share_the_models_volume(resolved):
    services = resolved["services"]
    for name in PAGODA_SERVICES:
        assert any(v.startswith("models:/app/media") for v in services[name]["volumes"]), name
    assert "models" in resolved["volumes"]


@needs_compose
def test_every_pagoda_process_starts_after_the_bootstrap_and_healthy_dependencies(resolved):
    services = resolved["services"]
    assert services["bootstrap"]["command"] == "sh deploy/bootstrap.sh"
    assert services["bootstrap"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in PAGODA_SERVICES[1:]:
        assert services[name]["depends_on"]["bootstrap"] == {"condition": "service_completed_successfully"}
        assert services[name]["depends_on"]["redis"] == {"condition": "service_healthy"}
    assert services["prometheus"]["depends_on"] == {"web": {"condition": "service_healthy"}}
    assert services["grafana"]["depends_on"] == {"prometheus": {"condition": "service_healthy"}}
    for name in ("web", "engine-worker", "celery-worker", "redis", "postgres", "prometheus", "grafana"):
        assert services[name]["healthcheck"]["test"], name


@needs_compose
def test_images_are_pinned_and_the_gpu_worker_is_an_opt_in_profile(resolved):
    services = resolved["services"]
    for name, service in services.items():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), (name, image)
    assert services["engine-worker-gpu"]["profiles"] == ["gpu"]
    devices = services["engine-worker-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert [name for name, s in services.items() if s.get("profiles")] == ["engine-worker-gpu"]


@needs_compose
def test_monitoring_configuration_is_mounted_from_files_in_the_repository(resolved):
    assert "configs" not in resolved  # no inline configs.content: compose 1.29 cannot read it
    mounts = [v for s in resolved["services"].values() for v in s.get("volumes", []) if v.startswith("/")]
    sources = {Path(v.split(":")[0]).relative_to(REPO_ROOT).as_posix() for v in mounts}
    assert sources == {"deploy/pagoda.yaml", "deploy/prometheus/prometheus.yml", "deploy/prometheus/rules",
                       "deploy/grafana/provisioning", "deploy/grafana/dashboards"}
    for source in sources:
        assert (REPO_ROOT / source).exists(), source
    prometheus = yaml.safe_load((REPO_ROOT / "deploy/prometheus/prometheus.yml").read_text())
    assert prometheus["scrape_configs"][0]["static_configs"] == [{"targets": ["web:8000"]}]
    assert prometheus["rule_files"] == ["/etc/prometheus/rules/*.yml"]


@pytest.mark.e2e
def test_the_image_can_collect_static_files_under_production_settings(tmp_path):
    (tmp_path / "collect_settings.py").write_text("from webapp.config.settings.production import *  # noqa\n"
                                                  f"STATIC_ROOT = {str(tmp_path / 'static')!r}\n")
    env = {**os.environ, "SECRET_KEY": "collectstatic-only", "DJANGO_SETTINGS_MODULE": "collect_settings",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_ROOT)])}
    result = subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"], cwd=REPO_ROOT,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "static/admin/css/base.css").is_file() and (tmp_path / "static/chat/chat.js").is_file()


def _bootstrap(root: Path, **extra: str) -> subprocess.CompletedProcess:
    (root / "boot_settings.py").write_text("from webapp.config.settings.test import *  # noqa\n"
                                           f"MEDIA_ROOT = {str(root / 'media')!r}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGODA_ADMIN") and k != "REDIS_URL"}
    env.update(DJANGO_SETTINGS_MODULE="boot_settings", DATABASE_URL=f"sqlite:///{root / 'db.sqlite3'}",
               PYTHONPATH=os.pathsep.join([str(root), str(REPO_ROOT)]), PYTHON=sys.executable, **extra)
    return subprocess.run(["sh", str(REPO_ROOT / "deploy/bootstrap.sh")], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.e2e
def test_bootstrap_migrates_registers_the_bundled_model_and_creates_the_admin_once(tmp_path):
    first = _bootstrap(tmp_path, PAGODA_ADMIN_USER="root", PAGODA_ADMIN_PASSWORD="s3cret-pass")
    assert first.returncode == 0, first.stdout + first.stderr
    again = _bootstrap(tmp_path, PAGODA_ADMIN_USER="root", PAGODA_ADMIN_PASSWORD="other")
    assert again.returncode == 0, again.stdout + again.stderr

    assert "Created the superuser 'root'" in first.stdout and "exists" in again.stdout
    with sqlite3.connect(tmp_path / "db.sqlite3") as db:
        users = db.execute("SELECT username, is_superuser, password FROM auth_user").fetchall()
        models = db.execute("SELECT m.slug, v.status FROM registry_model m JOIN registry_modelversion v "
                            "ON v.model_id = m.id").fetchall()
    assert [(u, s) for u, s, _ in users] == [("root", 1)]
    assert models == [("smollm2", "active")]
    check = subprocess.run([sys.executable, "-c", "import django; django.setup(); "
                            "from django.contrib.auth import authenticate; "
                            "print(bool(authenticate(username='root', password='s3cret-pass')))"],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "DJANGO_SETTINGS_MODULE": "boot_settings",
                                "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
                                "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_ROOT)])})
    assert check.stdout.strip() == "True", check.stderr



def _healthcheck(*args: str, redis_url: str = "redis://127.0.0.1:1/0") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "deploy/healthcheck.py", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "REDIS_URL": redis_url})


@pytest.mark.e2e
def test_the_worker_health_check_wants_a_fresh_heartbeat_from_its_own_host(redis_server):
    import socket
    import time

    from workers.connect import worker_transport
    from workers.protocol import WorkerInfo

    assert _healthcheck("worker", "hc-model", redis_url=redis_server).returncode == 1  # nobody yet
    transport = worker_transport(redis_server, "hc-model")
    now = time.time()
    info = dict(worker_id=transport.worker_id, model="hc-model", version="1", pid=1, started_at=now,
                last_heartbeat=now, max_num_seqs=1, max_model_len=16)
    transport.heartbeat(WorkerInfo(host="another-host", **info))
    assert _healthcheck("worker", "hc-model", redis_url=redis_server).returncode == 1
    transport.heartbeat(WorkerInfo(host=socket.gethostname(), **info))
    assert _healthcheck("worker", "hc-model", redis_url=redis_server).returncode == 0
    unreachable = _healthcheck("worker", "hc-model")
    assert unreachable.returncode == 1 and "cannot read the workers from Redis" in unreachable.stderr
    assert _healthcheck("http", "http://127.0.0.1:1/healthz").returncode == 1
