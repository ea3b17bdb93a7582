"""``python -m deploy.stack.postgres run -- CMD`` (what ``make test`` runs the database tests under):
CMD gets DATABASE_URL on a live server, and the server is stopped and its folder removed whatever
CMD did: succeeded, failed, or was interrupted."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.stack.postgres import find_binary

pytestmark = pytest.mark.skipif(find_binary("initdb") is None, reason="PostgreSQL's initdb is not installed")

RUN = [sys.executable, "-m", "deploy.stack.postgres", "run", "--"]
READY = re.compile(r"PostgreSQL (postgres://\S+:(\d+)/pagoda) ready in [\d.]+ s \(folder (\S+)\)")


def accepts_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.mark.e2e
def test_the_command_reaches_the_server_and_its_failure_is_the_exit_status():
    query = ("import os, sys, psycopg; url = os.environ['DATABASE_URL']; "
             "print(psycopg.connect(url).execute('SELECT current_database()').fetchone()[0]); sys.exit(3)")
    result = subprocess.run([*RUN, sys.executable, "-c", query], capture_output=True, text=True, timeout=120)
    ready = READY.search(result.stdout)
    assert ready, result.stdout + result.stderr
    assert result.returncode == 3
    assert result.stdout.splitlines()[-1] == "pagoda"
    assert not Path(ready.group(3)).exists()
    assert not accepts_connections(int(ready.group(2)))


@pytest.mark.e2e
def test_an_interrupted_run_stops_the_server_and_removes_its_folder():
    runner = subprocess.Popen([*RUN, sys.executable, "-c", "import time; time.sleep(120)"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        line = runner.stdout.readline()
        ready = READY.search(line)
        assert ready, line
        port, folder = int(ready.group(2)), Path(ready.group(3))
        assert accepts_connections(port) and folder.exists()
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    assert not folder.exists()
    assert not accepts_connections(port)
