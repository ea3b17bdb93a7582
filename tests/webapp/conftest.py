"""Fixtures for the webapp tests: a throwaway MEDIA_ROOT and the bundled model's exported tokenizer."""

import pytest


@pytest.fixture(autouse=True)
def media_root(settings, tmp_path):
    """Tokenizer exports land in a per-test directory, never in the repository's media/."""
    settings.MEDIA_ROOT = tmp_path / "media"
    return settings.MEDIA_ROOT


@pytest.fixture(autouse=True)
def empty_cache():
    """Login throttling counts failures in the cache: one test's wrong passwords never lock another's login."""
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(tmp_path_factory):
    """tokenizer.json + tokenizer_config.json of the bundled GGUF, exported once per session."""
    from engine.cli.tokenizer_export import export_tokenizer

    return export_tokenizer("smollm2", tmp_path_factory.mktemp("smollm2_tokenizer"))


@pytest.fixture(scope="session")
def smollm2_hf_tokenizer():
    """The engine's own (transformers) tokenizer of the bundled model: the reference."""
    from engine.text.tokenizer import load_tokenizer

    return load_tokenizer("smollm2")


@pytest.fixture
def workerless_model(db, smollm2_tokenizer_dir, tmp_path):
    """The active model "tiny" with the bundled tokenizer and no worker: its requests end in no_worker."""
    from webapp.registry.models import Model, ModelVersion

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"")
    model = Model.objects.create(slug="tiny")
    ModelVersion.objects.create(model=model, number=1, path=str(gguf), format="gguf", status="active",
                                tokenizer_dir=str(smollm2_tokenizer_dir))
    return model
