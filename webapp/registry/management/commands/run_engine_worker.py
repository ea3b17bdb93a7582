"""python manage.py run_engine_worker --model SLUG — serve the model's active version over Redis.

Distributed mode: workers.serving.follow_active_version runs in this process until SIGTERM
(which drains). It asks the registry for the model's active version every --poll-interval
seconds; when an activation (or a settings edit) changes it, the new version loads here while
the old one keeps serving, then the old one finishes its running requests and stops. With no
active version the process drains and waits for the next activation.
"""

import os

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections

from webapp.registry.models import Model
from webapp.registry.selectors import modelversion_get_active


class Command(BaseCommand):
    help = "Run an engine worker for a model's active version, following activations (needs REDIS_URL)."

    def add_arguments(self, parser):
        parser.add_argument("--model", required=True, help="model slug")
        parser.add_argument("--redis-url", default=None, help="default: REDIS_URL")
        parser.add_argument("--drain-timeout", type=float, default=None,
                            help="seconds running requests get to finish at a hand-over or shutdown "
                                 "(default: serving.drain_timeout_s, PAGODA_DRAIN_TIMEOUT)")
        parser.add_argument("--poll-interval", type=float, default=2.0,
                            help="seconds between checks of the model's active version")

    def handle(self, *args, model, redis_url, drain_timeout, poll_interval, **options):
        redis_url = redis_url or settings.REDIS_URL
        if not redis_url:
            raise CommandError("an engine worker process needs REDIS_URL; in embedded mode the web "
                               "process runs the workers itself")
        if not Model.objects.filter(slug=model).exists():
            raise CommandError(f"no model {model!r} in the registry")
        # How torch's OpenMP threads wait between parallel regions, read once when torch loads:
        # so set before the import, unless the operator chose. Sleeping at once (PASSIVE) pays a
        # wake-up per region; spinning without bound starves Daphne and Redis on a small host.
        # A bounded spin measured best next to Daphne + redis-server on 2 cores (bench/serve.py,
        # 32 streams, alternated twice in one run: 156/142 tok/s against PASSIVE's 127/104 and
        # a 20k-spin's 93/142).
        if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
            os.environ.update(OMP_WAIT_POLICY="ACTIVE", GOMP_SPINCOUNT="200000")
        from workers.serving import ServeSpec, exit_now, follow_active_version  # loads the engine (torch)

        def active():
            close_old_connections()  # a long-lived process: drop a connection the server closed
            version = modelversion_get_active(slug=model)
            if version is None:
                return None
            return ServeSpec(version.label, version.path, dict(version.engine_settings))

        first = modelversion_get_active(slug=model)
        if first is None:
            self.stdout.write(f"no active version of {model!r} yet; waiting for one")
        else:
            self.stdout.write(f"serving {first} from {first.path}")
        self.stdout.flush()
        code = follow_active_version(model, active, redis_url=redis_url, drain_timeout=drain_timeout,
                                     poll_interval=poll_interval)
        self.stdout.flush()
        exit_now(code)
