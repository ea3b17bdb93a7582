"""Starting the test provider (serve.py) from a test: an RSA key made here, a free loopback port,
its own SQLite file; and the PAGODA_OIDC_* environment (or, in-process, the settings) that point a
Pagoda at it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

REPO_ROOT = Path(__file__).resolve().parents[2]
CLIENT_ID, CLIENT_SECRET = "pagoda-test", "pagoda-test-secret-0123456789"


def rsa_pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


@dataclass
class Provider:
    url: str  # the issuer: http://127.0.0.1:port/o
    proc: subprocess.Popen
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=15)


def start_provider(root: Path, *, port: int, redirect_uri: str, users: list[dict], timeout: float = 60) -> Provider:
    """The provider on 127.0.0.1:``port``, once its discovery document answers."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "key.pem").write_text(rsa_pem())
    issuer = f"http://127.0.0.1:{port}/o"
    config = {"db": str(root / "provider.sqlite3"), "key_pem": str(root / "key.pem"), "issuer": issuer,
              "port": port, "users": users,
              "client": {"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET, "redirect_uri": redirect_uri}}
    (root / "config.json").write_text(json.dumps(config))
    log = root / "provider.log"
    env = {**os.environ, "PAGODA_TEST_OIDC_CONFIG": str(root / "config.json"), "PYTHONPATH": str(REPO_ROOT)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tests.oidc_provider.serve"], cwd=REPO_ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    provider = Provider(issuer, proc, log)
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{issuer}/.well-known/openid-configuration", timeout=2).status_code == 200:
                return provider
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            provider.stop() if proc.poll() is None else None
            raise RuntimeError(f"the test OIDC provider did not start:\n{log.read_text(errors='replace')[-4000:]}")
        time.sleep(0.2)


def pagoda_env(issuer: str, **extra: str) -> dict[str, str]:
    """The environment that turns a Pagoda's single sign-on on against the provider at ``issuer``
    (django-oauth-toolkit's endpoint paths)."""
    return {"PAGODA_OIDC_CLIENT_ID": CLIENT_ID, "PAGODA_OIDC_CLIENT_SECRET": CLIENT_SECRET,
            "PAGODA_OIDC_PROVIDER_NAME": "Test IdP", "PAGODA_OIDC_ISSUER": issuer,
            "PAGODA_OIDC_SCOPES": "openid email profile groups",
            "PAGODA_OIDC_AUTHORIZATION_ENDPOINT": f"{issuer}/authorize/",
            "PAGODA_OIDC_TOKEN_ENDPOINT": f"{issuer}/token/",
            "PAGODA_OIDC_USERINFO_ENDPOINT": f"{issuer}/userinfo/",
            "PAGODA_OIDC_JWKS_ENDPOINT": f"{issuer}/.well-known/jwks.json", **extra}


def sso_on(settings, issuer: str, **extra: str) -> None:
    """pytest-django's ``settings`` as webapp/config/settings/base.py makes them from pagoda_env(issuer)."""
    from webapp.config.env import oidc_settings

    for name, value in oidc_settings(pagoda_env(issuer, **extra)).items():
        setattr(settings, name, value)
    settings.AUTHENTICATION_BACKENDS = (["django.contrib.auth.backends.ModelBackend"] if settings.PAGODA_LOCAL_LOGIN
                                        else []) + ["webapp.accounts.sso.SsoBackend"]
