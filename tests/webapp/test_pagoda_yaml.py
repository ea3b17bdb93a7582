"""pagoda.yaml ($PAGODA_CONFIG): engine settings checked against the engine's schema, serving
settings for the web processes; the environment overrides the file; an unknown key is refused
naming the key and the file; a real worker process starts with the effective values and logs
them, and a web process's settings take the serving section."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workers.config_file import ConfigError, load_config

REPO_ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "pagoda.yaml"
    path.write_text(text)
    return str(path)


def test_file_settings_reach_the_engine_under_the_versions_and_the_environments(tmp_path):
    path = write(tmp_path, "engine:\n  max_model_len: 256\n  max_num_seqs: 8\n  quantization: int8\n"
                           "  gpu_memory_utilization: 0.5\n")
    config = load_config({"PAGODA_CONFIG": path, "PAGODA_ENGINE_MAX_NUM_SEQS": "3",
                          "PAGODA_ENGINE_ENABLE_PREFIX_CACHING": "false"})
    version = {"max_model_len": 128, "max_num_seqs": 64}

    assert config.engine_settings(version) == {"enable_prefix_caching": False, "gpu_memory_utilization": 0.5,
                                               "max_model_len": 128, "max_num_seqs": 3, "quantization": "int8"}
    assert config.source("max_num_seqs", version) == "PAGODA_ENGINE_MAX_NUM_SEQS"
    assert config.source("max_model_len", version) == "the version's settings"
    assert config.source("quantization", version) == path
    assert "max_num_seqs=3 (PAGODA_ENGINE_MAX_NUM_SEQS)" in config.describe(version)


def test_the_shipped_deploy_file_is_valid():
    config = load_config({"PAGODA_CONFIG": str(REPO_ROOT / "deploy/pagoda.yaml")})
    assert config.serving["queue_timeout_s"] > 0


@pytest.mark.parametrize("text, named", [
    ("engine:\n  max_num_sequences: 8\n", "engine.max_num_sequences: unknown engine setting"),
    ("engine:\n  max_num_seqs: 0\n", "engine.max_num_seqs: must be an integer >= 1"),
    ("engine:\n  quantization: int3\n", "engine.quantization: must be one of auto, none, int8, int4"),
    ("serving:\n  queue_timeout: 5\n", "serving.queue_timeout: unknown serving setting"),
    ("serving:\n  request_timeout_s: soon\n", "serving.request_timeout_s: must be a number >= 0"),
    ("batching:\n  max: 1\n", "batching: unknown key; known sections: engine, serving"),
    ("engine: [1, 2]\n", "engine: must be a mapping"),
    ("engine:\n  max_num_seqs: [\n", "not valid YAML"),
])
def test_a_bad_file_is_refused_naming_the_key_and_the_file(tmp_path, text, named):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config({"PAGODA_CONFIG": path})
    assert str(caught.value).startswith(path) and named in str(caught.value)


def test_a_bad_environment_override_is_refused_naming_the_variable():
    with pytest.raises(ConfigError, match="^PAGODA_ENGINE_MAX_NUM_SEQ: unknown engine setting"):
        load_config({"PAGODA_ENGINE_MAX_NUM_SEQ": "4"})
    with pytest.raises(ConfigError, match="^PAGODA_QUEUE_TIMEOUT_S: must be a number >= 0"):
        load_config({"PAGODA_QUEUE_TIMEOUT_S": "-1"})
    with pytest.raises(ConfigError, match="^PAGODA_MAX_REQUESTS_IN_FLIGHT: must be an integer >= 1, got 0"):
        load_config({"PAGODA_MAX_REQUESTS_IN_FLIGHT": "0"})  # no place at all: every request refused
    with pytest.raises(ConfigError, match="^PAGODA_CONFIG: cannot read /nonexistent/pagoda.yaml"):
        load_config({"PAGODA_CONFIG": "/nonexistent/pagoda.yaml"})


def test_serving_settings_come_from_the_file_unless_the_environment_says(tmp_path):
    path = write(tmp_path, "serving:\n  max_queued_per_model: 7\n  queue_timeout_s: 4\n"
                           "  max_requests_in_flight: 40\n")
    serving = load_config({"PAGODA_CONFIG": path, "PAGODA_QUEUE_TIMEOUT_S": "2.5",
                           "PAGODA_MAX_REQUESTS_IN_FLIGHT": "12"}).serving
    assert serving == {"max_queued_per_model": 7, "max_requests_in_flight": 12, "queue_timeout_s": 2.5,
                       "request_timeout_s": 600.0, "drain_timeout_s": 30.0}


def _django_settings(env: dict) -> subprocess.CompletedProcess:
    code = ("from django.conf import settings; "
            "print(settings.PAGODA_MAX_QUEUED_PER_MODEL, settings.PAGODA_QUEUE_TIMEOUT_S)")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PAGODA_")}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                          env={**clean, "DJANGO_SETTINGS_MODULE": "webapp.config.settings.test", **env})


@pytest.mark.slow
def test_a_web_process_takes_the_serving_section_and_refuses_a_bad_file(tmp_path):
    good = _django_settings({"PAGODA_CONFIG": write(tmp_path, "serving:\n  max_queued_per_model: 9\n")})
    assert (good.returncode, good.stdout.strip()) == (0, "9 30.0"), good.stderr
    bad = _django_settings({"PAGODA_CONFIG": write(tmp_path, "serving:\n  max_queue: 9\n")})
    assert bad.returncode != 0 and "serving.max_queue: unknown serving setting" in bad.stderr


@pytest.mark.slow
def test_a_worker_process_serves_with_the_effective_values_and_logs_them(tmp_path, tiny_llama_dir, redis_server):
    from workers.connect import get_engine_client

    path = write(tmp_path, "engine:\n  max_num_seqs: 8\n  max_model_len: 256\n  num_kv_blocks: 32\n")
    log = open(tmp_path / "worker.log", "wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "workers", "--model-path", str(tiny_llama_dir), "--model", "yaml-tiny",
         "--redis-url", redis_server], cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "PAGODA_CONFIG": path, "PAGODA_ENGINE_MAX_NUM_SEQS": "3"})
    try:
        deadline = time.monotonic() + 180
        while not (live := get_engine_client(redis_server).live_workers("yaml-tiny")):
            assert worker.poll() is None and time.monotonic() < deadline, (tmp_path / "worker.log").read_text()
            time.sleep(0.25)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    text = (tmp_path / "worker.log").read_text()

    assert [(w.max_num_seqs, w.max_model_len) for w in live] == [(3, 256)]
    assert f"max_model_len=256 ({path})" in text and "max_num_seqs=3 (PAGODA_ENGINE_MAX_NUM_SEQS)" in text


@pytest.mark.e2e
def test_a_worker_process_refuses_an_unknown_key_naming_it_and_the_file(tmp_path, tiny_llama_dir):
    path = write(tmp_path, "engine:\n  batch_timeout_ms: 5\n")
    result = subprocess.run([sys.executable, "-m", "workers", "--model-path", str(tiny_llama_dir), "--model", "t",
                             "--redis-url", "redis://127.0.0.1:1/0"], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=120, env={**os.environ, "PAGODA_CONFIG": path})
    assert result.returncode == 2
    assert f"{path}: engine.batch_timeout_ms: unknown engine setting" in result.stderr


@pytest.mark.slow
@pytest.mark.django_db
def test_the_console_workers_page_shows_the_effective_values(client, tiny_llama_dir, tmp_path, monkeypatch):
    from django.contrib.auth import get_user_model

    from workers import embedded

    monkeypatch.setenv("PAGODA_CONFIG", write(tmp_path, "engine:\n  max_num_seqs: 5\n  block_size: 32\n"))
    monkeypatch.setenv("PAGODA_ENGINE_ENABLE_PREFIX_CACHING", "false")
    embedded.start_embedded_worker("yaml-console", "1", str(tiny_llama_dir),
                                   {"num_kv_blocks": 16, "max_model_len": 256, "max_num_seqs": 7})
    try:
        assert embedded.wait_for_embedded_worker("yaml-console", timeout=60)
        client.force_login(get_user_model().objects.create_user("staff", password="pw", is_staff=True))
        page = client.get("/console/workers/").content.decode()
        rows = client.get("/console/workers.json").json()["workers"]
    finally:
        embedded.stop_embedded_workers(drain_timeout=5)
    (row,) = [r for r in rows if r["model"] == "yaml-console"]

    assert {k: row["engine_settings"][k] for k in ("max_num_seqs", "block_size", "enable_prefix_caching",
                                                   "max_model_len")} == {
        "max_num_seqs": 7, "block_size": 32, "enable_prefix_caching": False, "max_model_len": 256}
    assert "<code>block_size=32</code>" in page and "<code>enable_prefix_caching=False</code>" in page


def test_settings_whose_kv_pool_cannot_fit_the_machine_are_refused_before_loading_with_the_figures(tiny_llama_dir):
    from workers.schema import InvalidParameterError
    from workers.serving import ModelServer, ServeSpec

    server = ModelServer("too-big", redis_url=None)
    with pytest.raises(InvalidParameterError, match="engine_settings: the model needs .* MiB with these settings, "
                                                     "more than this machine's .* MiB: .*KV cache"):
        server.serve(ServeSpec("1", str(tiny_llama_dir), {"num_kv_blocks": 10**9, "device": "cpu"}))
    assert server.failed is not None and not server.is_alive  # nothing was loaded
