"""Single sign-on's records: which provider account is which user, and the staff-set rules that
turn the provider's groups into team memberships (applied at every login: webapp.accounts.services).

A user signed in through the provider is found by (issuer, subject), never by e-mail or username,
so a provider account can never take over a local account that happens to share its name.
"""

from django.conf import settings
from django.db import models

from webapp.orgs.models import Membership, Team


class SsoIdentity(models.Model):
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identity")
    issuer = models.CharField(max_length=300)  # the id token's iss
    subject = models.CharField(max_length=255)  # the id token's sub
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "SSO identities"
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="one_user_per_sso_subject")]

    def __str__(self) -> str:
        return f"{self.user} = {self.subject} at {self.issuer}"


class SsoGroupRule(models.Model):
    """Members of ``group`` (a value of the provider's groups claim) are members of ``team`` with
    ``role``. A team with at least one rule has its memberships kept by the provider: at each login
    through it a user is put in, moved to the highest role of their matching rules, or taken out."""

    group = models.CharField(max_length=200)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="sso_rules")
    role = models.CharField(max_length=8, choices=Membership.Role.choices, default=Membership.Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["group", "team"]
        constraints = [models.UniqueConstraint(fields=["group", "team"], name="one_sso_rule_per_group_and_team")]

    def __str__(self) -> str:
        return f"group {self.group} -> {self.team} ({self.role})"
