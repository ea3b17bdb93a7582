"""Which engine settings a model version may carry, checked before anything is stored.

The engine validates its own EngineConfig again when a worker starts; checking here as well means
a typo is refused at registration instead of surfacing later as a worker that never comes up.
"""

from django.core.exceptions import ValidationError

DTYPES = ("auto", "float32", "float16", "bfloat16")
BLOCK_SIZES = (8, 16, 32, 64, 128)


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _fraction(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1


# setting -> (check, what it must be)
RULES = {
    "max_model_len": (lambda v: v is None or _positive_int(v), "a positive integer or null"),
    "dtype": (lambda v: v in DTYPES, f"one of {', '.join(DTYPES)}"),
    "block_size": (lambda v: v in BLOCK_SIZES and not isinstance(v, bool),
                   f"one of {', '.join(map(str, BLOCK_SIZES))}"),
    "kv_cache_memory": (lambda v: v is None or _positive_int(v), "a positive number of bytes or null"),
    "max_num_seqs": (_positive_int, "a positive integer"),
    "max_num_batched_tokens": (_positive_int, "a positive integer"),
    "num_kv_blocks": (lambda v: v is None or _positive_int(v), "a positive integer or null"),
    "gpu_memory_utilization": (_fraction, "a number in (0, 1]"),
    "enable_prefix_caching": (lambda v: isinstance(v, bool), "true or false"),
    "scheduling_policy": (lambda v: v in ("fcfs", "priority"), "fcfs or priority"),
    "device": (lambda v: isinstance(v, str) and (v in ("auto", "cpu", "cuda") or v.startswith("cuda:")),
               "auto, cpu or cuda[:N]"),
    "enforce_eager": (lambda v: isinstance(v, bool), "true or false"),
}


def validate_engine_settings(settings: object) -> dict:
    """A key-sorted copy of ``settings`` if every key is known and well-typed; ValidationError naming the key.

    Sorted so that equal settings are stored as equal JSON (registration reuses a version whose
    path and settings match).
    """
    if not isinstance(settings, dict):
        raise ValidationError("engine settings must be a JSON object", code="invalid")
    for key, value in settings.items():
        if key not in RULES:
            known = ", ".join(sorted(RULES))
            raise ValidationError(f"unknown engine setting {key!r}; known: {known}", code="unknown_setting",
                                  params={"setting": key})
        check, expected = RULES[key]
        if not check(value):
            raise ValidationError(f"engine setting {key!r} must be {expected}, got {value!r}",
                                  code="invalid_setting", params={"setting": key})
    return dict(sorted(settings.items()))
