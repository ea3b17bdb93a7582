"""The audit log: every change through the console leaves exactly one entry (who, when, from
where, what, before and after), refusals included; /admin/ and management commands are audited
too; and nobody, staff included, can change or delete an entry (the model, its queryset, the
admin and the database itself refuse)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction
from django.urls import reverse

from tests.postgres import django_vendor
from tests.webapp.orgs_fixtures import member, served_model, team, user
from webapp.audit.models import AuditEntry, AuditImmutable
from webapp.billing.models import MoneyBudget
from webapp.keys.models import ApiKey
from webapp.orgs.models import Membership, Organisation, Team
from webapp.registry.models import ModelVersion

pytestmark = [pytest.mark.django_db, pytest.mark.db_engine]


@pytest.fixture
def root():
    return get_user_model().objects.create_user("root", is_staff=True, is_superuser=True)


@pytest.fixture
def staff_client(client, root):
    client.force_login(root)
    return client


def _one_entry(client, url: str, data: dict, action: str, status=(200, 302)) -> AuditEntry:
    before = set(AuditEntry.objects.values_list("pk", flat=True))
    response = client.post(url, data, REMOTE_ADDR="203.0.113.7")
    assert response.status_code in status, (url, response.status_code, response.content[:500])
    new = list(AuditEntry.objects.exclude(pk__in=before))
    assert [e.action for e in new] == [action], (url, [e.action for e in new])
    entry = new[0]
    assert (entry.source, entry.ip) == ("console", "203.0.113.7")
    return entry


def test_every_console_action_leaves_exactly_one_entry(staff_client, root, workerless_model):
    ann = user("ann")
    version = ModelVersion.objects.get(model=workerless_model)
    c = staff_client

    entry = _one_entry(c, reverse("console:organisation-add"), {"name": "acme"}, "organisation.create")
    assert (entry.actor_name, entry.actor_id, entry.after["name"]) == ("root", root.pk, "acme")
    org = Organisation.objects.get()
    _one_entry(c, reverse("console:team-add"), {"organisation": org.pk, "name": "ml", "max_requests_per_minute": "60",
                                                "models": [workerless_model.pk]}, "team.create")
    ml = Team.objects.get()
    entry = _one_entry(c, reverse("console:team-edit", args=[ml.pk]), {"max_requests_per_minute": "30"}, "team.update")
    assert (entry.before["max_requests_per_minute"], entry.after["max_requests_per_minute"]) == (60, 30)
    assert entry.before["models"] == [workerless_model.pk] and entry.after["models"] == []
    _one_entry(c, reverse("console:member-set", args=[ml.pk]), {"user": ann.pk, "role": "admin"}, "membership.set")
    _one_entry(c, reverse("console:keys"), {"name": "ci", "owner": ann.pk, "team": ml.pk}, "apikey.create")
    key = ApiKey.objects.get()
    assert "key_hash" not in AuditEntry.objects.get(action="apikey.create").after  # no secret in the log
    entry = _one_entry(c, reverse("console:key-limits", args=[key.pk]),
                       {"max_requests_per_minute": "10", "fair_share_weight": "2"}, "apikey.limits")
    assert entry.before["max_requests_per_minute"] is None and entry.after["max_requests_per_minute"] == 10
    _one_entry(c, reverse("console:key-revoke", args=[key.pk]), {}, "apikey.revoke")
    _one_entry(c, reverse("console:chat-limits-save", args=[ann.pk]),
               {"max_sockets": "3", "max_message_chars": "100", "max_requests_per_minute": "5"}, "chatlimits.update")
    _one_entry(c, reverse("console:price-add"), {"model": workerless_model.pk, "currency": "EUR",
                                                 "input_per_million": "1.5", "output_per_million": "6"}, "price.set")
    _one_entry(c, reverse("console:budget-set"), {"level": "team", "holder_team": ml.pk, "amount": "100",
                                                  "currency": "EUR", "period": "monthly"}, "budget.set")
    budget = MoneyBudget.objects.get()
    entry = _one_entry(c, reverse("console:budget-set"), {"budget": budget.pk, "amount": "50", "currency": "EUR",
                                                          "period": "weekly"}, "budget.set")
    assert (entry.before["amount_nanos"], entry.after["amount_nanos"]) == (100 * 10**9, 50 * 10**9)
    _one_entry(c, reverse("console:budget-delete", args=[budget.pk]), {}, "budget.delete")
    _one_entry(c, reverse("console:version-deactivate", args=[version.pk]), {}, "modelversion.deactivate")
    entry = _one_entry(c, reverse("console:version-update-settings", args=[version.pk]), {"max_model_len": "512"},
                       "modelversion.settings")
    assert entry.after["engine_settings"]["max_model_len"] == 512
    _one_entry(c, reverse("console:version-activate", args=[version.pk]), {}, "modelversion.activate")
    _one_entry(c, reverse("console:version-deactivate", args=[version.pk]), {}, "modelversion.deactivate")
    _one_entry(c, reverse("console:member-remove", args=[ml.pk, ann.pk]), {}, "membership.remove")
    _one_entry(c, reverse("console:team-delete", args=[ml.pk]), {}, "team.delete")
    _one_entry(c, reverse("console:version-delete", args=[version.pk]), {}, "modelversion.delete")


def test_a_refused_change_leaves_one_entry_and_changes_nothing(staff_client):
    model = served_model()
    response = staff_client.post(reverse("console:price-add"), {"model": model.pk, "currency": "USD",
                                                               "input_per_million": "-1", "output_per_million": "x"})
    assert response.status_code == 400
    assert b"input_per_million" in response.content and b"output_per_million" in response.content
    assert not AuditEntry.objects.exists() and not model.prices.exists()


def test_a_member_acting_outside_their_team_gets_403_and_an_entry(client):
    ml, other = team("ml"), team("search")
    bob = member(ml, "bob", Membership.Role.ADMIN)
    member(other, "carol")
    client.force_login(bob)

    response = client.post(reverse("account:member-set", args=[other.pk]), {"username": "bob", "role": "member"},
                           REMOTE_ADDR="198.51.100.9")
    assert response.status_code == 403
    response = client.post(reverse("account:member-set", args=[ml.pk]), {"username": "carol", "role": "owner"})
    assert response.status_code == 403  # an admin may not make owners
    response = client.get(reverse("account:team", args=[other.pk]))
    assert response.status_code == 403
    denied = list(AuditEntry.objects.order_by("id"))
    assert [e.action for e in denied] == ["denied:membership.set", "denied:membership.set", "denied:team.view"]
    assert all(e.actor_name == "bob" for e in denied) and denied[0].ip == "198.51.100.9"
    assert "manages no members" in denied[0].detail and "may not make carol owner" in denied[1].detail
    assert set(Membership.objects.values_list("user__username", "role")) == {("bob", "admin"), ("carol", "member")}


def test_admin_changes_are_audited_and_entries_cannot_be_changed_or_deleted_there(client, root):
    client.force_login(root)
    org = Organisation.objects.create(name="acme")
    response = client.post(reverse("admin:orgs_organisation_change", args=[org.pk]), {"name": "acme2"},
                           REMOTE_ADDR="192.0.2.1")
    assert response.status_code == 302
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.source, entry.actor_name, entry.ip) == ("admin.change", "admin", "root", "192.0.2.1")
    assert (entry.before["name"], entry.after["name"]) == ("acme", "acme2")

    change = client.post(reverse("admin:audit_auditentry_change", args=[entry.pk]), {"action": "nothing"})
    delete = client.post(reverse("admin:audit_auditentry_delete", args=[entry.pk]), {"post": "yes"})
    bulk = client.post(reverse("admin:audit_auditentry_changelist"),
                       {"action": "delete_selected", "_selected_action": [entry.pk], "post": "yes"})
    assert change.status_code == 403 and delete.status_code == 403
    assert bulk.status_code in (200, 302)
    assert AuditEntry.objects.get().action == "admin.change"


def test_management_commands_are_audited_as_commands():
    served_model("tiny")
    call_command("create_api_key", "--name", "ci", "--models", "tiny")
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.source) == ("apikey.create", "command")
    assert entry.actor_name.startswith("os:") and "create_api_key" in entry.detail


def test_no_one_can_change_or_delete_an_entry_through_the_orm():
    entry = AuditEntry.objects.create(action="x")
    entry.action = "y"
    with pytest.raises(AuditImmutable):
        entry.save()
    with pytest.raises(AuditImmutable):
        entry.delete()
    with pytest.raises(AuditImmutable):
        AuditEntry.objects.filter(pk=entry.pk).update(action="y")
    with pytest.raises(AuditImmutable):
        AuditEntry.objects.all().delete()
    assert AuditEntry.objects.get().action == "x"


def test_the_database_refuses_to_update_an_entry_and_postgresql_to_delete_one():
    entry = AuditEntry.objects.create(action="x")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("UPDATE audit_auditentry SET action = 'y' WHERE id = %s", [entry.pk])
    if django_vendor() == "postgresql":
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("DELETE FROM audit_auditentry WHERE id = %s", [entry.pk])
    assert AuditEntry.objects.get().action == "x"
