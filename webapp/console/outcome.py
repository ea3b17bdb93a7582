"""Running one change from a console form: its refusal (a ValidationError naming fields) shown as
a flash message and answered 400 by the page, its success as a flash and a redirect."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ValidationError


def describe(error: ValidationError) -> str:
    if hasattr(error, "error_dict"):
        return "; ".join(f"{field}: {' '.join(ValidationError(msgs).messages)}"
                         for field, msgs in error.error_dict.items())
    return " ".join(error.messages)


def run_change(request, change, *, done: str, what: str) -> bool:
    """``change()``; True when it went through (a success flash), False with an error flash."""
    try:
        change()
    except ValidationError as error:
        messages.error(request, f"{what} refused: {describe(error)}")
        return False
    messages.success(request, done)
    return True
