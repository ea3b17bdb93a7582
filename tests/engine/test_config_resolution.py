"""What settings mean once the device and the activation dtype are known, and the settings
refused there (engine/config.py's resolve_* / check_* functions), without a model or a GPU."""

from __future__ import annotations

import pytest

from engine.config import check_kv_cache_dtype, resolve_quantization, resolve_use_triton
from engine.errors import InvalidParameterError


def _check(setting, device_type="cuda", activation_dtype="bfloat16", use_triton=True, capability=(9, 0)):
    check_kv_cache_dtype(setting, device_type=device_type, activation_dtype=activation_dtype,
                         use_triton=use_triton, compute_capability=lambda: capability)


def test_fp8_kv_cache_is_refused_on_a_cpu_and_before_ada_in_the_triton_kernels():
    with pytest.raises(InvalidParameterError, match="fp8_e4m3 needs a CUDA device") as err:
        _check("fp8_e4m3", device_type="cpu", use_triton=False)
    assert err.value.param == "kv_cache_dtype"
    with pytest.raises(InvalidParameterError, match="compute capability 8.9 or later"):
        _check("fp8_e4m3", capability=(8, 0))
    _check("fp8_e4m3", capability=(8, 9))
    _check("fp8_e4m3", use_triton=False, capability=(8, 0))  # the torch path converts it


def test_a_bf16_kv_cache_under_float32_is_refused_only_in_the_triton_kernels():
    with pytest.raises(InvalidParameterError, match="use dtype bfloat16"):
        _check("bfloat16", activation_dtype="float32")
    _check("bfloat16", device_type="cpu", activation_dtype="float32", use_triton=False)


def test_the_compute_capability_is_asked_only_where_it_decides():
    for setting in ("auto", "int8", "bfloat16"):
        check_kv_cache_dtype(setting, device_type="cuda", activation_dtype="bfloat16", use_triton=True,
                             compute_capability=lambda: pytest.fail("asked"))


def test_unset_use_triton_and_auto_quantization_follow_the_device():
    assert resolve_use_triton(None, "cuda") and not resolve_use_triton(None, "cpu")
    assert resolve_use_triton(True, "cpu") and not resolve_use_triton(False, "cuda")
    assert resolve_quantization("auto", "cpu") == "auto" and resolve_quantization("auto", "cuda") is None
    assert resolve_quantization("int4", "cuda") == "int4"
