import os

from django.apps import AppConfig

EMBEDDED_WORKERS_FLAG = "PAGODA_EMBEDDED_WORKERS"


class RegistryConfig(AppConfig):
    """Models and versions; in embedded mode the server process also starts their workers."""

    name = "webapp.registry"
    label = "registry"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Only the server process sets the flag (`make run`, the e2e server): migrate, shell and
        # the test process must not load models. REDIS_URL set means workers run elsewhere.
        if os.environ.get(EMBEDDED_WORKERS_FLAG) == "1" and not os.environ.get("REDIS_URL"):
            from webapp.registry.embedded import start_embedded_workers_when_ready

            start_embedded_workers_when_ready()
