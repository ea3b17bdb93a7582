"""Organisations, teams and members.

A team belongs to an organisation; a user is a member of a team with a role. A team's allowed
models and limits bound every key of the team (webapp.keys.enforcement takes the team's limits
beside the key's); its money budgets (webapp.billing) bound its keys' spend.

Deleting: an organisation with teams cannot be deleted (PROTECT); a team's usage records and
audit entries keep its name when it goes (their links are SET_NULL or plain copies), and its keys
are revoked first (webapp.orgs.services.team_delete; a key's team link is PROTECT).
"""

import uuid

from django.conf import settings
from django.db import models as m  # `m`: Team has a field called `models`

from webapp.registry.models import Model


class Organisation(m.Model):
    name = m.CharField(max_length=200, unique=True)
    created_at = m.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Team(m.Model):
    organisation = m.ForeignKey(Organisation, on_delete=m.PROTECT, related_name="teams")
    name = m.CharField(max_length=200)
    counter_id = m.UUIDField(default=uuid.uuid4, unique=True, editable=False)  # names its rate counters
    # Models the team's keys may call; none at all means every model (each key may narrow it).
    models = m.ManyToManyField(Model, blank=True, related_name="teams")
    # Bounds over all of the team's keys together (null: unlimited), as a key's own.
    max_requests_per_minute = m.PositiveIntegerField(null=True, blank=True)
    max_tokens_per_minute = m.PositiveIntegerField(null=True, blank=True)
    max_concurrent_requests = m.PositiveIntegerField(null=True, blank=True)
    created_at = m.DateTimeField(auto_now_add=True)

    # A team has no token budget (its budgets are in money); webapp.keys.enforcement reads this.
    token_budget = None

    class Meta:
        ordering = ["organisation__name", "name"]
        constraints = [m.UniqueConstraint(fields=["organisation", "name"], name="team_name_unique_in_org")]

    def __str__(self) -> str:
        return f"{self.organisation.name} / {self.name}"

    @property
    def counter_name(self) -> str:
        return f"team:{self.counter_id.hex}"


class Membership(m.Model):
    class Role(m.TextChoices):
        OWNER = "owner"  # everything in the team, roles included
        ADMIN = "admin"  # the team's members (as members) and every key of the team
        MEMBER = "member"  # their own keys of the team, the team's usage

    team = m.ForeignKey(Team, on_delete=m.CASCADE, related_name="memberships")
    user = m.ForeignKey(settings.AUTH_USER_MODEL, on_delete=m.CASCADE, related_name="memberships")
    role = m.CharField(max_length=8, choices=Role.choices, default=Role.MEMBER)
    created_at = m.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team", "user"]
        constraints = [m.UniqueConstraint(fields=["team", "user"], name="one_membership_per_team")]

    def __str__(self) -> str:
        return f"{self.user} ({self.role}) in {self.team}"
