"""Giving back the host memory a model load used and no longer needs.

Loading a checkpoint leaves two things behind in the process: the GGUF reader's parsed metadata
(engine/models/gguf_loader.py keeps the last reader: the config and the weights both read it,
~150 MiB for SmolLM2's 49k-token vocabulary) and heap that glibc's malloc keeps after the load's
temporary buffers are freed. ``release_after_load`` drops the first and asks glibc to return the
second (``malloc_trim``; elsewhere it does nothing).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

logger = logging.getLogger(__name__)


def _malloc_trim() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.malloc_trim(0))
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return False


def release_after_load() -> None:
    from engine.models import gguf_loader

    gguf_loader.forget_readers()
    _malloc_trim()
