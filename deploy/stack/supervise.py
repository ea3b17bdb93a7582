"""Run one process of the local stack, and start it again when it dies (docker-compose's restart).

    python -m deploy.stack.supervise [--service] [--stop-signal INT] NAME -- COMMAND ...

honcho, which runs deploy/stack/Procfile, stops the whole stack as soon as any of its processes
exits (foreman's rule). A web process or an engine worker that crashes, or that a test kills,
must instead come back while the rest keeps serving, so each runs under this supervisor:

- before the first start it waits until the services in DATABASE_URL and REDIS_URL accept
  connections (they start alongside, under the same honcho);
- the command runs in a session of its own, its pid written to $PAGODA_STACK_DIR/run/NAME.pid;
  when it dies it is started again after a pause that doubles while it keeps dying quickly
  (1 s, then up to 30 s);
- SIGTERM or SIGINT is passed on to the command once (as --stop-signal when given: PostgreSQL's
  fast shutdown is SIGINT) and the supervisor exits with its status;
  a supervisor killed outright takes the command with it (PR_SET_PDEATHSIG), so nothing is
  left running when honcho gives up waiting and kills its process group.

``--service`` (PostgreSQL, Redis): nothing to wait for before starting, its pid file in
run/services/, and on SIGTERM or SIGINT it stays up until the Pagoda processes have stopped (their
pid files gone, at most SERVICE_LINGER_S), so that they shut down against a live database and Redis.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

WAIT_FOR_SERVICES_S = 120
FIRST_PAUSE_S, MAX_PAUSE_S = 1.0, 30.0
STABLE_S = 60.0  # a process that ran this long before dying is restarted after the first pause again
PR_SET_PDEATHSIG = 1
SERVICE_LINGER_S = 4.0  # honcho kills what still runs 5 s after it asked everything to stop


def log(name: str, message: str) -> None:
    print(f"supervise {name}: {message}", flush=True)


def service_addresses(environ: dict) -> list[tuple[str, int]]:
    """(host, port) of the database and Redis named in the environment (PostgreSQL and Redis only)."""
    addresses = []
    for variable, default_port in (("DATABASE_URL", 5432), ("REDIS_URL", 6379)):
        parts = urlsplit(environ.get(variable, ""))
        if parts.scheme in ("postgres", "postgresql", "redis") and parts.hostname:
            addresses.append((parts.hostname, parts.port or default_port))
    return addresses


def wait_for(name: str, addresses: list[tuple[str, int]], timeout: float = WAIT_FOR_SERVICES_S) -> None:
    deadline = time.monotonic() + timeout
    for host, port in addresses:
        while True:
            try:
                socket.create_connection((host, port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    log(name, f"{host}:{port} did not accept connections within {timeout:.0f} s; starting anyway")
                    return
                time.sleep(0.2)


def _die_with_parent(parent: int) -> None:
    """In the child before exec: SIGKILL when the supervisor dies, however it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(1)


def _wait_for_the_others(run_dir: Path) -> None:
    deadline = time.monotonic() + SERVICE_LINGER_S
    while any(run_dir.glob("*.pid")) and time.monotonic() < deadline:
        time.sleep(0.1)


def supervise(name: str, command: list[str], service: bool = False, stop_signal: int | None = None) -> int:
    run_dir = Path(os.environ.get("PAGODA_STACK_DIR", ".")) / "run"
    pid_file = (run_dir / "services" if service else run_dir) / f"{name}.pid"
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    stopping: list[int] = []
    child: subprocess.Popen | None = None

    def stop(signum, frame):
        if not stopping:
            stopping.append(signum)
            if service:
                _wait_for_the_others(run_dir)
            if child is not None and child.poll() is None:
                child.send_signal(stop_signal or signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if not service:
        wait_for(name, service_addresses(os.environ))
    pause, parent = FIRST_PAUSE_S, os.getpid()
    while not stopping:
        started = time.monotonic()
        child = subprocess.Popen(command, start_new_session=True, preexec_fn=lambda: _die_with_parent(parent))
        pid_file.write_text(f"{child.pid}\n")
        log(name, f"started pid {child.pid}")
        while True:
            try:
                code = child.wait()
                break
            except InterruptedError:
                continue
        if stopping:
            break
        pause = FIRST_PAUSE_S if time.monotonic() - started > STABLE_S else pause
        log(name, f"pid {child.pid} exited with {code}; starting it again in {pause:.0f} s")
        deadline = time.monotonic() + pause
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.1)
        pause = min(pause * 2, MAX_PAUSE_S)
    code = child.wait() if child is not None else 0
    pid_file.unlink(missing_ok=True)
    log(name, f"stopped ({code})")
    return code if code >= 0 else 128 - code


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.stack.supervise", description=__doc__.splitlines()[0])
    parser.add_argument("--service", action="store_true", help="PostgreSQL or Redis: stop after the others")
    parser.add_argument("--stop-signal", choices=["INT", "TERM"], default=None)
    parser.add_argument("name")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    stop_signal = getattr(signal, f"SIG{args.stop_signal}") if args.stop_signal else None
    return supervise(args.name, command, args.service, stop_signal)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
