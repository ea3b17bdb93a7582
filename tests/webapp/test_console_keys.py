"""The console's keys page: a created key is shown once and works, revoking stops it, limits
are saved and validated, and only staff get in."""

import re

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from webapp.keys.models import ApiKey
from webapp.keys.selectors import apikey_allows_adapter, apikey_allows_model, apikey_get_usable
from webapp.keys.services import apikey_create, hash_key
from webapp.registry.models import Adapter, Model, ModelVersion

pytestmark = pytest.mark.django_db

KEY_PATTERN = re.compile(r'<code id="raw-key">(pgd-[A-Za-z0-9_-]+)</code>')


@pytest.fixture
def staff_client(client):
    client.force_login(get_user_model().objects.create_user("root", is_staff=True))
    return client


@pytest.fixture
def owner():
    return get_user_model().objects.create_user("ann")


def _served_model(slug: str) -> Model:
    model = Model.objects.create(slug=slug)
    ModelVersion.objects.create(model=model, number=1, path=f"/m/{slug}.gguf", format="gguf", status="active")
    return model


def _create(client, owner, **fields):
    data = {"name": "ci", "owner": owner.pk, "expires_in_days": "", "max_requests_per_minute": "",
            "max_tokens_per_minute": "", "max_concurrent_requests": "", "token_budget": "", **fields}
    return client.post(reverse("console:keys"), data)


def test_create_shows_the_key_once_and_stores_only_its_hash(staff_client, owner):
    tiny = _served_model("tiny")
    _served_model("big")

    response = _create(staff_client, owner, models=[tiny.pk], expires_in_days="7", token_budget="5000",
                       max_requests_per_minute="60")

    assert response.status_code == 200 and response["Cache-Control"].find("no-store") >= 0
    raw_key = KEY_PATTERN.search(response.content.decode()).group(1)
    api_key = ApiKey.objects.get()
    assert api_key.key_hash == hash_key(raw_key) and raw_key.startswith(api_key.prefix)
    assert (api_key.owner, api_key.token_budget, api_key.max_requests_per_minute) == (owner, 5000, 60)
    assert api_key.max_tokens_per_minute is None and api_key.expires_at is not None
    assert list(api_key.models.all()) == [tiny]
    listing = staff_client.get(reverse("console:keys")).content.decode()
    assert api_key.prefix in listing and raw_key not in listing


def test_created_key_authenticates_within_its_scope(staff_client, owner):
    tiny, big = _served_model("tiny"), _served_model("big")
    response = _create(staff_client, owner, models=[tiny.pk])
    raw_key = KEY_PATTERN.search(response.content.decode()).group(1)

    api_key = apikey_get_usable(raw_key=raw_key)

    assert api_key is not None and api_key.owner == owner
    assert apikey_allows_model(api_key=api_key, model=tiny) and not apikey_allows_model(api_key=api_key, model=big)
    assert apikey_get_usable(raw_key=raw_key + "x") is None


def test_only_served_models_can_be_chosen(staff_client, owner):
    unserved = Model.objects.create(slug="unserved")

    response = _create(staff_client, owner, models=[unserved.pk])

    assert response.status_code == 400 and not ApiKey.objects.exists()


def test_revoke_makes_the_key_unusable(staff_client, owner):
    api_key, raw_key = apikey_create(owner=owner, name="old")
    assert apikey_get_usable(raw_key=raw_key) is not None

    response = staff_client.post(reverse("console:key-revoke", args=[api_key.pk]))

    assert response.status_code == 302
    assert apikey_get_usable(raw_key=raw_key) is None
    assert "revoked" in staff_client.get(reverse("console:keys")).content.decode()


def test_revoke_needs_a_post(staff_client, owner):
    api_key, raw_key = apikey_create(owner=owner, name="old")

    assert staff_client.get(reverse("console:key-revoke", args=[api_key.pk])).status_code == 405
    assert apikey_get_usable(raw_key=raw_key) is not None


def test_limit_edits_are_saved_and_emptied_to_unlimited(staff_client, owner):
    api_key, _ = apikey_create(owner=owner, name="k", max_concurrent_requests=2)

    staff_client.post(reverse("console:key-limits", args=[api_key.pk]), {
        "max_requests_per_minute": "30", "max_tokens_per_minute": "9000", "max_concurrent_requests": "",
        "token_budget": "1000000"})

    api_key.refresh_from_db()
    assert (api_key.max_requests_per_minute, api_key.max_tokens_per_minute, api_key.max_concurrent_requests,
            api_key.token_budget) == (30, 9000, None, 1000000)


@pytest.mark.parametrize("value", ["-5", "0", "many"])
def test_invalid_limit_is_refused_and_nothing_changes(staff_client, owner, value):
    api_key, _ = apikey_create(owner=owner, name="k", max_requests_per_minute=10, token_budget=50)

    response = staff_client.post(reverse("console:key-limits", args=[api_key.pk]), {
        "max_requests_per_minute": value, "token_budget": "99"}, follow=True)

    api_key.refresh_from_db()
    assert (api_key.max_requests_per_minute, api_key.token_budget) == (10, 50)
    assert "not changed" in response.content.decode()


def test_create_refuses_a_negative_limit(staff_client, owner):
    response = _create(staff_client, owner, max_tokens_per_minute="-1")

    assert response.status_code == 400 and not ApiKey.objects.exists()
    assert not KEY_PATTERN.search(response.content.decode())


@pytest.mark.parametrize("method, name, args", [
    ("get", "console:keys", []), ("post", "console:keys", []),
    ("post", "console:key-revoke", ["KEY"]), ("post", "console:key-limits", ["KEY"])])
