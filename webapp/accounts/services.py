"""Single sign-on's writes: ``sso_user_sync`` finds or creates the user of a provider account and
applies the group rules, all in one transaction (a failure anywhere leaves no user, identity or
membership behind), each change audited with the signing-in user as its actor."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction

from webapp.accounts.models import SsoGroupRule, SsoIdentity
from webapp.audit.context import audit_context
from webapp.audit.models import AuditEntry
from webapp.audit.services import audit_record, snapshot
from webapp.orgs.models import Membership

ROLE_RANK = {Membership.Role.MEMBER: 0, Membership.Role.ADMIN: 1, Membership.Role.OWNER: 2}


class SsoRefused(Exception):
    """The provider's answer cannot sign anyone in (a bad claim, no account and no creation)."""


def _text_claim(claims: dict, name: str, *, required: bool = False) -> str:
    value = claims.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise SsoRefused(f"the provider's {name!r} claim is not a non-empty string: {value!r:.80}")
    return value.strip()


def _groups(claims: dict, claim: str) -> set[str]:
    value = claims.get(claim, [])
    if isinstance(value, str):  # some providers send a single group as a string
        value = [value]
    if not isinstance(value, list) or not all(isinstance(g, str) for g in value):
        raise SsoRefused(f"the provider's {claim!r} claim is not a list of group names: {value!r:.80}")
    return set(value)


def _free_username(wanted: str) -> str:
    User = get_user_model()
    base = (wanted or "sso-user")[:140]
    name, n = base, 1
    while User.objects.filter(username__iexact=name).exists():
        n += 1
        name = f"{base}-{n}"
    return name


def _user_create(*, issuer: str, subject: str, username: str, email: str):
    User = get_user_model()
    user = User.objects.create_user(_free_username(username), email=email)  # no usable password
    SsoIdentity.objects.create(user=user, issuer=issuer, subject=subject)
    audit_record(action="sso.user_create", target=user, after=snapshot(user, ("username", "email")),
                 detail=f"first sign-in of {subject} at {issuer}")
    return user


def _memberships_apply(*, user, groups: set[str]) -> None:
    """Teams with rules get the membership their rules give ``groups`` (highest role), or none."""
    wanted: dict[int, str] = {}
    ruled_teams = set()
    for rule in SsoGroupRule.objects.all():
        ruled_teams.add(rule.team_id)
        if rule.group in groups and ROLE_RANK[rule.role] >= ROLE_RANK.get(wanted.get(rule.team_id), -1):
            wanted[rule.team_id] = rule.role
    current = {m.team_id: m for m in Membership.objects.filter(user=user, team_id__in=ruled_teams)
               .select_related("team__organisation")}
    for team_id in ruled_teams:
        membership, role = current.get(team_id), wanted.get(team_id)
        if (membership.role if membership is not None else None) == role:
            continue
        before = snapshot(membership)
        if role is None:
            audit_record(action="membership.remove", target=membership, before=before,
                         target_repr=str(membership), detail="single sign-on: no group rule matches")
            membership.delete()
            continue
        if membership is None:
            membership = Membership.objects.create(team_id=team_id, user=user, role=role)
        else:
            membership.role = role
            membership.save(update_fields=["role"])
        audit_record(action="membership.set", target=membership, before=before, after=snapshot(membership),
                     detail="single sign-on: group rule")


@transaction.atomic
def sso_user_sync(*, issuer: str, claims: dict, groups_claim: str, username_claim: str,
                  create_users: bool, ip: str | None = None):
    """The user the provider vouches for (``claims``: the userinfo answer, its ``sub`` already
    matched against the id token's), created on first sign-in when ``create_users``; their
    memberships in teams with group rules set from the ``groups_claim`` claim."""
    subject = _text_claim(claims, "sub", required=True)
    email = _text_claim(claims, "email")
    username = _text_claim(claims, username_claim) or email.partition("@")[0]
    groups = _groups(claims, groups_claim)
    identity = SsoIdentity.objects.select_related("user").filter(issuer=issuer, subject=subject).first()
    detail = f"single sign-on from {ip}" if ip else "single sign-on"
    if identity is None and not create_users:
        raise SsoRefused(f"no Pagoda account for {username or subject}, and users are not created on sign-in")
    with audit_context(source=AuditEntry.Source.CONSOLE, actor_label=username or subject, detail=detail):
        user = identity.user if identity is not None else _user_create(
            issuer=issuer, subject=subject, username=username, email=email)
    with audit_context(source=AuditEntry.Source.CONSOLE, actor=user, detail=detail):
        if email and user.email != email:
            user.email = email
            user.save(update_fields=["email"])
        _memberships_apply(user=user, groups=groups)
    return user
