"""ASGI entry point (Daphne): HTTP through Django, WebSockets through Channels.

Generation requests past this process's capacity are refused before Django (webapp/config/gate.py).
Under Daphne, SIGTERM/SIGINT drains running requests before the process exits (webapp/config/shutdown.py).
"""

import atexit
import gc
import os

import django

# Unset: the self-hosting settings (DEBUG off), never the development ones.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.config.settings.serve")

# Django must be set up before anything that imports models (consumers, auth middleware); what
# get_asgi_application() does, with the handler that runs Django's middleware on the event loop
# (webapp/config/middleware.py). /static/ is served by WhiteNoise inside that middleware
# (webapp/config/static_files.py).
django.setup(set_prefix=False)

from webapp.config.middleware import ASGIHandler  # noqa: E402

django_asgi_app = ASGIHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from webapp.chat.routing import websocket_urlpatterns as chat_websocket_urlpatterns  # noqa: E402
from webapp.config.gate import gate_generations  # noqa: E402
from webapp.config.shutdown import count_http_exchanges, drain_on_server_shutdown  # noqa: E402

websocket_urlpatterns: list = [*chat_websocket_urlpatterns]

# The gate in front of Django, named so that tests can read its count.
http_gate = gate_generations(django_asgi_app)

application = ProtocolTypeRouter(
    {
        "http": count_http_exchanges(http_gate),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

drain_on_server_shutdown()

# What is loaded by now lives as long as the process: out of the garbage collector's full scans
# (an engine worker freezes its loaded model the same way: workers/engine_worker.py's freeze_heap).
gc.freeze()
atexit.register(gc.unfreeze)  # collected at exit as before
