"""Runs the test provider: ``python -m tests.oidc_provider.serve`` with PAGODA_TEST_OIDC_CONFIG
naming a JSON file of {db, key_pem, issuer, port, users: [{username, password, email, groups}],
client: {client_id, client_secret, redirect_uri}}. Migrates, creates the users (with their groups)
and the confidential client, then serves on 127.0.0.1:port until killed."""

import os
import socketserver
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.oidc_provider.settings"

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.contrib.auth.models import Group, User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402
from oauth2_provider.models import Application  # noqa: E402


class ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):
        print(format % args, flush=True)


def main() -> None:
    config = settings.CONFIG
    call_command("migrate", verbosity=0)
    for spec in config["users"]:
        user = User.objects.create_user(spec["username"], email=spec["email"], password=spec["password"])
        user.groups.set([Group.objects.get_or_create(name=name)[0] for name in spec["groups"]])
    client = config["client"]
    Application.objects.create(
        name="pagoda", client_id=client["client_id"], client_secret=client["client_secret"],
        client_type=Application.CLIENT_CONFIDENTIAL, authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris=client["redirect_uri"], algorithm=Application.RS256_ALGORITHM, skip_authorization=True)
    server = make_server("127.0.0.1", config["port"], get_wsgi_application(), server_class=ThreadingServer,
                         handler_class=QuietHandler)
    print("serving", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
