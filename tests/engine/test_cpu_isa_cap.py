"""PAGODA_MAX_CPU_ISA: the engine sees (and builds its kernels for) only the part of the CPU it allows."""

import pytest

from engine.kernels.cpu import cpu_info
from engine.kernels.cpu import build


@pytest.fixture
def cap(monkeypatch):
    def set_cap(value: str | None):
        if value is None:
            monkeypatch.delenv("PAGODA_MAX_CPU_ISA", raising=False)
        else:
            monkeypatch.setenv("PAGODA_MAX_CPU_ISA", value)
        cpu_info.cpu_flags.cache_clear()
    yield set_cap
    monkeypatch.delenv("PAGODA_MAX_CPU_ISA", raising=False)
    cpu_info.cpu_flags.cache_clear()


def test_the_avx2_cap_hides_avx512_vnni_and_amx_and_turns_fast_bf16_off(cap):
    cap(None)
    whole = cpu_info.cpu_flags()
    cap("avx2")
    capped = cpu_info.cpu_flags()
    assert capped <= whole
    assert not any(f.startswith(("avx512", "amx", "avx_vnni")) for f in capped)
    assert ("avx2" in capped) == ("avx2" in whole)
    assert not cpu_info.has_fast_bf16()
    assert build.default_arch() == build.CAPPED["avx2"]
    assert "capped at avx2" in cpu_info.describe()


def test_the_avx512_cap_hides_only_amx(cap):
    cap(None)
    whole = cpu_info.cpu_flags()
    cap("avx512")
    assert cpu_info.cpu_flags() == {f for f in whole if not f.startswith("amx")}
    assert cpu_info.torch_cap_environment("avx512")["PAGODA_MAX_CPU_ISA"] == "avx512"


def test_no_cap_or_native_is_the_whole_cpu(cap):
    cap("native")
    assert cpu_info.isa_cap() is None
    assert build.default_arch() == build.NATIVE
    assert cpu_info.torch_cap_environment(None) == {}


def test_an_unknown_cap_is_refused_by_name(cap):
    cap("avx9000")
    with pytest.raises(ValueError, match="PAGODA_MAX_CPU_ISA='avx9000'"):
        cpu_info.isa_cap()
