"""python manage.py ensure_admin — the first login: create `admin` with a random password when no superuser exists.

Prints the password once (it is stored hashed and never shown again); prints nothing secret when a
superuser already exists. `make run` calls it.
"""

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the superuser 'admin' with a random password if there is no superuser yet."

    def handle(self, *args, **options):
        users = get_user_model()
        if users.objects.filter(is_superuser=True).exists():
            self.stdout.write("A superuser exists; log in with it (reset a password with: manage.py changepassword NAME).")
            return
        username = "admin"
        if users.objects.filter(username=username).exists():
            username = f"admin-{secrets.token_hex(3)}"
        password = secrets.token_urlsafe(12)
        users.objects.create_superuser(username=username, email="", password=password)
        self.stdout.write(f"Created the superuser {username!r}; log in with password: {password}")
        self.stdout.write("(shown only once; change it with: manage.py changepassword " + username + ")")
