"""WSGI entry point, for tools that want one; Pagoda itself is served over ASGI by Daphne."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.config.settings.serve")

application = get_wsgi_application()
