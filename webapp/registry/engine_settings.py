"""Which engine settings a model version may carry, checked before anything is stored.

The schema is the engine's own (``engine.config.SETTINGS``, torch-free); the engine checks it
again when a worker starts. Checking here as well means a typo is refused at registration
instead of surfacing later as a worker that never comes up.
"""

from django.core.exceptions import ValidationError

from workers.schema import SETTINGS_BY_NAME, InvalidParameterError, ModelLoadError, check_settings, resolve_model_path


def validate_engine_settings(settings: object) -> dict:
    """A key-sorted copy of ``settings`` if every key is known and well-typed; ValidationError naming the key.

    Sorted so that equal settings are stored as equal JSON (registration reuses a version whose
    path and settings match).
    """
    if not isinstance(settings, dict):
        raise ValidationError("engine settings must be a JSON object", code="invalid")
    try:
        checked = check_settings(settings)
    except InvalidParameterError as exc:
        key = exc.param
        if key not in SETTINGS_BY_NAME:
            known = ", ".join(sorted(SETTINGS_BY_NAME))
            raise ValidationError(f"unknown engine setting {key!r}; known: {known}", code="unknown_setting",
                                  params={"setting": key}) from exc
        raise ValidationError(f"engine setting {key!r} {exc.message}", code="invalid_setting",
                              params={"setting": key}) from exc
    if checked.get("speculative_model"):  # a draft model the workers could not find would keep them from starting
        try:
            resolve_model_path(checked["speculative_model"])
        except ModelLoadError as exc:
            raise ValidationError(f"engine setting 'speculative_model': {exc}", code="invalid_setting",
                                  params={"setting": "speculative_model"}) from exc
    return checked