def test_anonymous_go_to_login_and_non_staff_are_refused(client, owner, method, name, args):
    api_key, raw_key = apikey_create(owner=owner, name="k")
    url = reverse(name, args=[api_key.pk if a == "KEY" else a for a in args])
    data = {"max_requests_per_minute": "1", "name": "x", "owner": owner.pk}

    anonymous = getattr(client, method)(url, data)
    client.force_login(owner)
    not_staff = getattr(client, method)(url, data)

    assert anonymous.status_code == 302 and anonymous["Location"].startswith(f"{reverse('chat:login')}?next={url}")
    assert not_staff.status_code == 403 and b"Staff only" in not_staff.content
    api_key.refresh_from_db()
    assert not api_key.is_revoked and api_key.max_requests_per_minute is None
    assert ApiKey.objects.count() == 1 and apikey_get_usable(raw_key=raw_key) is not None


def test_the_right_to_set_priority_is_off_by_default_and_toggled_with_the_limits(staff_client, owner):
    _create(staff_client, owner)
    api_key = ApiKey.objects.get()
    assert not api_key.can_set_priority

    staff_client.post(reverse("console:key-limits", args=[api_key.pk]), {"can_set_priority": "on"})
    api_key.refresh_from_db()
    assert api_key.can_set_priority
    staff_client.post(reverse("console:key-limits", args=[api_key.pk]), {})  # an unticked box
    api_key.refresh_from_db()
    assert not api_key.can_set_priority


def test_the_fair_share_weight_is_1_by_default_and_staff_can_change_it_within_its_range(staff_client, owner):
    _create(staff_client, owner, fair_share_weight="")
    api_key = ApiKey.objects.get()
    assert api_key.fair_share_weight == 1.0
    url = reverse("console:key-limits", args=[api_key.pk])

    staff_client.post(url, {"fair_share_weight": "4"})
    api_key.refresh_from_db()
    assert api_key.fair_share_weight == 4.0
    for refused in ("0", "-1", "1000", "nan", "many"):
        response = staff_client.post(url, {"fair_share_weight": refused}, follow=True)
        assert "not changed" in response.content.decode(), refused
        api_key.refresh_from_db()
        assert api_key.fair_share_weight == 4.0
    assert 'name="fair_share_weight" value="4"' in staff_client.get(reverse("console:keys")).content.decode()


def test_the_services_refuse_a_weight_out_of_range(owner):
    from django.core.exceptions import ValidationError

    from webapp.keys.services import apikey_set_limits, chatlimits_get_or_create, chatlimits_update

    with pytest.raises(ValidationError):
        apikey_create(owner=owner, name="k", fair_share_weight=0.01)
    api_key, _ = apikey_create(owner=owner, name="k", fair_share_weight=0.5)
    with pytest.raises(ValidationError):
        apikey_set_limits(api_key=api_key, fair_share_weight=101)
    with pytest.raises(ValidationError):
        chatlimits_update(limits=chatlimits_get_or_create(user=owner), fair_share_weight=True)
    api_key.refresh_from_db()
    assert api_key.fair_share_weight == 0.5


def test_chat_limits_page_shows_the_defaults_and_saves_limits_and_models(staff_client, owner):
    from webapp.keys.models import CHAT_DEFAULT_MAX_SOCKETS, ChatLimits

    tiny = _served_model("tiny")
    page = staff_client.get(reverse("console:chat-limits"))
    assert page.status_code == 200 and "ann" in page.content.decode()
    assert ChatLimits.objects.get(user=owner).max_sockets == CHAT_DEFAULT_MAX_SOCKETS

    staff_client.post(reverse("console:chat-limits-save", args=[owner.pk]), {
        "max_requests_per_minute": "5", "max_tokens_per_minute": "", "max_concurrent_requests": "1",
        "token_budget": "1000", "max_sockets": "2", "max_message_chars": "500", "models": [tiny.pk],
        "fair_share_weight": "0.5"})
    limits = ChatLimits.objects.get(user=owner)

    assert (limits.max_requests_per_minute, limits.max_tokens_per_minute, limits.max_concurrent_requests,
            limits.token_budget, limits.max_sockets, limits.max_message_chars) == (5, None, 1, 1000, 2, 500)
    assert limits.fair_share_weight == 0.5
    assert list(limits.models.all()) == [tiny]


def test_chat_limits_refuse_an_unbounded_socket_count_and_need_staff(staff_client, client, owner):
    from webapp.keys.models import ChatLimits

    response = staff_client.post(reverse("console:chat-limits-save", args=[owner.pk]), {
        "max_sockets": "", "max_message_chars": "500"}, follow=True)
    assert "not changed" in response.content.decode()
    assert ChatLimits.objects.get(user=owner).max_sockets != 0
    client.force_login(owner)
    assert client.get(reverse("console:chat-limits")).status_code == 403


def test_a_key_scoped_to_an_adapter_alone_may_call_it_and_not_its_base(staff_client, owner):
    tiny = _served_model("tiny")
    terse = Adapter.objects.create(base=tiny, name="terse", path="/a/terse", rank=4, target_modules=["q_proj"])
    response = _create(staff_client, owner, adapters=[terse.pk])
    api_key = apikey_get_usable(raw_key=KEY_PATTERN.search(response.content.decode()).group(1))

    assert list(api_key.adapters.all()) == [terse] and not api_key.models.exists()
    assert apikey_allows_adapter(api_key=api_key, adapter=terse)
    assert not apikey_allows_model(api_key=api_key, model=tiny)
    assert "tiny:terse" in staff_client.get(reverse("console:keys")).content.decode()
