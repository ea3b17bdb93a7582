"""Self-hosting (``make run``, and the default of manage.py, asgi.py and wsgi.py): DEBUG off, a
secret key generated on first start and kept outside the repository.

SECRET_KEY from the environment wins; otherwise the key lives in ``<data dir>/secret_key``
(``$PAGODA_DATA_DIR``, else ``~/.local/share/pagoda``), created once with mode 0600 and reused
by every later start, so sessions survive restarts. Served over plain HTTP on a loopback
address, so cookies are not marked Secure; behind TLS use the production settings.
"""

import os

from webapp.config.env import data_dir, secret_key_from_file

from .base import *  # noqa: F403

SECRET_KEY = os.environ.get("SECRET_KEY") or secret_key_from_file(data_dir(os.environ) / "secret_key")
DEBUG = False
