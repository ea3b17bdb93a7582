"""Shared builders for the organisation tests: an organisation with a team, members, a priced model."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.utils import timezone

from webapp.billing.models import Price
from webapp.billing.money import NANOS
from webapp.orgs.models import Membership, Organisation, Team
from webapp.registry.models import Model, ModelVersion

# Per million tokens: input 2.50, cached input 1.25, output 10.00 (a gpt-4o-like price).
INPUT, CACHED, OUTPUT = Decimal("2.50"), Decimal("1.25"), Decimal("10.00")


def user(name: str, **fields):
    return get_user_model().objects.create_user(name, **fields)


def served_model(slug: str = "tiny") -> Model:
    model = Model.objects.create(slug=slug)
    ModelVersion.objects.create(model=model, number=1, path=f"/m/{slug}.gguf", format="gguf", status="active")
    return model


def price(model: Model, *, currency="USD", input=INPUT, cached=CACHED, output=OUTPUT, ago=timedelta(days=1)) -> Price:
    """A price in force since ``ago`` (written directly: the service refuses dates in the past)."""
    return Price.objects.create(model=model, currency=currency, input_nanos_per_million=int(input * NANOS),
                                cached_input_nanos_per_million=int(cached * NANOS),
                                output_nanos_per_million=int(output * NANOS), effective_from=timezone.now() - ago)


def team(name: str = "ml", organisation: str = "acme", **limits) -> Team:
    org, _ = Organisation.objects.get_or_create(name=organisation)
    return Team.objects.create(organisation=org, name=name, **limits)


def member(team: Team, name: str, role: str = Membership.Role.MEMBER):
    person = get_user_model().objects.filter(username=name).first() or user(name)
    Membership.objects.create(team=team, user=person, role=role)
    return person
