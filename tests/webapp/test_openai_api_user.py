"""The API's ``user`` parameter: checked like every parameter, kept in the usage record as end_user.

The requests here stop at "no live worker" (none runs in these tests); the end user of generated
requests, streamed or not, is checked end to end in tests/e2e/test_redis_workers.py.
"""

import json

import pytest
from django.contrib.auth import get_user_model

from webapp.keys.services import apikey_create
from webapp.usage.models import UsageRecord

pytestmark = pytest.mark.django_db

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture
def key(workerless_model):
    """A key for the active model "tiny", whose worker is not running."""
    return apikey_create(owner=get_user_model().objects.create_user("alice"), name="all models")[1]


def post(client, url, body, key):
    return client.post(url, data=json.dumps(body), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {key}")


def body_for(url: str, **extra) -> dict:
    prompt = {"messages": HELLO} if url == CHAT else {"prompt": "Hello"}
    return {"model": "tiny", **prompt, **extra}


@pytest.mark.parametrize("url", [CHAT, COMPLETIONS])
@pytest.mark.parametrize(("user", "message"), [
    (42, "must be a string"),
    (["alice"], "must be a string"),
    ({"id": "alice"}, "must be a string"),
    (True, "must be a string"),
    ("u" * 257, "no more than 256 characters"),
])
def test_a_user_that_is_not_a_short_string_is_a_400_naming_user(client, key, url, user, message):
    response = post(client, url, body_for(url, user=user), key)

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_parameter", "user")
    assert message in error["message"] and "'user'" in error["message"]
    record = UsageRecord.objects.get()
    assert (record.error_code, record.end_user) == ("invalid_parameter", "")


@pytest.mark.parametrize("url", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("stream", [False, True])
def test_the_user_is_kept_in_the_usage_record_of_a_request_that_got_no_worker(client, key, url, stream):
    user = "end-user/42 " + "ü" * 200  # kept as sent: not trimmed, any characters, up to 256

    response = post(client, url, body_for(url, user=user, stream=stream), key)

    assert response.status_code == 503
    record = UsageRecord.objects.get()
    assert (record.error_code, record.end_user) == ("no_worker", user)


@pytest.mark.parametrize("user", [None, ""])
def test_no_user_leaves_end_user_blank(client, key, user):
    post(client, CHAT, body_for(CHAT, user=user), key)

    assert UsageRecord.objects.get().end_user == ""


def test_the_user_of_a_request_refused_for_another_reason_is_kept(client, key):
    response = post(client, CHAT, body_for(CHAT, user="alice-7", temperature=9), key)

    assert response.json()["error"]["param"] == "temperature"
    assert UsageRecord.objects.get().end_user == "alice-7"
