"""API keys: secret shown once, stored hashed, scoped, expiring, revocable."""

import hashlib
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.utils import timezone

from webapp.keys.models import ApiKey
from webapp.keys.selectors import apikey_allows_model, apikey_get_usable
from webapp.keys.services import apikey_create, apikey_mark_used, apikey_revoke
from webapp.registry.models import Model

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner():
    return get_user_model().objects.create_user("alice")


def test_only_the_hash_and_a_visible_prefix_of_a_new_key_are_stored(owner):
    api_key, raw_key = apikey_create(owner=owner, name="ci")

    stored = ApiKey.objects.get(pk=api_key.pk)
    assert raw_key.startswith("pgd-") and len(raw_key) > 40
    assert stored.key_hash == hashlib.sha256(raw_key.encode()).hexdigest()
    assert raw_key.startswith(stored.prefix) and len(stored.prefix) == 12
    assert raw_key not in {str(v) for v in ApiKey.objects.values_list(flat=True)}
    assert apikey_create(owner=owner, name="ci")[1] != raw_key


def test_a_key_is_found_by_its_secret_and_by_nothing_else(owner):
    api_key, raw_key = apikey_create(owner=owner, name="ci")

    assert apikey_get_usable(raw_key=raw_key) == api_key
    assert apikey_get_usable(raw_key=raw_key[:-1]) is None
    assert apikey_get_usable(raw_key=api_key.key_hash) is None


def test_revoked_and_expired_keys_are_unusable(owner):
    revoked, revoked_raw = apikey_create(owner=owner, name="old")
    apikey_revoke(api_key=revoked)
    expiring, expiring_raw = apikey_create(owner=owner, name="short", expires_at=timezone.now() + timedelta(hours=1))
    ApiKey.objects.filter(pk=expiring.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    assert apikey_get_usable(raw_key=revoked_raw) is None
    assert apikey_get_usable(raw_key=expiring_raw) is None


def test_an_unscoped_key_reaches_every_model_and_a_scoped_one_only_its_own(owner):
    tiny, big = Model.objects.create(slug="tiny"), Model.objects.create(slug="big")
    unscoped, _ = apikey_create(owner=owner, name="all")
    scoped, _ = apikey_create(owner=owner, name="tiny only", models=[tiny])

    assert apikey_allows_model(api_key=unscoped, model=big)
    assert apikey_allows_model(api_key=scoped, model=tiny)
    assert not apikey_allows_model(api_key=scoped, model=big)


def test_last_used_is_written_at_most_once_a_minute(owner):
    api_key, _ = apikey_create(owner=owner, name="ci")
    t0 = timezone.now()

    apikey_mark_used(api_key=api_key, now=t0)
    apikey_mark_used(api_key=api_key, now=t0 + timedelta(seconds=30))
    assert ApiKey.objects.get(pk=api_key.pk).last_used_at == t0
    apikey_mark_used(api_key=api_key, now=t0 + timedelta(seconds=61))
    assert ApiKey.objects.get(pk=api_key.pk).last_used_at == t0 + timedelta(seconds=61)


def test_create_api_key_command_prints_a_working_key_alone_on_its_last_line(owner, capsys):
    Model.objects.create(slug="tiny")

    call_command("create_api_key", "--name", "script", "--models", "tiny", "--user", "alice")

    raw_key = capsys.readouterr().out.strip().splitlines()[-1]
    api_key = apikey_get_usable(raw_key=raw_key)
    assert api_key.owner == owner and api_key.name == "script"
    assert [m.slug for m in api_key.models.all()] == ["tiny"]


def test_create_api_key_without_user_belongs_to_a_service_user_without_password(capsys):
    call_command("create_api_key", "--name", "default")

    api_key = apikey_get_usable(raw_key=capsys.readouterr().out.strip().splitlines()[-1])
    assert api_key.owner.username == "pagoda" and not api_key.owner.has_usable_password()


@pytest.mark.parametrize(("args", "message"), [
    (["--models", "nope"], "unknown model"),
    (["--user", "bob"], "no user named 'bob'"),
])
def test_create_api_key_refuses_unknown_models_and_users(owner, args, message):
    with pytest.raises(CommandError, match=message):
        call_command("create_api_key", "--name", "x", *args)
    assert not ApiKey.objects.exists()
