import os

from django.apps import AppConfig


class RegistryConfig(AppConfig):
    """Models and versions; in embedded mode the server process also starts their workers."""

    name = "webapp.registry"
    label = "registry"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Only the server process sets the flag (`make run`, the e2e server): migrate, shell and
        # the test process must not load models. REDIS_URL set means workers run elsewhere.
        from webapp.config.embedded_jobs import embedded_server

        if embedded_server():
            from webapp.registry.embedded import start_embedded_workers_when_ready

            start_embedded_workers_when_ready()
        elif os.environ.get("PAGODA_WARM_TOKENIZERS") == "1":  # a web server of its own
            from webapp.registry.warm_up import warm_tokenizers_when_ready

            warm_tokenizers_when_ready()
