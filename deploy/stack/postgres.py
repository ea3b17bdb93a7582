"""A throwaway PostgreSQL server from the binaries on PATH (initdb, pg_ctl, postgres: Debian's 15).

One folder holds everything: ``data/`` (the cluster), ``sock/`` (its unix socket) and
``postgres.log``. The server listens on a loopback port only, trusts local connections (no
password: it is reachable from this machine alone and holds nothing worth keeping) and runs
without fsync. PostgreSQL refuses to run as root, so under root its binaries run as the
``postgres`` user (else ``nobody``), who then owns the folder.

Used three ways:

- ``python -m deploy.stack.postgres run -- CMD ...``: a server in a fresh temporary folder on a
  free port, CMD run with DATABASE_URL pointing at it, then the server stopped and the folder
  removed, whatever CMD did (its exit status is returned). ``make test`` runs the database tests
  this way.
- ``python -m deploy.stack.postgres serve --root DIR --port N``: the server in the foreground
  (initialised and its database created on first use), for a process manager (``make stack``'s
  Procfile); SIGINT is its fast shutdown.
- ``PostgresServer(root).start()`` / ``.stop()`` from Python (tests/postgres.py, the launcher).
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DATABASE = "pagoda"
USER = "pagoda"
START_TIMEOUT_S = 60
# Throwaway: durability off; enough connections for a test's threads or a whole stack.
SERVER_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
                   "max_connections": "200", "listen_addresses": "127.0.0.1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _owner() -> pwd.struct_passwd | None:
    """The unprivileged account the server runs as when we are root; None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError("running as root and there is no 'postgres' or 'nobody' account to run PostgreSQL as")


def find_binary(name: str) -> str | None:
    """``name`` on PATH, else in the newest /usr/lib/postgresql/<version>/bin (where Debian puts
    the server binaries, off PATH); None when neither has it."""
    found = shutil.which(name)
    if found is None:
        versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name)
                          if p.parent.name.isdigit() else 0)
        found = next((str(d / name) for d in reversed(versions) if (d / name).is_file()), None)
    return found


def _binary(name: str) -> str:
    path = find_binary(name)
    if path is None:
        raise RuntimeError(f"{name} is not on PATH nor in /usr/lib/postgresql/*/bin: install PostgreSQL's "
                           "server binaries (Debian: postgresql-15)")
    return path


class PostgresServer:
    def __init__(self, root: Path, port: int | None = None, database: str = DATABASE, user: str = USER):
        self.root = Path(root).resolve()
        self.port = port or free_port()
        self.database, self.user = database, user
        self.owner = _owner()

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "sock"

    @property
    def log_path(self) -> Path:
        return self.root / "postgres.log"

    @property
    def url(self) -> str:
        return f"postgres://{self.user}@127.0.0.1:{self.port}/{self.database}"

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def _as_owner(self, argv: list[str]) -> list[str]:
        if self.owner is None:
            return argv
        return ["setpriv", f"--reuid={self.owner.pw_uid}", f"--regid={self.owner.pw_gid}", "--clear-groups",
                "--", *argv]

    def _run(self, argv: list[str], what: str) -> None:
        result = subprocess.run(self._as_owner(argv), capture_output=True, text=True, cwd=self.root)
        if result.returncode != 0:
            raise RuntimeError(f"{what} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}\n"
                               f"{self.log_tail()}")

    def init(self) -> None:
        """Create the cluster unless the folder already holds one."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        if self.owner is not None:
            for path in (self.root, self.socket_dir, *([self.data_dir] if self.data_dir.exists() else [])):
                os.chown(path, self.owner.pw_uid, self.owner.pw_gid)
            if subprocess.run(self._as_owner(["test", "-w", str(self.root)])).returncode != 0:
                raise RuntimeError(f"the {self.owner.pw_name!r} account, which runs PostgreSQL for root, cannot "
                                   f"write {self.root}: choose a folder whose parents it can enter (under /tmp)")
        if (self.data_dir / "PG_VERSION").exists():
            return
        self._run([_binary("initdb"), "-D", str(self.data_dir), "-U", self.user, "--auth=trust",
                   "--encoding=UTF8", "--locale=C", "--no-sync"], "initdb")

    def server_options(self) -> list[str]:
        options = {**SERVER_SETTINGS, "port": str(self.port), "unix_socket_directories": str(self.socket_dir)}
        return [arg for name, value in options.items() for arg in ("-c", f"{name}={value}")]

    def start(self) -> str:
        """Initialise if needed, start in the background, create the database; returns its URL."""
        self.init()
        self._run([_binary("pg_ctl"), "start", "-D", str(self.data_dir), "-l", str(self.log_path), "-w",
                   "-t", str(START_TIMEOUT_S), "-o", " ".join(self.server_options())], "pg_ctl start")
        self.create_database()
        return self.url

    def stop(self) -> None:
        if (self.data_dir / "postmaster.pid").exists():
            self._run([_binary("pg_ctl"), "stop", "-D", str(self.data_dir), "-m", "fast", "-w"], "pg_ctl stop")

    def _dsn(self, database: str) -> str:
        return f"host=127.0.0.1 port={self.port} user={self.user} dbname={database}"

    @property
    def _created_marker(self):
        return self.root / f"{self.database}.created"

    def create_database(self) -> None:
        import psycopg

        with psycopg.connect(self._dsn("postgres"), autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.database,)).fetchone():
                conn.execute(f'CREATE DATABASE "{self.database}"')
        self._created_marker.touch()

    def serve(self) -> None:
        """Become the server, in the foreground (exec: this process's pid is the postmaster's).

        SIGINT stops it fast (what ``make stack`` sends); SIGTERM waits for clients to leave."""
        self.init()
        if not self._created_marker.exists():
            self.start()
            self.stop()
        argv = self._as_owner([_binary("postgres"), "-D", str(self.data_dir), *self.server_options()])
        print(f"PostgreSQL serving {self.url}", flush=True)
        os.execvp(argv[0], argv)


def run_with_server(command: list[str], keep: bool = False) -> int:
    """Run ``command`` with DATABASE_URL on a fresh server; stop and remove the server afterwards."""
    root = Path(tempfile.mkdtemp(prefix="pagoda-postgres-"))  # /tmp: reachable by the 'postgres' account
    server = PostgresServer(root)

    def interrupted(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, interrupted)
    started = time.monotonic()
    try:
        url = server.start()
        print(f"PostgreSQL {url} ready in {time.monotonic() - started:.1f} s (folder {root})", flush=True)
        return subprocess.run(command, env={**os.environ, "DATABASE_URL": url}).returncode
    finally:
        try:
            server.stop()
        finally:
            if not keep:
                shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.stack.postgres", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a command with DATABASE_URL on a throwaway server")
    run.add_argument("--keep", action="store_true", help="keep the server's folder (its log) afterwards")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- the command")
    serve = commands.add_parser("serve", help="the server in the foreground")
    serve.add_argument("--root", required=True, type=Path)
    serve.add_argument("--port", required=True, type=int)
    args = parser.parse_args(argv)
    if args.command == "serve":
        PostgresServer(args.root, args.port).serve()
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        parser.error("run: give the command after --")
    return run_with_server(command, keep=args.keep)


if __name__ == "__main__":
    sys.exit(main())
