"""Repeated failed logins for one username, or from one address, are refused for a while."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

pytestmark = pytest.mark.django_db

PASSWORD = "right-pw-4821"


@pytest.fixture(autouse=True)
def limits(settings):
    settings.PAGODA_LOGIN_MAX_FAILURES_PER_USER = 3
    settings.PAGODA_LOGIN_MAX_FAILURES_PER_IP = 5
    settings.PAGODA_LOGIN_WINDOW_S = 600
    settings.PAGODA_LOGIN_LOCKOUT_S = 300


@pytest.fixture
def users():
    return [get_user_model().objects.create_user(name, password=PASSWORD, is_staff=True)
            for name in ("alice", "bob", "carol")]


def login(username, password, ip="10.0.0.1", url="/accounts/login/"):
    client = Client(REMOTE_ADDR=ip)
    return client, client.post(url, {"username": username, "password": password})


def test_failures_for_one_username_lock_it_even_against_the_right_password(users):
    for _ in range(3):
        _, response = login("alice", "guess")
        assert response.status_code == 200 and b"Please enter a correct username and password" in response.content

    client, response = login("alice", PASSWORD, ip="10.0.0.2")  # another address changes nothing

    assert response.status_code == 429
    assert b"Too many failed login attempts" in response.content and b"Try again in 5 minute(s)" in response.content
    assert "_auth_user_id" not in client.session
    assert login("ALICE ", PASSWORD)[1].status_code == 429  # the same account however it is typed
    assert login("bob", PASSWORD)[1].status_code == 302  # other accounts are not locked


def test_the_lock_lifts_after_the_lockout(users, monkeypatch):
    import time

    for _ in range(3):
        login("alice", "guess")
    assert login("alice", PASSWORD)[1].status_code == 429

    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now + 301)
    client, response = login("alice", PASSWORD)
    assert response.status_code == 302 and client.session["_auth_user_id"] == str(users[0].pk)


def test_failures_from_one_address_lock_that_address_for_every_username(users):
    for name in ("alice", "bob", "carol", "dave", "erin"):  # at most two failures per username
        login(name, "guess", ip="10.0.0.9")

    assert login("carol", PASSWORD, ip="10.0.0.9")[1].status_code == 429
    assert login("carol", PASSWORD, ip="10.0.0.10")[1].status_code == 302


def test_a_successful_login_forgets_the_usernames_earlier_failures(users):
    for _ in range(2):
        login("alice", "guess")
    assert login("alice", PASSWORD)[1].status_code == 302
    for _ in range(2):
        login("alice", "guess")
    assert login("alice", PASSWORD)[1].status_code == 302


def test_the_admin_login_is_throttled_too(users):
    for _ in range(3):
        login("alice", "guess", url="/admin/login/")

    _, response = login("alice", PASSWORD, url="/admin/login/")
    assert response.status_code == 200 and b"Too many failed login attempts" in response.content
    assert login("alice", PASSWORD)[1].status_code == 429  # one count for both login pages
