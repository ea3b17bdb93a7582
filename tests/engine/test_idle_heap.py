"""Heap a burst of requests freed goes back to the system once the engine runs out of requests."""

import ctypes
import sys

import pytest

import engine.llm_engine as llm_engine_module
from engine.config import EngineConfig
from engine.memory.host_memory import release_idle_heap
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")


def _anonymous_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("RssAnon:"))


@linux_only
def test_freed_heap_chunks_stop_being_resident_after_release_idle_heap():
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    chunks = [libc.malloc(64 << 10) for _ in range(1600)]  # 100 MiB of heap, below mmap's size
    for chunk in chunks:
        ctypes.memset(chunk, 1, 64 << 10)
    pin = libc.malloc(64)  # keeps the heap's top in use, so free() alone cannot shrink it
    for chunk in chunks[:-1]:
        libc.free(chunk)
    before = _anonymous_kib()
    assert release_idle_heap()
    assert _anonymous_kib() < before - 80 * 1024
    libc.free(chunks[-1])
    libc.free(pin)


@pytest.mark.slow
def test_engine_releases_the_heap_once_when_its_last_request_finishes(tiny_llama_dir, monkeypatch):
    calls = []

    def counting_release():
        calls.append(engine.has_unfinished_requests())
        return release_idle_heap()

    monkeypatch.setattr(llm_engine_module, "release_idle_heap", counting_release)
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_kv_blocks=64, max_model_len=256))
    engine.add_request("short", [1, 2, 3], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    engine.add_request("long", [4, 5, 6, 7], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    finished = []
    while engine.has_unfinished_requests():
        finished += [out.request_id for out in engine.step() if out.finished]
        assert calls == ([False] if not engine.has_unfinished_requests() else [])
    assert finished == ["short", "long"] and calls == [False]
