"""Per-model chat defaults: shipped for the bundled model (data migration chat 0006 on a site that
has it, the registry's post_save on one that registers it later), edited by staff in the console,
and handed to the chat page, whose turns start from them."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.test import Client

from webapp.chat.models import ModelChatDefaults
from webapp.chat.shipped_defaults import SHIPPED
from webapp.registry.models import Model

pytestmark = pytest.mark.django_db

ship = importlib.import_module("webapp.chat.migrations.0006_ship_bundled_model_defaults").ship


def staff_client():
    user = get_user_model().objects.create_user("staff", password="pw", is_staff=True)
    client = Client()
    client.force_login(user)
    return client


def test_registering_the_bundled_model_gives_it_the_shipped_defaults():
    model = Model.objects.create(slug="smollm2")
    defaults = ModelChatDefaults.objects.get(model=model)
    assert defaults.sampling["temperature"] == 0.3 == SHIPPED["smollm2"]["sampling"]["temperature"]
    assert defaults.system_prompt == SHIPPED["smollm2"]["system_prompt"]
    assert not ModelChatDefaults.objects.filter(model=Model.objects.create(slug="other")).exists()


def test_the_migration_ships_them_to_a_site_that_has_the_model_and_keeps_what_staff_set():
    bare = Model.objects.create(slug="smollm2")
    ModelChatDefaults.objects.filter(model=bare).delete()  # a site from before the shipped defaults
    ship(apps, None)
    assert ModelChatDefaults.objects.get(model=bare).sampling == SHIPPED["smollm2"]["sampling"]
    ModelChatDefaults.objects.filter(model=bare).update(sampling={"temperature": 0.9}, system_prompt="mine")
    ship(apps, None)
    assert ModelChatDefaults.objects.get(model=bare).sampling == {"temperature": 0.9}


def test_staff_edit_the_defaults_in_the_console_within_the_apis_limits():
    client = staff_client()
    model = Model.objects.create(slug="smollm2")
    page = client.get("/console/chat-defaults/").content.decode()
    assert 'data-model="smollm2"' in page and 'value="0.3"' in page and 'aria-current="page">Chat defaults' in page

    response = client.post(f"/console/chat-defaults/{model.pk}/", {
        "temperature": "0.5", "top_p": "", "top_k": "40", "repetition_penalty": "1.1", "max_tokens": "256",
        "system_prompt": "  Be terse.  "}, follow=True)
    defaults = ModelChatDefaults.objects.get(model=model)
    assert defaults.sampling == {"temperature": 0.5, "top_k": 40, "repetition_penalty": 1.1, "max_tokens": 256}
    assert defaults.system_prompt == "Be terse."
    assert "Chat defaults of smollm2 saved." in response.content.decode()


def test_a_value_outside_the_apis_limits_changes_nothing():
    client = staff_client()
    model = Model.objects.create(slug="smollm2")
    client.post(f"/console/chat-defaults/{model.pk}/", {"temperature": "0.5", "system_prompt": "Be terse."})
    refused = client.post(f"/console/chat-defaults/{model.pk}/", {"temperature": "9", "system_prompt": "x"},
                          follow=True).content.decode()
    assert "not changed: temperature must be" in refused
    assert ModelChatDefaults.objects.get(model=model).system_prompt == "Be terse."


def test_only_staff_reach_the_page():
    user = get_user_model().objects.create_user("member", password="pw")
    client = Client()
    client.force_login(user)
    assert client.get("/console/chat-defaults/").status_code == 403
    assert Client().get("/console/chat-defaults/").status_code == 302
