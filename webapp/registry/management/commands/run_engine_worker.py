"""python manage.py run_engine_worker --model SLUG — serve the model's active version over Redis.

Distributed mode: reads the version's path and engine settings from the registry, then runs
workers.engine_worker.run_worker in this process until SIGTERM (which drains).
"""

import os
import sys

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from webapp.registry.selectors import modelversion_get_active


class Command(BaseCommand):
    help = "Run an engine worker for a model's active version (needs REDIS_URL)."

    def add_arguments(self, parser):
        parser.add_argument("--model", required=True, help="model slug")
        parser.add_argument("--redis-url", default=None, help="default: REDIS_URL")
        parser.add_argument("--drain-timeout", type=float, default=30.0)

    def handle(self, *args, model, redis_url, drain_timeout, **options):
        redis_url = redis_url or settings.REDIS_URL
        if not redis_url:
            raise CommandError("an engine worker process needs REDIS_URL; in embedded mode the web "
                               "process runs the workers itself")
        version = modelversion_get_active(slug=model)
        if version is None:
            raise CommandError(f"no active version of the model {model!r}")
        # OpenMP threads that spin while waiting starve the web server, Redis and each other on
        # a small host: with 2 cores a worker next to Daphne ran several times slower spinning
        # than sleeping (bench/serve.py). Read once, when torch loads OpenMP, so set it first.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        from workers.engine_worker import run_worker  # loads the engine (torch): only here

        self.stdout.write(f"serving {version} from {version.path}")
        code = run_worker(version.model.slug, version.label, version.path, dict(version.engine_settings),
                          redis_url=redis_url, drain_timeout=drain_timeout)
        sys.exit(code)
