"""Giving back the host memory a model load used and no longer needs.

Loading a checkpoint leaves two things behind in the process: the GGUF reader's parsed metadata
(engine/models/gguf_loader.py keeps the last reader: the config and the weights both read it,
~150 MiB for SmolLM2's 49k-token vocabulary) and heap that glibc's malloc keeps after the load's
temporary buffers are freed. ``release_after_load`` drops the first and asks glibc to return the
second (``malloc_trim``; elsewhere it does nothing). ``release_idle_heap`` asks the same once a
burst of requests has ended: glibc keeps the chunks a step's temporaries freed resident inside
its arenas (~70 MiB after 32 streams of the embedded server, bench/memory.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import sys

logger = logging.getLogger(__name__)


@functools.cache
def _libc_malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None


def _malloc_trim() -> bool:
    trim = _libc_malloc_trim()
    return bool(trim(0)) if trim is not None else False


def release_after_load() -> None:
    from engine.models import gguf_loader

    gguf_loader.forget_readers()
    _malloc_trim()


def release_idle_heap() -> bool:
    """Give glibc's freed heap back to the system (True when it returned some); for an engine
    that has just run out of requests, so steps under load do not pay for it."""
    return _malloc_trim()
