"""``make stack``: Pagoda's distributed topology on this machine, from the virtualenv.

    python -m deploy.stack.launch [--dir DIR] [--web-ports 8001,8002] [--model smollm2] ...

What docker-compose.yml runs in containers, as local processes under honcho
(deploy/stack/Procfile): a throwaway PostgreSQL (its cluster in DIR/postgres, kept between runs;
delete DIR for a fresh one), Redis (nothing persisted), two Daphne processes on two loopback
ports, two engine workers of one model, a Celery worker and Celery beat.

Before honcho starts, the database is bootstrapped on a briefly started PostgreSQL, with
docker-compose's own one-shot script (deploy/bootstrap.sh: migrate, register the bundled SmolLM2,
create the admin: PAGODA_ADMIN_USER / PAGODA_ADMIN_PASSWORD, else a random password printed once),
then any ``--also`` management commands (``--also "register_model tiny /path/to/model"``). With
``--no-bundled-model`` the bundled model is left out (migrate and ``ensure_admin`` only): for a
stack serving only models registered with ``--also``.

The processes share DIR/data (PAGODA_DATA_DIR: one generated secret key for both web processes)
and the repository's media/ folder (tokenizer exports, uploads). Ctrl-C stops everything.
Variables read: every one the settings read (DJANGO_SETTINGS_MODULE, SECRET_KEY...) passes
through; DATABASE_URL, REDIS_URL and PAGODA_DATA_DIR are set here.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from deploy.stack.postgres import PostgresServer, find_binary

REPO_ROOT = Path(__file__).resolve().parents[2]
PROCFILE = Path(__file__).resolve().with_name("Procfile")
REDIS_SERVER = "/usr/bin/redis-server"
# Under honcho, whose patience after Ctrl-C is 5 s before it kills: drains shorter than that.
DEFAULT_DRAIN_TIMEOUT_S = "4"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m deploy.stack.launch", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "pagoda-stack",
                        help="the stack's folder: PostgreSQL's cluster, pid files, the secret key")
    parser.add_argument("--pg-port", type=int, default=5433)
    parser.add_argument("--redis-port", type=int, default=6380)
    parser.add_argument("--web-ports", default="8001,8002", help="the two Daphne processes' loopback ports")
    parser.add_argument("--model", default="smollm2", help="the model slug both engine workers serve")
    parser.add_argument("--also", action="append", default=[], metavar="COMMAND",
                        help="a manage.py command (with its arguments) run after the bootstrap; repeatable")
    parser.add_argument("--no-bundled-model", action="store_true",
                        help="migrate and ensure_admin only, instead of deploy/bootstrap.sh")
    args = parser.parse_args(argv)
    ports = args.web_ports.split(",")
    if len(ports) != 2 or not all(p.strip().isdigit() for p in ports):
        parser.error(f"--web-ports: two port numbers separated by a comma, got {args.web_ports!r}")
    args.web_ports = [p.strip() for p in ports]
    return args


def stack_environment(args: argparse.Namespace, server: PostgresServer) -> dict[str, str]:
    root = args.dir.resolve()
    env = dict(os.environ)
    env.update({
        "DATABASE_URL": server.url,
        "REDIS_URL": f"redis://127.0.0.1:{args.redis_port}/0",
        "PAGODA_DATA_DIR": env.get("PAGODA_DATA_DIR") or str(root / "data"),
        "PAGODA_DRAIN_TIMEOUT": env.get("PAGODA_DRAIN_TIMEOUT") or DEFAULT_DRAIN_TIMEOUT_S,
        "PAGODA_PYTHON": sys.executable,
        "PAGODA_STACK_DIR": str(root),
        "PAGODA_STACK_PG_PORT": str(args.pg_port),
        "PAGODA_STACK_REDIS_PORT": str(args.redis_port),
        "PAGODA_STACK_WEB1_PORT": args.web_ports[0],
        "PAGODA_STACK_WEB2_PORT": args.web_ports[1],
        "PAGODA_STACK_MODEL": args.model,
        "PYTHONUNBUFFERED": "1",  # honcho shows each line as it is written
    })
    env.pop("PAGODA_EMBEDDED_WORKERS", None)  # the workers are processes of their own here
    return env


def bootstrap(args: argparse.Namespace, server: PostgresServer, env: dict[str, str]) -> None:
    """Migrate, register, create the admin, run the --also commands, on a briefly started server."""
    def run(command: list[str]) -> None:
        print(f"stack: {shlex.join(command)}", flush=True)
        subprocess.run(command, cwd=REPO_ROOT, env=env, check=True)

    manage = [sys.executable, "manage.py"]
    server.start()
    try:
        if args.no_bundled_model:
            run([*manage, "migrate", "--noinput"])
            run([*manage, "ensure_admin"])
        else:
            run(["sh", "deploy/bootstrap.sh"])
        for command in args.also:
            run([*manage, *shlex.split(command)])
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for tool in (REDIS_SERVER, "initdb", "pg_ctl", "postgres"):
        if (shutil.which(tool) if tool == REDIS_SERVER else find_binary(tool)) is None:
            sys.exit(f"stack: {tool} is not installed (Debian: redis-server, postgresql-15)")
    root = args.dir.resolve()
    for folder in ("redis", "run", "data"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    for stale in (root / "run").rglob("*.pid"):  # left by a stack that was killed outright
        stale.unlink()
    server = PostgresServer(root / "postgres", args.pg_port)
    env = stack_environment(args, server)
    env["PYTHON"] = sys.executable  # deploy/bootstrap.sh's interpreter
    try:
        bootstrap(args, server, env)
    except subprocess.CalledProcessError as exc:
        sys.exit(f"stack: the bootstrap failed ({exc.returncode}): {shlex.join(exc.cmd)}")
    web = ", ".join(f"http://127.0.0.1:{port}/" for port in args.web_ports)
    print(f"stack: starting {PROCFILE.relative_to(REPO_ROOT)} in {root}; web on {web}; API {web.split(', ')[0]}v1; "
          f"workers of {args.model!r}; PostgreSQL {server.url}; Redis {env['REDIS_URL']}", flush=True)
    honcho = [sys.executable, "-m", "honcho", "start", "--no-colour", "-f", str(PROCFILE), "-d", str(REPO_ROOT)]
    os.execve(sys.executable, honcho, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
