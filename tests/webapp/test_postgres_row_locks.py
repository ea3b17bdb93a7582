"""The registry's ``select_for_update`` on PostgreSQL: concurrent changes to one model serialize.

Every service that numbers, switches or edits a model's versions (webapp.registry.services) first locks
the model's row. Here eight threads, each its own connection, queue behind that lock and are let
go together (tests/postgres.py: run_behind_row_lock). Without the lock they would read the same
next number or both keep a version active, and the database's unique constraints
(registry_version_number_unique, registry_one_active_version_per_model) would fail them.
Skipped on SQLite, whose writers never overlap.
"""

from __future__ import annotations

import pytest

from tests.postgres import run_behind_row_lock
from webapp.registry.models import Model, ModelVersion
from webapp.registry.services import (modelversion_activate, modelversion_create, modelversion_deactivate,
                                      modelversion_update_settings)

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True), pytest.mark.db_engine]

NUM_THREADS = 8
MODEL_TABLE = Model._meta.db_table


@pytest.fixture
def checkpoint(tmp_path):
    """What checkpoint_format takes for a Hugging Face directory (config.json), and a tokenizer
    export (tokenizer.json) so that activation has nothing to export."""
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    return tmp_path


def test_concurrent_registrations_of_one_model_get_distinct_consecutive_numbers(checkpoint):
    model = Model.objects.create(slug="numbered")

    numbers = run_behind_row_lock(MODEL_TABLE, model.pk, NUM_THREADS,
                                  lambda i: modelversion_create(model=model, path=checkpoint).number)
    assert sorted(numbers) == list(range(1, NUM_THREADS + 1))
    assert model.versions.count() == NUM_THREADS


def test_concurrent_activations_and_edits_of_one_model_leave_at_most_one_version_active(checkpoint):
    model = Model.objects.create(slug="switched")
    versions = [ModelVersion.objects.create(model=model, number=n, path=str(checkpoint), format="hf",
                                            status=ModelVersion.Status.INACTIVE, tokenizer_dir=str(checkpoint))
                for n in range(1, 5)]

    def switch(i: int):
        version = ModelVersion.objects.get(pk=versions[i % len(versions)].pk)
        if i == NUM_THREADS - 1:
            return modelversion_deactivate(version=version).status
        if i == NUM_THREADS - 2:
            return modelversion_update_settings(version=version, engine_settings={"max_num_seqs": 4}).engine_settings
        return modelversion_activate(version=version).status

    results = run_behind_row_lock(MODEL_TABLE, model.pk, NUM_THREADS, switch)
    assert results.count(ModelVersion.Status.ACTIVE) == NUM_THREADS - 2, results
    assert results[-2:] == [{"max_num_seqs": 4}, ModelVersion.Status.INACTIVE]
    assert ModelVersion.objects.get(pk=versions[(NUM_THREADS - 2) % 4].pk).engine_settings == {"max_num_seqs": 4}
    active = list(model.versions.filter(status=ModelVersion.Status.ACTIVE))
    assert len(active) <= 1  # the deactivation may have come last and switched the model off
    winner = max((v for v in model.versions.all() if v.activated_at), key=lambda v: v.activated_at)
    assert not active or active == [winner]
