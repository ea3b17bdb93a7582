"""Who may open the console: staff only.

Django's ``staff_member_required`` sends everyone it refuses to the admin's own login page, even
a logged-in member who is simply not staff (who then sees that login form again, with no reason
given). The console instead sends an anonymous visitor to the site's login (settings.LOGIN_URL,
coming back through ``?next=``) and answers a logged-in non-staff user with a plain 403.
"""

from __future__ import annotations

from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.http import HttpResponseForbidden

STAFF_ONLY = ("<!doctype html><title>Staff only · Pagoda</title>"
              "<h1>Staff only</h1><p>The Pagoda console is for staff members. "
              "Your account is not one; ask an administrator if you need access.</p>")


def staff_required(view):
    """Let active staff through; anonymous -> LOGIN_URL?next=<this page>; others -> 403."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        user = request.user
        if not user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not (user.is_active and user.is_staff):
            return HttpResponseForbidden(STAFF_ONLY)
        return view(request, *args, **kwargs)

    return wrapper
