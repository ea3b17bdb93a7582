"""Amounts of money: Decimal at the edges, whole nano-units (10^-9 of the currency) in the database.

Why integers: SQLite stores a DecimalField as a float (NUMERIC affinity) and sums it in floating
point, so neither a budget's atomic ``spent + reserved + worst <= amount`` nor a console total
would be exact there; whole nano-units are exact on both databases, and a request's cost is
rounded to one once, when it is computed. Prices are kept per million tokens in nano-units too
(up to 9 decimal places per million tokens).
"""

from __future__ import annotations

from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal, InvalidOperation

from django.core.exceptions import ValidationError

from webapp.billing.currencies import ISO_4217

NANOS = 10**9
MAX_NANOS = 2**63 - 1  # a signed 64-bit column


def to_decimal(nanos: int) -> Decimal:
    return Decimal(nanos).scaleb(-9)


def parse_amount(value, *, field: str, allow_zero: bool = True) -> int:
    """``value`` (a Decimal, int or the text of one) as nano-units; a ValidationError naming
    ``field`` when it is not a number, is negative (or zero, unless allowed), has more than nine
    decimal places or is too large."""
    try:
        amount = value if isinstance(value, Decimal) else Decimal(str(value).strip())
    except (InvalidOperation, ValueError):
        raise ValidationError({field: f"{field} must be a number, got {str(value)[:40]!r}"}, code="invalid_amount")
    if isinstance(value, bool) or not amount.is_finite():
        raise ValidationError({field: f"{field} must be a number, got {str(value)[:40]!r}"}, code="invalid_amount")
    if amount < 0 or (amount == 0 and not allow_zero):
        raise ValidationError({field: f"{field} must be {'zero or more' if allow_zero else 'more than zero'}, "
                                      f"got {amount}"}, code="invalid_amount")
    nanos = amount.scaleb(9)
    if nanos != nanos.to_integral_value():
        raise ValidationError({field: f"{field} has more than 9 decimal places"}, code="invalid_amount")
    if nanos > MAX_NANOS:
        raise ValidationError({field: f"{field} is too large"}, code="invalid_amount")
    return int(nanos)


def parse_currency(value, *, field: str = "currency") -> str:
    code = str(value or "").strip().upper()
    if code not in ISO_4217:
        raise ValidationError({field: f"{field} must be an ISO 4217 code such as USD or EUR, got "
                                      f"{str(value)[:20]!r}"}, code="invalid_currency")
    return code


def cost_nanos(tokens: int, nanos_per_million: int, *, worst: bool = False) -> int:
    """What ``tokens`` cost at a price per million tokens: rounded half up to a nano-unit (a
    record's cost), or up (``worst``: a reservation, never below what the request can cost)."""
    exact = Decimal(tokens * nanos_per_million) / Decimal(10**6)
    return int(exact.to_integral_value(rounding=ROUND_CEILING if worst else ROUND_HALF_UP))


def format_money(nanos: int, currency: str) -> str:
    """Two decimals at least, more when the amount has them (a request may cost 0.000045)."""
    amount = to_decimal(nanos).normalize()
    text = f"{amount:f}"
    whole, _, fraction = text.partition(".")
    return f"{whole}.{fraction.ljust(2, '0')} {currency}".strip()


def format_spend(spend: dict[str, int]) -> str:
    """Spend per currency as pages show it: "1.25 USD + 0.40 EUR"; "–" for none."""
    return " + ".join(format_money(nanos, currency) for currency, nanos in sorted(spend.items())) or "–"
