#!/bin/sh
# docker-compose.yml's one-shot `bootstrap` service: everything the stack needs before the web
# server and the workers start. Idempotent: every `docker-compose up` runs it again, harmlessly.
#
#   1. migrate the database;
#   2. register and activate the bundled SmolLM2 as `smollm2` (what `engine-worker` serves);
#   3. the admin: with PAGODA_ADMIN_PASSWORD set, the superuser PAGODA_ADMIN_USER (default admin)
#      with that password, created once (a later run leaves an existing user's password alone);
#      without it, `ensure_admin`: a random password, printed once in this service's log.
set -eu
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"

"$PYTHON" manage.py migrate --noinput
"$PYTHON" manage.py ensure_bundled_model
if [ -n "${PAGODA_ADMIN_PASSWORD:-}" ]; then
    PAGODA_ADMIN_USER="${PAGODA_ADMIN_USER:-admin}" "$PYTHON" manage.py shell -c '
import os
from django.contrib.auth import get_user_model
users, name = get_user_model().objects, os.environ["PAGODA_ADMIN_USER"]
if users.filter(username=name).exists():
    print(f"The user {name!r} exists; its password is left as it is.")
else:
    users.create_superuser(username=name, email=os.environ.get("PAGODA_ADMIN_EMAIL", ""),
                           password=os.environ["PAGODA_ADMIN_PASSWORD"])
    print(f"Created the superuser {name!r} with the password from PAGODA_ADMIN_PASSWORD.")
'
else
    "$PYTHON" manage.py ensure_admin
fi
